#!/usr/bin/env bash
# The simulator's oversubscribed scenarios on a host whose pCPUs drift apart, beside the same
# scenarios with slices of one fixed length (the scenarios' default, which keeps the pCPUs in
# step): fig7 and vm-matrix-scale, with `host.slice_jitter_pm = 500` and, as EEVDF has, no
# wakeup granularity. docs/sim.md, "A retained vCPU next to a co-runner", cites its output.
#   scripts/sim/drifting-host.sh [GLEANER]      (default: target/release/gleaner)
set -euo pipefail
cd "$(dirname "$0")/../.."
gleaner=${1:-target/release/gleaner}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
drift() { sed 's/^pcpus = \(.*\)$/pcpus = \1\nslice_jitter_pm = 500\nwakeup_granularity_us = 0.0/' "$1" > "$2"; }
drift crates/gleaner-sim/scenarios/fig7.toml "$tmp/fig7-drifting.toml"
drift scripts/sim/vm-matrix-scale.toml "$tmp/vm-matrix-scale-drifting.toml"
cal=docs/data/current/vm-matrix/vm1/calibration.json
for run in "fig7" "$tmp/fig7-drifting.toml" \
           "scripts/sim/vm-matrix-scale.toml --from-calibration $cal" "$tmp/vm-matrix-scale-drifting.toml --from-calibration $cal"; do
  echo "== gleaner sim ${run/$tmp\//} --no-timing"
  # shellcheck disable=SC2086
  "$gleaner" sim $run --no-timing | grep -E '^case| app | weighted'
done
