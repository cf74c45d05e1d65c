#!/usr/bin/env python3
"""Does the host stop this VM when it keeps its vCPUs busy? (a CPU quota on the VM)

One busy thread per CPU, each busy DUTY of every 10 ms (sleeping the rest), for SECONDS;
each reports the gaps in its own clock longer than 2 ms: the times the host did not run its
vCPU although it wanted to run. A host that caps the VM at its vCPU count (a cgroup quota)
shows ~100 ms gaps (its period) at DUTY 1.0 and none a little below.

    scripts/bench/host-quota.py [SECONDS=30] [DUTY=1.0] [CPUS=all]

On the development VM (2 vCPUs, 2026-11-25): DUTY 1.0 on both vCPUs, 10 gaps of ~100 ms in
30 s; 0.95 on both, or 1.0 on one vCPU alone, none. Measured once per host, not a test: it
keeps every vCPU busy for SECONDS.
"""
import os
import sys
import time
from multiprocessing import Process, Queue


def spin(cpu: int, seconds: float, duty: float, out: Queue) -> None:
    os.sched_setaffinity(0, {cpu})
    t0 = last = time.monotonic()
    busy_until = t0 + 0.01 * duty
    gaps = []
    while True:
        now = time.monotonic()
        if now - last > 0.002:
            gaps.append((round(last - t0, 3), round((now - last) * 1000, 1)))
        last = now
        if now - t0 > seconds:
            break
        if duty < 1.0 and now > busy_until:
            time.sleep(0.01 * (1.0 - duty))
            last = time.monotonic()
            busy_until = last + 0.01 * duty
    out.put((cpu, gaps))


def main() -> int:
    try:
        seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
        duty = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
        cpus = sorted(os.sched_getaffinity(0)) if len(sys.argv) <= 3 else [int(c) for c in sys.argv[3].split(",")]
    except ValueError as e:
        print(f"host-quota: {e}: usage: host-quota.py [SECONDS] [DUTY in (0, 1]] [CPU,CPU,...]", file=sys.stderr)
        return 2
    if not (0 < seconds <= 600 and 0 < duty <= 1.0):
        print(f"host-quota: SECONDS {seconds} must be in (0, 600], DUTY {duty} in (0, 1]", file=sys.stderr)
        return 2
    out: Queue = Queue()
    procs = [Process(target=spin, args=(c, seconds, duty, out)) for c in cpus]
    for p in procs:
        p.start()
    results = sorted(out.get() for _ in procs)
    for p in procs:
        p.join()
    for cpu, gaps in results:
        long = [g for g in gaps if g[1] >= 50]
        print(f"cpu {cpu}: {len(gaps)} gaps > 2 ms, {len(long)} >= 50 ms: {long[:20]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
