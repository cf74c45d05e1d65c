#!/usr/bin/env python3
# nginx c50 12 s; toggles between a fixed 64 us window (the agent's) and off every T s; bytes of nginx+wrk every 100 ms
import subprocess, time, os, glob, sys, statistics
# The repository's nginx harness, found from this file's place in docs/data/<run>/nginx-c50/.
NGINX_DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../../scripts/bench/nginx-doc.py')
HPD='/sys/module/haltpoll/parameters/'
keys=['guest_halt_poll_ns','guest_halt_poll_grow_start','guest_halt_poll_allow_shrink']
orig={k:open(HPD+k).read().strip() for k in keys}
def setk(d):
    for k,v in d.items(): open(HPD+k,'w').write(str(v))
ON={'guest_halt_poll_grow_start':65536,'guest_halt_poll_ns':65536,'guest_halt_poll_allow_shrink':'N'}
OFF={'guest_halt_poll_ns':0,'guest_halt_poll_grow_start':orig['guest_halt_poll_grow_start'],'guest_halt_poll_allow_shrink':'Y'}
T=float(sys.argv[1]); W=sys.argv[2] if len(sys.argv)>2 else '65536'
ON['guest_halt_poll_grow_start']=ON['guest_halt_poll_ns']=int(W)
p=subprocess.Popen([NGINX_DOC,'50','12'],stdout=subprocess.DEVNULL)
time.sleep(1.0)
pids=subprocess.run(['pgrep','-x','nginx|wrk'],capture_output=True,text=True).stdout.split()
files=[open(t) for pid in pids for t in glob.glob(f'/proc/{pid}/task/*/io')]
def total():
    s=0
    for f in files:
        f.seek(0); d=f.read().split('\n'); s+=int(d[0].split()[1])+int(d[1].split()[1])
    return s
def poll_ns():
    return sum(int(open(f).read()) for f in glob.glob('/sys/devices/system/cpu/cpu*/cpuidle/state0/time'))*1000
try:
    state='off'; t0=time.time(); last=total(); lp=poll_ns(); lt=t0; nxt=t0+T; res={'on':[],'off':[]}; k=0
    while time.time()-t0<10:
        time.sleep(0.1)
        now=time.time(); b=total(); pn=poll_ns()
        rate=(b-last)/(now-lt)/1e6; pr=(pn-lp)/(now-lt)/1e9; last,lt,lp=b,now,pn
        print(f"{now-t0:5.2f} {state:3s} {rate:6.1f} MB/s poll {pr:.3f}")
        res[state].append(rate)
        if now>=nxt:
            state='on' if state=='off' else 'off'
            setk(ON if state=='on' else OFF); nxt=now+T
finally:
    setk({'guest_halt_poll_ns':orig['guest_halt_poll_ns']}); setk(orig)
    p.wait()
for k,v in res.items(): print(k, round(statistics.median(v),1), len(v))
