import re,sys,collections
waking={}; running={}; hist=collections.Counter(); slow=[]
t0=None
for line in open(sys.argv[1]):
    m=re.match(r"\s*\[(\d+)\]\s+([\d.]+):\s+(\S+):\s+(.*)",line)
    if not m: continue
    cpu,t,ev,rest=int(m.group(1)),float(m.group(2)),m.group(3),m.group(4)
    if t0 is None: t0=t
    if ev=="sched:sched_waking":
        w=re.search(r"comm=(\S+) pid=(\d+).*target_cpu=(\d+)",rest)
        if w and w.group(1) in("nginx","wrk"): waking[w.group(2)]=(t,int(w.group(3)),running.get(int(w.group(3)),'?'))
    else:
        s=re.search(r"prev_comm=(.+?) prev_pid=(\d+).*next_comm=(.+?) next_pid=(\d+)",rest)
        if not s: continue
        running[cpu]=s.group(3)
        pid=s.group(4)
        if pid in waking:
            tw,tc,was=waking.pop(pid)
            d=(t-tw)*1e6
            hist[min(int(d//50)*50,1000)]+=1
            if d>200: slow.append((round(t-t0,4),s.group(3),round(d),cpu,was,s.group(1)))
print(sorted(hist.items()))
print(len(slow))
for x in slow: print(x)
