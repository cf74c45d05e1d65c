#!/bin/bash
# usage: ctx.sh haltpoll|stock
HP=/sys/module/haltpoll/parameters
mode=$1
orig=$(cat $HP/guest_halt_poll_ns)
[ "$mode" = haltpoll ] && echo 200000 > $HP/guest_halt_poll_ns
c0=$(awk '/^ctxt/{print $2}' /proc/stat); i0=$(awk '/^intr/{print $2}' /proc/stat)
r0=$(grep -h "" /sys/devices/system/cpu/cpu*/cpuidle/state0/usage | paste -sd+ | bc)
out=$(cd "$(dirname "$0")/../../../.." && scripts/bench/nginx-doc.py 50 3)
c1=$(awk '/^ctxt/{print $2}' /proc/stat); i1=$(awk '/^intr/{print $2}' /proc/stat)
r1=$(grep -h "" /sys/devices/system/cpu/cpu*/cpuidle/state0/usage | paste -sd+ | bc)
echo $orig > $HP/guest_halt_poll_ns
python3 - "$out" $((c1-c0)) $((i1-i0)) $((r1-r0)) $mode <<'PY'
import json,sys
out,c,i,p,mode=sys.argv[1],int(sys.argv[2]),int(sys.argv[3]),int(sys.argv[4]),sys.argv[5]
d=json.loads(out.strip().splitlines()[-1]) if out.strip().startswith('{') else None
# find items
import re
m=re.search(r'"items":\s*([0-9]+)',out); n=int(m.group(1)) if m else 0
print(f"{mode:9s} items={n} ctxt/item={c/max(n,1):.3f} intr/item={i/max(n,1):.3f} poll_entries={p}")
PY
