import time,os
def t(path,n=300):
    s=time.perf_counter()
    for _ in range(n):
        with open(path,'rb') as f: f.read()
    return (time.perf_counter()-s)/n*1e6
def t_pread(path,n=300):
    fd=os.open(path,os.O_RDONLY)
    s=time.perf_counter()
    for _ in range(n):
        os.pread(fd,4096,0)
    r=(time.perf_counter()-s)/n*1e6
    os.close(fd); return r
pid=os.getpid()
s=time.perf_counter()
for _ in range(300): pass
print('loop', (time.perf_counter()-s)/300*1e6)
for p in ['/proc/stat',f'/proc/{pid}/task/{pid}/status',f'/proc/{pid}/task/{pid}/schedstat',f'/proc/{pid}/task/{pid}/stat',f'/proc/{pid}/task/{pid}/children','/sys/devices/system/cpu/online']:
    print(p.replace(str(pid),'PID'), 'open+read+close %.1f us' % t(p), 'pread %.1f us' % t_pread(p))
s=time.perf_counter()
for _ in range(300): os.listdir(f'/proc/{pid}/task')
print('listdir task %.1f us' % ((time.perf_counter()-s)/300*1e6))
s=time.perf_counter()
for _ in range(100): os.listdir('/proc')
print('listdir /proc %.1f us' % ((time.perf_counter()-s)/100*1e6))
