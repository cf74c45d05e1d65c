#!/bin/bash
# The in-process agent of `gleaner compare` as one scripts/bench/ab.py variant: runs
# `gleaner compare --runs 1 --policies gleaner --json -- CMD` and prints its one run as a
# BenchDoc (latency, throughput), which ab.py reads; a failed compare fails the variant with
# compare's own message. G: the gleaner binary (default: this checkout's release build). Root.
#   scripts/bench/ab.py --variant "run=target/release/gleaner run --" \
#       --variant cmp=scripts/bench/compare-variant.sh -- CMD
set -euo pipefail
G=${G:-$(dirname "$0")/../../target/release/gleaner}
t=$(mktemp)
trap 'rm -f "$t"' EXIT
"$G" compare --runs 1 --policies gleaner --json -- "$@" > "$t"
python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))["samples"][0]
print(json.dumps({"runs": [{"latency": s["latency"], "throughput": s["throughput"]}]}))' "$t"
