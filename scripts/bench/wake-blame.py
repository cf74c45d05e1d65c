#!/usr/bin/env python3
"""Who made a workload's wakeups wait: reads a `perf record -a -e sched:sched_switch,
sched:sched_waking` file and, for every wakeup of a task named COMM that found another task
running on its CPU, charges the wait (waking to switched in) to that task. Prints one line per
task: how many wakeups it delayed, the sum, median and worst wait, and how many waited over
100 us. A wakeup that found its CPU idle is not counted (the idle policy's share of it is what
`gleaner compare` measures).

    perf record -a -e sched:sched_switch,sched:sched_waking -o ul.perf -- \\
        gleaner run -- scripts/bench/sockperf-doc.py ul 3 2000
    scripts/bench/wake-blame.py ul.perf sockperf

A benchmark aid: it parses `perf script` text."""

import collections
import re
import subprocess
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: wake-blame.py PERF_DATA COMM")
    path, comm = sys.argv[1], sys.argv[2]
    out = subprocess.run(["perf", "script", "-i", path, "-F", "cpu,time,event,trace"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"perf script -i {path} failed: {out.stderr.strip()[-300:]}")
    waking = {}
    blame = collections.defaultdict(list)
    for line in out.stdout.splitlines():
        m = re.match(r"\s*\[(\d+)\]\s+([\d.]+):\s+(\S+):\s+(.*)", line)
        if not m:
            continue
        cpu, t, event, rest = int(m.group(1)), float(m.group(2)), m.group(3), m.group(4)
        if event == "sched:sched_waking":
            w = re.search(r"comm=(\S+) pid=(\d+)", rest)
            if w and w.group(1) == comm:
                waking[w.group(2)] = t
        elif event == "sched:sched_switch":
            s = re.search(r"prev_comm=(.+?) prev_pid=(\d+).*next_comm=(.+?) next_pid=(\d+)", rest)
            if s and s.group(4) in waking:
                t0 = waking.pop(s.group(4))
                if s.group(1) != f"swapper/{cpu}":
                    blame[s.group(1)].append(t - t0)
    if not blame:
        sys.exit(f"no wakeup of a task named {comm!r} found another task running in {path}")
    for name, waits in sorted(blame.items(), key=lambda kv: -sum(kv[1])):
        waits.sort()
        print(f"{name:20s} n={len(waits):5d} sum={sum(waits) * 1e3:8.2f} ms p50={waits[len(waits) // 2] * 1e6:7.0f} us "
              f"max={waits[-1] * 1e6:7.0f} us over 100 us: {sum(1 for w in waits if w > 1e-4)}")


if __name__ == "__main__":
    main()
