#!/bin/bash
# An iperf3 server (one test) and its client moving BYTES over loopback TCP (held-out.sh):
# a streaming transfer between two processes.
#   iperf.sh BYTES     e.g. iperf.sh 8G
set -u
port=$((22000 + $$ % 1000))
iperf3 -s -1 -p $port >/dev/null 2>&1 & s=$!
# Ready when it listens (a probing connection would be its one test).
for _ in $(seq 200); do ss -Hltn "sport = :$port" | grep -q . && break; sleep 0.01; done
if ! iperf3 -c 127.0.0.1 -p $port -n "$1" >/dev/null; then
  kill $s 2>/dev/null; wait $s 2>/dev/null
  echo "iperf.sh: the client failed (server on port $port)" >&2; exit 1
fi
wait $s
