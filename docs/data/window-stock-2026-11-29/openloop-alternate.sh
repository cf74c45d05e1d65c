#!/bin/bash
# alternated rounds: old/new agent on the open loop at RATE; per run p50, p99 (us) and the agent's poll_ns sum (ms) over the run
RATE=$1; ROUNDS=$2; MS=$3
for i in $(seq $ROUNDS); do
  order="old new"; [ $((i % 2)) = 0 ] && order="new old"
  for v in $order; do
    b=/tmp/m2/gleaner-reset; [ $v = new ] && b=/tmp/m2/gleaner-shrink0
    rm -f /tmp/m2/ol-ev.jsonl
    $b run --events /tmp/m2/ol-ev.jsonl -- $b bench workload openloop --rate $RATE --duration-ms $MS --json 2>/dev/null > /tmp/m2/ol-out.json
    python3 - $v <<'PY'
import json,sys
d=json.load(open('/tmp/m2/ol-out.json')); r=d['runs'][0]; l=r['latency']
poll=sum(json.loads(x).get('poll_ns') or 0 for x in open('/tmp/m2/ol-ev.jsonl'))
sh=sum(1 for x in open('/tmp/m2/ol-ev.jsonl') if json.loads(x).get('window_reset'))
print(sys.argv[1], "p50 %.1f p99 %.1f poll_ms %.0f busy_ms %.0f resets %d" % (l['p50_ns']/1e3, l['p99_ns']/1e3, poll/1e6, r['busy_ns']/1e6, sh))
PY
  done
done
