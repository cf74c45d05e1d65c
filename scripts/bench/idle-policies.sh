#!/usr/bin/env bash
# The idle-policy benchmark of issue 18: every workload under every idle policy a tenant can
# pick (stock, the kernel's guest haltpoll at its 200 us default, naive yielders, gleaner with
# no flags), rounds in balanced orders, medians and per-round ratios of RUNS runs; then the
# throughput-bound workloads, a guest without kernel polling (yielders only) and a budget.
# Writes one `gleaner compare --json` document per line of the plan into OUT and prints a
# summary (scripts/bench/summarize.py).
#
#   sudo OUT=bench-out scripts/bench/idle-policies.sh   # RUNS=8, a multiple of the 4 policies: each takes
#                                                       # each place and follows each other equally often
#   sudo ONLY=latency scripts/bench/idle-policies.sh                # one group: latency, throughput, nopoll, budget
#
# Needs root (the haltpoll policy and gleaner turn the idle knobs, put back after each run),
# sockperf, redis-server and redis-benchmark, nginx and wrk, memcached and libmemcached-tools,
# stress-ng and sysbench (Debian packages), and a C compiler (scripts/bench/kv-latency.c).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-8}
OUT=${OUT:-bench-out}
ONLY=${ONLY:-all}
G=${GLEANER:-./target/release/gleaner}
mkdir -p "$OUT"
all="stock,haltpoll,naive,gleaner"

run() { # name policies [gleaner flags...] -- command...
  local name=$1 policies=$2; shift 2
  local flags=()
  while [ "$1" != "--" ]; do flags+=("$1"); shift; done
  shift
  echo "== $name: gleaner compare --runs $RUNS --policies $policies ${flags[*]} -- $*" >&2
  "$G" compare --runs "$RUNS" --policies "$policies" --json "${flags[@]}" -- "$@" > "$OUT/$name.json"
}

if [[ $ONLY == all || $ONLY == latency ]]; then
  run sockperf-pp "$all" -- scripts/bench/sockperf-doc.py pp 3
  run sockperf-ul2000 "$all" -- scripts/bench/sockperf-doc.py ul 3 2000
  run pingpong "$all" -- "$G" bench workload pingpong --duration-ms 3000 --json
  run nginx-c1 "$all" -- scripts/bench/nginx-doc.py 1 3
  run memcached-c1 "$all" -- scripts/bench/memcached-doc.py 1 3
  run redis-c1 "$all" -- scripts/bench/redis-doc.py lat 3
  # 2,000 requests a run at each rate: at 200/s a 3 s run's p99 was its sixth-worst request.
  for rate in 200 2000 20000; do
    ms=$(( rate >= 2000 ? 3000 : 10000 ))
    run "openloop-$rate" "$all" -- "$G" bench workload openloop --rate "$rate" --duration-ms "$ms" --json
  done
fi
if [[ $ONLY == all || $ONLY == throughput ]]; then
  run pipeline "$all" -- "$G" bench workload pipeline --json
  run matmul "$all" -- "$G" bench workload matmul --json
  run stress-ng-cpu2 "$all" -- stress-ng --cpu 2 --cpu-ops 16000 --cpu-method matrixprod --quiet
  run sysbench-threads "$all" -- sysbench threads --threads=8 --time=0 --events=20000 run
  run redis-c50 "$all" -- scripts/bench/redis-doc.py 50 200000
  run nginx-c50 "$all" -- scripts/bench/nginx-doc.py 50 3
  run memcached-c50 "$all" -- scripts/bench/memcached-doc.py 50 3
fi
if [[ $ONLY == all || $ONLY == nopoll ]]; then
  # A guest without kernel polling: the agent leaves the knobs alone and keeps vCPUs with
  # yielding threads only (the machine halts at once with guest_halt_poll_ns=0).
  run nopoll-pipeline stock,gleaner --no-kernel-polling -- "$G" bench workload pipeline --json
  run nopoll-pingpong stock,gleaner --no-kernel-polling -- "$G" bench workload pingpong --duration-ms 3000 --json
  run nopoll-openloop-2000 stock,gleaner --no-kernel-polling -- "$G" bench workload openloop --rate 2000 --duration-ms 3000 --json
  run nopoll-matmul stock,gleaner --no-kernel-polling -- "$G" bench workload matmul --json
fi
if [[ $ONLY == all || $ONLY == budget ]]; then
  run budget-0.25-openloop-2000 stock,gleaner --budget 0.25 -- "$G" bench workload openloop --rate 2000 --duration-ms 3000 --json
fi
python3 scripts/bench/summarize.py "$OUT"
