#!/usr/bin/env python3
"""Which of the agent's doings a workload's slow requests fall in: lines up every request of a
`kv-latency.c` dump (KV_LATENCY_DUMP: end and latency, CLOCK_MONOTONIC ns) with the agent's
`--events` (each period's end as `mono_ns`, `traced_ns` where the tracer counted, the mode it
ran in) and prints, for the requests slower than --slow-us:

- by class: in a probe of "off" (the period ran with retention off), in a traced slice
  (from the period's start for `traced_ns`), in the agent's period work (the first
  --work-ms after a period's end), or none of these; each class's share of the requests and
  of the slow ones, its p50 and p99, and the run's p99 without it;
- by phase: the share of slow requests by time since the last period's end, for traced and
  untraced periods apart (what follows the agent's work and the tracer's attach and detach),
  leaving out the first --skip-s seconds (the start-up's traced periods) and the periods
  around a probe (the one before it, it and the two after it: traced for the comparison, and
  the vCPUs' windows regrow after it), which would otherwise pass for the tracer's;
- by second: the share of slow requests in each whole second of the run.

    KV_LATENCY_DUMP=/tmp/kv.txt gleaner run --events /tmp/ev.jsonl -- scripts/bench/redis-doc.py lat 20
    scripts/bench/request-blame.py /tmp/ev.jsonl /tmp/kv.txt

A benchmark aid (standard library only)."""

import argparse
import bisect
import json
import statistics
import sys


def pct(xs, p):
    """The p-th percentile of sorted `xs` (nearest rank), or None."""
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def us(x):
    return "-" if x is None else f"{x / 1e3:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("events", help="the agent's --events file (JSON lines with mono_ns)")
    ap.add_argument("dump", help="kv-latency's KV_LATENCY_DUMP file (end_ns latency_ns per line)")
    ap.add_argument("--slow-us", type=float, default=30.0, help="a request slower than this is slow (default 30)")
    ap.add_argument("--work-ms", type=float, default=1.0, help="the agent's period work: this long after a period's end (default 1)")
    ap.add_argument("--skip-s", type=float, default=2.0, help="the phase profile leaves out this many first seconds (default 2)")
    a = ap.parse_args()
    if a.slow_us <= 0 or a.work_ms < 0 or a.skip_s < 0:
        sys.exit(f"--slow-us {a.slow_us} must be above 0, --work-ms {a.work_ms} and --skip-s {a.skip_s} at least 0")
    try:
        periods = [e for e in map(json.loads, open(a.events)) if e.get("event") == "period" and e.get("mono_ns")]
        reqs = [tuple(map(int, line.split())) for line in open(a.dump) if line.strip()]
    except (OSError, ValueError) as e:
        sys.exit(f"request-blame: {e}")
    if len(periods) < 2 or not reqs:
        sys.exit(f"request-blame: {len(periods)} periods with mono_ns in {a.events}, {len(reqs)} requests in {a.dump}: need 2 and 1")
    ends = [p["mono_ns"] for p in periods]
    probes = [k for k, p in enumerate(periods) if p.get("retention") == "off"]
    near_probe = {j for k in probes for j in range(k - 1, k + 3)}
    slow_ns, work_ns = a.slow_us * 1e3, a.work_ms * 1e6
    names = ["probe of off", "traced slice", "agent's period work", "none of these"]
    by_class = [[] for _ in names]
    bins = [0, 1, 2, 5, 10, 20, 50, 100, 150, 200, 10_000]
    phase = {True: [[0, 0] for _ in bins[1:]], False: [[0, 0] for _ in bins[1:]]}
    per_sec = {}
    t0 = reqs[0][0]
    for end, lat in reqs:
        start = end - lat
        k = bisect.bisect_left(ends, end)  # the request ended in period k (ends[k-1] .. ends[k])
        c = 3
        if 0 < k < len(ends):
            p, begun = periods[k], ends[k - 1]
            if p.get("retention") == "off":
                c = 0
            elif p.get("traced_ns") and start <= begun + p["traced_ns"]:
                c = 1
            elif start <= begun + work_ns:
                c = 2
            if k not in near_probe and end - t0 >= a.skip_s * 1e9:
                ms = (end - begun) / 1e6
                row = phase[bool(p.get("traced_ns"))][min(len(bins) - 2, max(0, bisect.bisect_right(bins, ms) - 1))]
                row[0] += 1
                row[1] += lat > slow_ns
        by_class[c].append(lat)
        s = per_sec.setdefault((end - t0) // 1_000_000_000, [0, 0])
        s[0] += 1
        s[1] += lat > slow_ns
    every = sorted(lat for _, lat in reqs)
    n, n_slow = len(every), sum(lat > slow_ns for lat in every)
    print(f"{n} requests, p50 {us(pct(every, 50))} us, p99 {us(pct(every, 99))} us; {n_slow} over {a.slow_us:g} us "
          f"({n_slow / n * 100:.2f}%); {len(periods)} periods")
    print(f"\n{'class':<22} {'requests':>9} {'of slow':>8} {'p50':>7} {'p99':>7}  p99 without it")
    for name, lats in zip(names, by_class):
        if not lats:
            continue
        lats.sort()
        rest = sorted(x for other in by_class if other is not lats for x in other)
        slow = sum(x > slow_ns for x in lats)
        print(f"{name:<22} {len(lats) / n * 100:8.2f}% {slow / max(1, n_slow) * 100:7.2f}% {us(pct(lats, 50)):>7} "
              f"{us(pct(lats, 99)):>7}  {us(pct(rest, 99))}")
    print(f"\nslow share by ms since the period's end (after {a.skip_s:g} s, away from probes): {' '.join(f'{lo}-{hi}' for lo, hi in zip(bins, bins[1:-1]))} {bins[-2]}-")
    for traced in (True, False):
        cells = " ".join(f"{s / c * 100:.2f}%" if c else "-" for c, s in phase[traced])
        print(f"  {'traced' if traced else 'untraced':<9} {cells}")
    whole = [s / c * 100 for sec, (c, s) in sorted(per_sec.items()) if sec < max(per_sec)]
    if whole:
        print(f"\nslow share by second: median {statistics.median(whole):.2f}%, min {min(whole):.2f}%, max {max(whole):.2f}%")
        print("  " + " ".join(f"{x:.2f}" for x in whole))


if __name__ == "__main__":
    main()
