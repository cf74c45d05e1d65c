#!/usr/bin/env python3
"""The share of slow requests in each time bin of `kv-latency.c` dumps (KV_LATENCY_DUMP: end
and latency, CLOCK_MONOTONIC ns, one request a line), from each run's first request: where in
a run its slow requests fall (a slow start, a burst).

    KV_LATENCY_DUMP=/tmp/kv1.txt gleaner run -- scripts/bench/redis-doc.py lat 3
    scripts/bench/slow-by-bin.py [--slow-us 30] [--bin-ms 250] /tmp/kv1.txt ...

One line per dump: its name, its p99 (us) and the percentage of requests over --slow-us in
each bin. A benchmark aid (standard library only)."""

import argparse
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dumps", nargs="+", help="kv-latency dumps (end_ns latency_ns per line)")
    ap.add_argument("--slow-us", type=float, default=30.0, help="a request slower than this is slow (default 30)")
    ap.add_argument("--bin-ms", type=float, default=250.0, help="bin length (default 250)")
    a = ap.parse_args()
    if a.slow_us <= 0 or a.bin_ms <= 0:
        sys.exit(f"--slow-us {a.slow_us} and --bin-ms {a.bin_ms} must be above 0")
    slow_ns, bin_ns = a.slow_us * 1e3, a.bin_ms * 1e6
    for f in a.dumps:
        try:
            reqs = [tuple(map(int, line.split())) for line in open(f) if line.strip()]
        except (OSError, ValueError) as e:
            sys.exit(f"slow-by-bin: {f}: {e}")
        if not reqs:
            sys.exit(f"slow-by-bin: {f}: no requests")
        t0 = reqs[0][0] - reqs[0][1]
        bins = {}
        for end, lat in reqs:
            b = int((end - t0) // bin_ns)
            n, s = bins.get(b, (0, 0))
            bins[b] = (n + 1, s + (lat > slow_ns))
        lats = sorted(lat for _, lat in reqs)
        p99 = lats[min(len(lats) - 1, int(len(lats) * 0.99))] / 1e3
        print(f.split("/")[-1].ljust(14), f"p99 {p99:.1f}", " ".join(f"{100 * s / n:.1f}" for _, (n, s) in sorted(bins.items())))


if __name__ == "__main__":
    main()
