#!/usr/bin/env python3
"""Alternated rounds of one workload under several variants, outside `gleaner compare`: two
gleaner binaries, one binary with different flags or configs, against stock and the kernel's
guest haltpoll. Each round runs every variant once, in balanced orders (each variant in each
place and after each other variant equally often over N rounds, 2N for odd N); the
first variant is the reference the others are compared with, round by round.

A variant is NAME=PREFIX: PREFIX (split on spaces) goes before the workload command. An empty
PREFIX runs the command alone (stock). `@haltpoll` runs it alone with the kernel's guest
haltpoll at its upstream defaults (guest_halt_poll_ns 200000, grow 2, grow_start 50000, shrink
2, allow_shrink Y), every parameter put back after the run (needs the haltpoll cpuidle driver).

The metric: the request latency (p50 and p99) of the BenchDoc the command prints (`gleaner
bench workload ... --json`, scripts/bench/*-doc.py), or the wall seconds of the command where
it prints none (sysbench, stress-ng). Root where a variant runs gleaner or @haltpoll.

    scripts/bench/ab.py --rounds 9 --variant 'new=target/release/gleaner run --' \\
        --variant 'old=/tmp/gleaner-base run --' --variant 'stock=' --variant 'haltpoll=@haltpoll' \\
        -- scripts/bench/sockperf-doc.py ul 3 2000

Summary per variant: medians [min..max], and beside every variant after the first the median
of its per-round ratios to the first with a 95% bootstrap interval of that median (one that
holds 1: the rounds cannot tell the two apart), their geometric mean and in how many rounds
the ratio was above 1 (latency: first / variant,
wall or us per item (a document's throughput): first / variant; above 1 the variant was
faster).

Steal: the host's time taken from this VM during each run (/proc/stat `steal`, all CPUs, ms)
is printed per round where it is not 0, and the summary adds the median of the runs with less
than --steal-ms (default 1 ms) of it, with their count: these machines are shared, and a run
the host interrupted says nothing about the policy.
"""

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time

HALTPOLL = "/sys/module/haltpoll/parameters"
HALTPOLL_UPSTREAM = {"guest_halt_poll_ns": "200000", "guest_halt_poll_grow": "2",
                     "guest_halt_poll_grow_start": "50000", "guest_halt_poll_shrink": "2",
                     "guest_halt_poll_allow_shrink": "Y"}


