#!/usr/bin/env bash
# The simulator's oversubscribed scenarios, fig7 and vm-matrix-scale, on four host models:
#   fair, in step   the scenarios as built in (slices of one fixed length keep the pCPUs in step)
#   fair, drifting  `host.slice_jitter_pm = 500` and, as EEVDF has, no wakeup granularity
#   credit          Xen's credit scheduler (`host.scheduler = "credit"`, 30 ms slices)
#   credit, drifting  the same with slices +-10%
# fig7 gains two variants here, the paper's Gleaner split into its halves: retention alone and
# consolidation alone (`guest = "retention"` / `"consolidation"`, `govern = false`).
# docs/sim.md, "A retained vCPU next to a co-runner", "On Xen's credit scheduler" and "Where
# consolidation pays", cites its output.
#   scripts/sim/host-models.sh [GLEANER]      (default: target/release/gleaner)
set -euo pipefail
cd "$(dirname "$0")/../.."
gleaner=${1:-target/release/gleaner}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# host MODEL SCENARIO OUT: the scenario with MODEL's keys added to its [host] table.
host() {
  local keys
  case $1 in
    drifting) keys='slice_jitter_pm = 500\nwakeup_granularity_us = 0.0' ;;
    credit) keys='scheduler = "credit"\nslice_us = 30000.0' ;;
    credit-drifting) keys='scheduler = "credit"\nslice_us = 30000.0\nslice_jitter_pm = 100' ;;
  esac
  sed "s/^pcpus = \(.*\)$/pcpus = \1\n$keys/" "$2" > "$3"
}
# halves SCENARIO OUT: fig7 with the retention-only and consolidation-only variants.
halves() {
  awk '/^\[\[case\]\]/ && !done {
    for (g = 1; g <= 2; g++) {
      name = g == 1 ? "retention" : "consolidation"
      printf "[[variant]]\nname = \"%s\"\nguest = \"%s\"\nhost_halt_poll = false\ngleaner = { govern = false }\n\n", name, name
    }
    done = 1
  } { print }' "$1" > "$2"
}
cal=docs/data/current/vm-matrix/vm1/calibration.json
halves crates/gleaner-sim/scenarios/fig7.toml "$tmp/fig7.toml"
runs=("$tmp/fig7.toml" "scripts/sim/vm-matrix-scale.toml --from-calibration $cal")
for model in drifting credit credit-drifting; do
  host $model "$tmp/fig7.toml" "$tmp/fig7-$model.toml"
  host $model scripts/sim/vm-matrix-scale.toml "$tmp/vm-matrix-scale-$model.toml"
  runs+=("$tmp/fig7-$model.toml" "$tmp/vm-matrix-scale-$model.toml --from-calibration $cal")
done
for run in "${runs[@]}"; do
  echo "== gleaner sim ${run/$tmp\//} --no-timing"
  # shellcheck disable=SC2086
  "$gleaner" sim $run --no-timing | grep -E '^case| app | weighted'
done
