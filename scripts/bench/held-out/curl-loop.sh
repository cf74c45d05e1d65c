#!/bin/bash
# python3 -m http.server and N curl processes one after another, each fetching a small file
# (held-out.sh): a shell loop that starts a process per request.
#   curl-loop.sh N
set -u
d=$(mktemp -d); echo hello > $d/f; port=$((23000 + $$ % 1000))
python3 -m http.server -b 127.0.0.1 -d $d $port >/dev/null 2>&1 & s=$!
for i in $(seq 200); do curl -sf -o /dev/null http://127.0.0.1:$port/f && break; sleep 0.01; done
for i in $(seq "$1"); do curl -sf -o /dev/null http://127.0.0.1:$port/f; done
kill $s; wait $s 2>/dev/null; rm -rf $d
