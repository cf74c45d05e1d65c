#!/bin/bash
# Runs "$@" while the wakeup tracer's programs run on their own, outside any agent: the
# example `wake_trace` (every task traced) for HOLD seconds (default 3.8) in the background,
# with its flags from WT and WT2 (empty: counting throughout; --paused: attached but paused;
# --cycle=MS: counting MS ms of every second). The command starts 0.6 s after the tracer
# (load, attach). What the programs alone cost a workload, for ab.py; root:
#   scripts/bench/ab.py --variant knobs=scripts/bench/fixed-window.sh \
#     --variant 'cyc5=env WT=--cycle=5 scripts/bench/with-tracer.sh scripts/bench/fixed-window.sh' \
#     -- scripts/bench/nginx-doc.py 1 3
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
(cd "$root" && cargo build --release -q -p gleaner-os --example wake_trace) || exit 2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$root/target/release/examples/wake_trace" "${HOLD:-3.8}" ${WT:-} ${WT2:-} >"$out" 2>&1 &
pid=$!
sleep 0.6
"$@"
rc=$?
wait "$pid" || echo "with-tracer: wake_trace failed: $(tail -2 "$out")" >&2
exit $rc
