#!/usr/bin/env bash
# The idle-policy matrix as a tenant runs it: every row under every idle policy a tenant could
# pick (stock, haltpoll at its upstream 200 us cap and at 2400 us, poll, naive yielders) and
# `gleaner run` with no flags, each a separate process tree, in rotated rounds
# (scripts/bench/front.py), CPU counted as busy time plus POLL time; writes one JSON per row
# into OUT and says, per row and metric, whether gleaner is on the latency-vs-CPU front.
#
#   sudo OUT=docs/data/current/front ROUNDS=6 scripts/bench/front-matrix.sh
#   sudo ONLY=latency scripts/bench/front-matrix.sh     # one group: latency, short, throughput
#   sudo ROWS=xz-T2,nginx-c4 scripts/bench/front-matrix.sh   # only these rows (by name)
#   sudo CONTROL=1 scripts/bench/front-matrix.sh   # gleaner twice a round: front.py --control
#
# Needs root, sockperf, redis-server and redis-benchmark, nginx and wrk, memcached and
# libmemcached-tools, stress-ng, sysbench, perf (linux-perf), rt-tests (hackbench), xz-utils
# and a C compiler (Debian packages).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-front-out}
ROUNDS=${ROUNDS:-6}
ONLY=${ONLY:-all}
ROWS=${ROWS:-}
export GLEANER=${GLEANER:-$PWD/target/release/gleaner}
G=$GLEANER
mkdir -p "$OUT"
PEERS=${PEERS:-stock,haltpoll,haltpoll:2400us,poll,naive,gleaner}
run() { # name command...
  local name=$1; shift
  [[ -z $ROWS || ,$ROWS, == *,$name,* ]] || return 0
  echo "== $name: $*" >&2
  scripts/bench/front.py --rounds "$ROUNDS" --peers "$PEERS" ${CONTROL:+--control} --json "$OUT/$name.json" -- "$@" | tail -n 14
}
if [[ $ONLY == all || $ONLY == latency ]]; then
  run sockperf-pp scripts/bench/sockperf-doc.py pp 3
  run sockperf-ul2000 scripts/bench/sockperf-doc.py ul 3 2000
  run pingpong "$G" bench workload pingpong --duration-ms 3000 --json
  run nginx-c1 scripts/bench/nginx-doc.py 1 3
  run memcached-c1 scripts/bench/memcached-doc.py 1 3
  run redis-c1 scripts/bench/redis-doc.py lat 3
  run openloop-200 "$G" bench workload openloop --rate 200 --duration-ms 10000 --json
  run openloop-2000 "$G" bench workload openloop --rate 2000 --duration-ms 3000 --json
  run openloop-20000 "$G" bench workload openloop --rate 20000 --duration-ms 3000 --json
fi
if [[ $ONLY == all || $ONLY == short ]]; then
  run pingpong-1s "$G" bench workload pingpong --duration-ms 1000 --json
  run sockperf-pp-1s scripts/bench/sockperf-doc.py pp 1
  run openloop-1000-1s "$G" bench workload openloop --rate 1000 --duration-ms 1000 --json
fi
if [[ $ONLY == all || $ONLY == throughput ]]; then
  [ -f /tmp/front-xz-input ] || head -c 20000000 /dev/urandom | base64 > /tmp/front-xz-input
  run pipeline "$G" bench workload pipeline --json
  run matmul "$G" bench workload matmul --json
  run stress-ng-cpu2 stress-ng --cpu 2 --cpu-ops 6000 --cpu-method matrixprod --quiet
  run sysbench-threads sysbench threads --threads=8 --time=0 --events=10000 run
  run xz-T2 sh -c 'xz -T2 -3 -c /tmp/front-xz-input > /dev/null'
  run redis-c50 scripts/bench/redis-doc.py 50 200000
  run nginx-c50 scripts/bench/nginx-doc.py 50 3
  run memcached-c50 scripts/bench/memcached-doc.py 50 3
  run nginx-c4 scripts/bench/nginx-doc.py 4 3
  run memcached-c4 scripts/bench/memcached-doc.py 4 3
fi
