#!/bin/bash
# python3 -m http.server and N curl processes one after another, each fetching a small file
# (held-out.sh): a shell loop that starts a process per request.
#   curl-loop.sh N
set -u
d=$(mktemp -d); echo hello > "$d/f"; port=$((23000 + $$ % 1000))
python3 -m http.server -b 127.0.0.1 -d "$d" $port >/dev/null 2>&1 & s=$!
trap 'kill $s 2>/dev/null; wait $s 2>/dev/null; rm -rf "$d"' EXIT
url=http://127.0.0.1:$port/f
for _ in $(seq 200); do curl -sf -o /dev/null "$url" && break; sleep 0.01; done
curl -sf -o /dev/null "$url" || { echo "curl-loop.sh: the server on port $port did not answer" >&2; exit 1; }
for _ in $(seq "$1"); do curl -sf -o /dev/null "$url" || exit 1; done