def round_order(n, r):
    """The order of round r: a Williams design, as `gleaner compare` runs its policies
    (gleaner_measure::compare::round_order): over n rounds (2n for odd n) each variant runs in
    each place and after each other variant equally often."""
    first = [(j + 1) // 2 if j % 2 else (n - j // 2) % n for j in range(n)]
    row = [(v + r) % n for v in first]
    return row[::-1] if n % 2 and (r // n) % 2 else row


def measure(out, wall_s):
    """(p50 us, p99 us) from the last BenchDoc in `out` with a latency (one line, or pretty
    printed), else (us per item, None) from its throughput, else (wall s, None); and which."""
    dec = json.JSONDecoder()
    starts = [i for i in range(len(out)) if out[i] == "{" and (i == 0 or out[i - 1] == "\n")]
    for i in reversed(starts):
        try:
            doc, _ = dec.raw_decode(out, i)
        except json.JSONDecodeError:
            continue
        run = doc.get("runs", [{}])[0] if isinstance(doc, dict) else {}
        if run.get("latency"):
            return run["latency"]["p50_ns"] / 1e3, run["latency"]["p99_ns"] / 1e3, "latency"
        if run.get("throughput"):
            return 1e6 / run["throughput"], None, "us/item"
    return wall_s, None, "wall s"


def run_haltpoll(cmd):
    """Runs `cmd` with the guest haltpoll knobs at upstream defaults; puts them back."""
    if not os.path.isdir(HALTPOLL):
        sys.exit(f"ab: variant @haltpoll needs the haltpoll cpuidle driver ({HALTPOLL} is missing)")
    saved = {k: open(os.path.join(HALTPOLL, k)).read().strip() for k in HALTPOLL_UPSTREAM}
    try:
        for k, v in HALTPOLL_UPSTREAM.items():
            with open(os.path.join(HALTPOLL, k), "w") as f:
                f.write(v)
        return subprocess.run(cmd, capture_output=True, text=True)
    finally:
        for k, v in saved.items():
            with open(os.path.join(HALTPOLL, k), "w") as f:
                f.write(v)


def steal_ms():
    """The host's time taken from this VM so far, all CPUs (ms; /proc/stat `cpu` line, USER_HZ)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) * 1000.0 / os.sysconf("SC_CLK_TCK")


def parse_variant(s):
    name, sep, prefix = s.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"variant {s!r}: expected NAME=PREFIX (PREFIX may be empty or @haltpoll)")
    return name, prefix.split()


def median_interval(ratios, draws=4000):
    """95% bootstrap interval of the median of the per-round ratios (a fixed seed, so a summary
    printed again is the same), as `gleaner compare` gives for its per-round ratios: an
    interval that holds 1 says the rounds cannot tell the two variants apart."""
    rng = random.Random(1)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]


def fmt(v):
    s = sorted(v)
    return f"{statistics.median(s):8.2f} [{s[0]:.2f}..{s[-1]:.2f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", type=parse_variant, required=True,
                    help="NAME=PREFIX, at least two; the first is the reference")
    ap.add_argument("--rounds", type=int, default=9, help="rounds (default 9)")
    ap.add_argument("--steal-ms", type=float, default=1.0,
                    help="a run with at least this much steal (ms) is left out of the steal-free medians (default 1)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the workload command")
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    names = [n for n, _ in a.variant]
    if not cmd or a.rounds < 1 or len(a.variant) < 2 or len(set(names)) != len(names):
        ap.error("give --rounds >= 1, two or more variants with distinct names, and a command after --")
    variants = dict(a.variant)
    res = {k: [] for k in variants}
    steal = {k: [] for k in variants}
    for r in range(a.rounds):
        order = [names[i] for i in round_order(len(names), r)]
        for k in order:
            pre = variants[k]
            s0 = steal_ms()
            t0 = time.monotonic()
            p = run_haltpoll(cmd) if pre == ["@haltpoll"] else subprocess.run(pre + cmd, capture_output=True, text=True)
            wall = time.monotonic() - t0
            steal[k].append(steal_ms() - s0)
            if p.returncode != 0:
                sys.exit(f"ab: {' '.join(pre + cmd)} exited {p.returncode}: {p.stderr[-300:]}")
            res[k].append(measure(p.stdout, wall))
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(
            f"{k} {v[-1][0]:.2f}" + (f"/{v[-1][1]:.1f}" if v[-1][1] is not None else "")
            + (f" [steal {steal[k][-1]:.0f} ms]" if steal[k][-1] > 0 else "") for k, v in res.items()), flush=True)
    print()
    ref = names[0]
    latency = res[ref][0][1] is not None
    for k, v in res.items():
        line = f"{k:16} "
        # A throughput is shown as us per item, so that every column is "lower is better".
        cols = [("p50", 0), ("p99", 1)] if latency else [(res[ref][0][2], 0)]
        for label, i in cols:
            xs = [x[i] for x in v]
            line += f"{label} {fmt(xs)}  "
            if k != ref:
                ratios = [b[i] / x[i] for b, x in zip(res[ref], v)]
                gm = math.exp(sum(math.log(q) for q in ratios) / len(ratios))
                lo, hi = median_interval(ratios)
                above = sum(q > 1 for q in ratios)
                line += (f"({ref}/{k} per round: median {statistics.median(ratios):.3f} (95% {lo:.3f}..{hi:.3f}), "
                         f"geomean {gm:.3f}, above 1 in {above} of {len(ratios)})  ")
        clean = [x[1 if latency else 0] for x, st in zip(v, steal[k]) if st < a.steal_ms]
        if clean:
            line += f"steal-free {cols[-1][0]} {statistics.median(clean):.2f} ({len(clean)} of {len(v)})"
        else:
            line += f"steal-free: none of {len(v)}"
        print(line.rstrip())


if __name__ == "__main__":
    main()
