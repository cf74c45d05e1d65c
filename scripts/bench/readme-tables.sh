#!/usr/bin/env bash
# Makes README's result documents again under docs/data/current and renders the tables into
# README.md (scripts/bench/readme-tables.py). Every number README quotes from a table comes
# from a document this writes, with the machine it ran on.
#
#   sudo scripts/bench/readme-tables.sh            # the first run, the front matrix (about an hour), then the tables
#   sudo ROUNDS=4 ONLY=short scripts/bench/readme-tables.sh
#
# Needs what scripts/bench/front-matrix.sh needs, and a release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "readme-tables.sh: needs root (the peers turn the kernel's idle knobs)" >&2; exit 2; }
OUT=docs/data/current/front
ROUNDS=${ROUNDS:-6}
mkdir -p "$OUT"
cargo build --release
scripts/bench/machine-json.py "$ROUNDS" "OUT=$OUT ROUNDS=$ROUNDS scripts/bench/front-matrix.sh" > "$OUT/machine.json"
if [[ ${ONLY:-all} == all ]]; then
  # The README's first command, as a newcomer runs it (its plot beside it).
  target/release/gleaner compare --plot docs/data/current/first-run.svg > docs/data/current/first-run.txt
fi
OUT=$OUT ROUNDS=$ROUNDS scripts/bench/front-matrix.sh
python3 scripts/bench/readme-tables.py
