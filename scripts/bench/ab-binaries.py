#!/usr/bin/env python3
"""A/B of two gleaner binaries on one latency workload, outside `gleaner compare`: each round
runs `OLD run -- CMD`, `NEW run -- CMD`, `NEW run --no-trace -- CMD` and CMD alone (stock),
in that order, and prints every run's p50/p99 and the medians [min..max] per variant. CMD must
print a BenchDoc (`gleaner bench workload ... --json`, scripts/bench/sockperf-doc.py,
scripts/bench/nginx-doc.py). Root (the agent's idle knobs and tracer).

    scripts/bench/ab-binaries.py --old /tmp/gleaner-base --new target/release/gleaner \\
        --rounds 11 -- scripts/bench/sockperf-doc.py ul 3 2000
"""

import argparse
import json
import statistics
import subprocess
import sys


def latency(out):
    docs = [line for line in out.splitlines() if line.startswith("{")]
    if not docs:
        raise SystemExit(f"ab-binaries: the command printed no BenchDoc: {out[-300:]!r}")
    lat = json.loads(docs[-1])["runs"][0]["latency"]
    return lat["p50_ns"] / 1e3, lat["p99_ns"] / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the baseline gleaner binary")
    ap.add_argument("--new", required=True, help="the gleaner binary under test")
    ap.add_argument("--rounds", type=int, default=9, help="rounds (default 9)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the workload command")
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd or a.rounds < 1:
        ap.error("give --rounds >= 1 and a command after --")
    variants = {
        "old": [a.old, "run", "--"],
        "new": [a.new, "run", "--"],
        "new --no-trace": [a.new, "run", "--no-trace", "--"],
        "stock": [],
    }
    res = {k: [] for k in variants}
    for r in range(a.rounds):
        for k, pre in variants.items():
            p = subprocess.run(pre + cmd, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"ab-binaries: {' '.join(pre + cmd)} exited {p.returncode}: {p.stderr[-300:]}")
            res[k].append(latency(p.stdout))
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{k} {v[-1][0]:.1f}/{v[-1][1]:.0f}" for k, v in res.items()), flush=True)
    print()
    for k, v in res.items():
        p50 = sorted(x[0] for x in v)
        p99 = sorted(x[1] for x in v)
        print(f"{k:15} p50 {statistics.median(p50):7.1f} [{p50[0]:.1f}..{p50[-1]:.1f}]  "
              f"p99 {statistics.median(p99):7.1f} [{p99[0]:.1f}..{p99[-1]:.1f}] us")


if __name__ == "__main__":
    main()
