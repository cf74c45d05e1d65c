#!/usr/bin/env bash
# Programs outside the idle-policy matrix, chosen before their numbers were seen, each under
# every idle policy a tenant could pick and `gleaner run` with no flags, in rotated rounds
# (scripts/bench/front.py): does the loop stay on the latency-vs-CPU front of programs nobody
# tuned it on? Neither client nor server is pinned (as a tenant runs them). Writes one JSON per
# row into OUT.
#
#   sudo OUT=held-out ROUNDS=6 scripts/bench/held-out/held-out.sh
#   sudo ROWS=pg-c1,node-http-c1 scripts/bench/held-out/held-out.sh     # only these rows
#   sudo CONTROL=1 scripts/bench/held-out/held-out.sh     # gleaner twice a round: front.py --control
#   sudo PEERS="gleaner,vs1=$PWD/target/release/gleaner run --vm-share 1 --" ...   # other peers
#
# The programs: a Go net/http server and a Node.js http server under wrk (1 and 8
# connections), PostgreSQL under pgbench -S (1 and 8 clients), a Java SynchronousQueue
# ping-pong of two threads, a Go channel ping-pong of two goroutines, zstd -T2, and make -j2
# of 250 one-line C files. A second set, chosen on another machine the same way: a Python
# asyncio echo server and its client, Go goroutines on one mutex, a Java ForkJoinPool, iperf3
# over loopback, pigz -p 2, a shell loop of curl processes against python3's http.server, and
# stress-ng's sock and futex stressors. Needs root, golang, nodejs, default-jdk, postgresql,
# wrk, zstd, make, a C compiler, iperf3, pigz, curl and stress-ng (Debian packages); builds into
# ~/.cache/gleaner-bench/held-out. Writes OUT/machine.json: the machine, the revision, the
# command.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
OUT=${OUT:-held-out}
ROUNDS=${ROUNDS:-6}
ROWS=${ROWS:-}
export GLEANER=${GLEANER:-$PWD/target/release/gleaner}
PEERS=${PEERS:-stock,haltpoll,haltpoll:2400us,poll,naive,gleaner}
B=${XDG_CACHE_HOME:-$HOME/.cache}/gleaner-bench/held-out
mkdir -p "$OUT" "$B/mk"
wants() { [[ -z $ROWS || ,$ROWS, == *,$1,* ]]; } # a row this run makes
for p in httpd chan mutex; do
  [[ $B/$p -nt $here/$p.go ]] || (cd "$B" && GOCACHE=$B/.gocache go build -o "$B/$p" "$here/$p.go")
done
for j in Pp Fj; do
  [[ $B/$j.class -nt $here/$j.java ]] || javac -d "$B" "$here/$j.java"
done
! wants zstd-T2 || [[ -f $B/zstd.in ]] || head -c 400000000 /dev/urandom | base64 > "$B/zstd.in"
! wants pigz-p2 || [[ -f $B/pigz.in ]] || head -c 300000000 /dev/urandom > "$B/pigz.in"
if wants make-j2 && [[ ! -f $B/mk/Makefile ]]; then
  for i in $(seq 250); do echo "int f$i(int x){return x*$i;}" > "$B/mk/f$i.c"; done
  printf 'OBJS := $(patsubst %%.c,%%.o,$(wildcard *.c))\nall: $(OBJS)\n%%.o: %%.c\n\tcc -O2 -c $< -o $@\nclean:\n\trm -f *.o\n' > "$B/mk/Makefile"
fi
scripts/bench/machine-json.py "$ROUNDS" "sudo OUT=$OUT ROUNDS=$ROUNDS${CONTROL:+ CONTROL=1}${ROWS:+ ROWS=$ROWS} scripts/bench/held-out/held-out.sh" > "$OUT/machine.json"
run() { # name command...
  local name=$1; shift
  wants "$name" || return 0
  echo "== $name: $*" >&2
  scripts/bench/front.py --rounds "$ROUNDS" --peers "$PEERS" ${CONTROL:+--control} --json "$OUT/$name.json" -- "$@" | tail -n 14
}
http=$here/http-doc.py
run go-http-c1 "$http" 1 3 "$B/httpd" {port}
run node-http-c1 "$http" 1 3 node "$here/server.js" {port}
run go-http-c8 "$http" 8 3 "$B/httpd" {port}
run pg-c1 "$here/pg.sh" 1 3
run pg-c8 "$here/pg.sh" 8 3
run java-pp java -cp "$B" Pp 40000
run go-chan "$B/chan" 3000000
run zstd-T2 sh -c "zstd -T2 -6 -q -c $B/zstd.in > /dev/null"
run make-j2 sh -c "make -s -j2 -C $B/mk && make -s -C $B/mk clean"
run py-echo "$here/echo.py" 20000
run go-mutex "$B/mutex" 3000000
run java-fj java -cp "$B" Fj 1500
run iperf3 "$here/iperf.sh" 8G
run pigz-p2 sh -c "pigz -p 2 -c $B/pigz.in > /dev/null"
run curl-loop "$here/curl-loop.sh" 300
run sng-sock stress-ng --sock 2 --sock-ops 8000 -q
run sng-futex stress-ng --futex 2 --futex-ops 200000 -q
