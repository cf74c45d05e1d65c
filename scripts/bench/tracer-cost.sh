#!/usr/bin/env bash
# What the wakeup tracer's programs cost a scheduler-heavy load: `perf bench sched pipe`
# (two processes hand a byte back and forth through pipes) with the programs detached,
# attached but paused (the agent between slices), and attached and counting, alternated
# over ROUNDS rounds. Prints usecs/op per round and the medians, and what the programs
# themselves measured (BPF_ENABLE_STATS) per event. Root (eBPF). Needs linux-perf.
#
#   sudo ROUNDS=7 LOOPS=200000 scripts/bench/tracer-cost.sh
set -euo pipefail
ROUNDS=${ROUNDS:-7}
LOOPS=${LOOPS:-200000}
HOLD=${HOLD:-4}
cd "$(dirname "$0")/../.."
command -v perf >/dev/null || { echo "tracer-cost: perf not found (Debian package linux-perf)" >&2; exit 2; }
cargo build --release -q -p gleaner-os --example wake_trace
ex=target/release/examples/wake_trace
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

pipe() { perf bench sched pipe -l "$LOOPS" 2>/dev/null | awk '/usecs\/op/ {print $1}'; }
for r in $(seq 1 "$ROUNDS"); do
    for mode in detached paused counting; do
        case $mode in
            detached) v=$(pipe) ;;
            *)
                flag=""; [ "$mode" = paused ] && flag=--paused
                # Attached for HOLD s: loaded and attached within the first 0.5 s, the
                # pipe run (about 1 s at 200,000 loops) well within the rest.
                "$ex" "$HOLD" $flag >"$out/$mode.$r.txt" &
                pid=$!
                sleep 0.5
                v=$(pipe)
                wait "$pid"
                grep -E "^  total" "$out/$mode.$r.txt" | sed "s/^ */  $mode programs: /" >&2
                ;;
        esac
        echo "$mode $v" | tee -a "$out/all"
    done
done
echo
for mode in detached paused counting; do
    awk -v m="$mode" '$1 == m {print $2}' "$out/all" | sort -g | awk -v m="$mode" '{a[NR]=$1} END {printf "%-9s median %.3f usecs/op [%.3f..%.3f] (%d rounds)\n", m, a[int((NR+1)/2)], a[1], a[NR], NR}'
done
