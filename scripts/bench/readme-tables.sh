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
git_rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
cpuidle="$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none)/$(cat /sys/devices/system/cpu/cpuidle/current_governor 2>/dev/null || echo none)"
cat > "$OUT/machine.json" <<JSON
{"cpu": "$cpu", "vcpus": $(nproc), "kernel": "$(uname -r)", "cpuidle": "$cpuidle", "git": "$git_rev", "date": "$(date -u +%Y-%m-%dT%H:%MZ)", "rounds": $ROUNDS, "command": "OUT=$OUT ROUNDS=$ROUNDS scripts/bench/front-matrix.sh"}
JSON
if [[ ${ONLY:-all} == all ]]; then
  # The README's first command, as a newcomer runs it (its plot beside it).
  target/release/gleaner compare --plot docs/data/current/first-run.svg > docs/data/current/first-run.txt
fi
OUT=$OUT ROUNDS=$ROUNDS scripts/bench/front-matrix.sh
python3 scripts/bench/readme-tables.py
