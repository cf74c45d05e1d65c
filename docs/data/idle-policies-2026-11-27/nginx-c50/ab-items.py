#!/usr/bin/env python3
# usage: abitems.py ROUNDS SECS name=prefix ... ; runs nginx-doc.py 50 SECS under each prefix; prints throughput medians
import subprocess, sys, json, re, statistics, os
# The repository's nginx harness, found from this file's place in docs/data/<run>/nginx-c50/.
NGINX_DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../../scripts/bench/nginx-doc.py')
rounds=int(sys.argv[1]); secs=sys.argv[2]; vs=[a.split('=',1) for a in sys.argv[3:]]
HPD='/sys/module/haltpoll/parameters/'
res={n:[] for n,_ in vs}
for r in range(rounds):
    order=vs[r%len(vs):]+vs[:r%len(vs)]
    line=[]
    for n,pre in order:
        saved=None
        if pre.startswith('@fixed'):
            w=pre.split(':')[1]; keys=['guest_halt_poll_ns','guest_halt_poll_grow_start','guest_halt_poll_allow_shrink']
            saved={k:open(HPD+k).read().strip() for k in keys}
            open(HPD+'guest_halt_poll_grow_start','w').write(w); open(HPD+'guest_halt_poll_ns','w').write(w); open(HPD+'guest_halt_poll_allow_shrink','w').write('N')
            cmd=[]
        elif pre.startswith('@haltpoll'):
            saved={'guest_halt_poll_ns':open(HPD+'guest_halt_poll_ns').read().strip()}
            open(HPD+'guest_halt_poll_ns','w').write('200000'); cmd=[]
        else: cmd=pre.split()
        try:
            out=subprocess.run(cmd+[NGINX_DOC,'50',secs],capture_output=True,text=True).stdout
        finally:
            if saved:
                open(HPD+'guest_halt_poll_ns','w').write(saved['guest_halt_poll_ns'])
                for k,v in saved.items(): open(HPD+k,'w').write(v)
                if pre.startswith('@fixed'):
                    # reset the per-CPU windows: governor away and back
                    g='/sys/devices/system/cpu/cpuidle/current_governor'
                    cur=open(g).read().strip(); open(g,'w').write('menu'); open(g,'w').write(cur)
        m=re.search(r'"throughput": ([0-9.]+)',out); t=float(m.group(1)) if m else float('nan')
        res[n].append(t); line.append(f"{n} {t:.0f}")
    print(f"round {r+1}: "+", ".join(line), flush=True)
base=statistics.median(res[vs[0][0]])
for n,v in res.items(): print(f"{n:12s} {statistics.median(v):8.0f} [{min(v):.0f}..{max(v):.0f}] {statistics.median(v)/base:.3f}")
