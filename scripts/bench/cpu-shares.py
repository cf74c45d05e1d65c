#!/usr/bin/env python3
"""Runs a command and prints, per CPU, the share of the run it was busy (/proc/stat, steal
excepted), the share it polled in the kernel's POLL idle state (cpuidle state0 `time`, which
/proc/stat counts as idle) and its idle entries a second by state (cpuidle `usage`):

    scripts/bench/cpu-shares.py -- scripts/bench/nginx-doc.py 50 4
    scripts/bench/cpu-shares.py -- target/release/gleaner run -- scripts/bench/nginx-doc.py 50 4
    scripts/bench/cpu-shares.py --every 0.5 -- scripts/bench/sockperf-doc.py ul 3 60000

With `--every S`, one line every S seconds while the command runs (idle, user, system and
interrupt shares of /proc/stat's ticks), to see which vCPU a workload keeps busy while it
measures rather than over its start-up too. The command's standard output, where it is a
BenchDoc (`gleaner bench ... --json`, scripts/bench/*-doc.py), gives the run's throughput.
A benchmark harness, not part of gleaner: how docs/idle-policy.md ("No retention behind a
bottleneck") found which vCPU paces a server."""

import argparse
import glob
import json
import os
import subprocess
import sys
import time

TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")


def proc_stat():
    """Per CPU: (idle ticks, all ticks but steal, user, system, irq + softirq)."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                name, *v = line.split()
                v = list(map(int, v))
                user, nice, system, idle, iowait, irq, softirq = v[:7]
                steal = v[7] if len(v) > 7 else 0
                total = sum(v[:8]) - steal
                out[int(name[3:])] = (idle + iowait, total, user + nice, system, irq + softirq)
    return out


def cpuidle(cpu):
    """Per state name: (usage, time in ns)."""
    states = {}
    for d in sorted(glob.glob(f"/sys/devices/system/cpu/cpu{cpu}/cpuidle/state*")):
        try:
            with open(f"{d}/name") as f:
                name = f.read().strip()
            with open(f"{d}/usage") as f:
                usage = int(f.read())
            with open(f"{d}/time") as f:
                t = int(f.read()) * 1000
        except OSError:
            continue
        states[name] = (usage, t)
    return states


def snap():
    stat = proc_stat()
    return stat, {c: cpuidle(c) for c in stat}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--every", type=float, default=0.0, help="also print shares every S seconds while it runs")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command: cpu-shares.py [--every S] -- CMD ARGS...")
    if a.every < 0:
        ap.error(f"--every {a.every}: allowed seconds >= 0")
    t0 = time.monotonic()
    first = snap()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    if a.every > 0:
        last = first[0]
        while proc.poll() is None:
            time.sleep(a.every)
            now = proc_stat()
            cols = []
            for c in sorted(now):
                d = [x - y for x, y in zip(now[c], last[c])]
                t = max(d[1], 1)
                cols.append(f"cpu{c}: idle {d[0] / t:.3f} usr {d[2] / t:.2f} sys {d[3] / t:.2f} irq {d[4] / t:.2f}")
            print(f"{time.monotonic() - t0:6.1f}s " + "  ".join(cols), flush=True)
            last = now
    out, _ = proc.communicate()
    wall_ns = (time.monotonic() - t0) * 1e9
    (s0, i0), (s1, i1) = first, snap()
    throughput = None
    try:
        throughput = json.loads(out)["runs"][0].get("throughput")
    except (ValueError, KeyError, IndexError, TypeError):
        pass
    print(f"exit {proc.returncode}, {wall_ns / 1e9:.2f} s" + (f", throughput {throughput:.0f}/s" if throughput else ""))
    for c in sorted(s1):
        busy = ((s1[c][1] - s0[c][1]) - (s1[c][0] - s0[c][0])) / max(s1[c][1] - s0[c][1], 1)
        polled = (i1[c].get("POLL", (0, 0))[1] - i0[c].get("POLL", (0, 0))[1]) / wall_ns
        entries = ", ".join(
            f"{name} {(u - i0[c].get(name, (0, 0))[0]) * 1e9 / wall_ns:.0f}/s" for name, (u, _) in i1[c].items()
        )
        print(f"cpu{c}: busy {busy:.3f}, polled {polled:.3f}; idle entries {entries or 'none (no cpuidle)'}")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
