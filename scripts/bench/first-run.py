#!/usr/bin/env python3
"""What a fresh VM's first `gleaner run` costs a short program: rotated rounds of CMD alone
(stock), under `gleaner run` with no calibration record (a new, empty --run-dir each round: a
fresh boot, as far as the agent can tell) and under `gleaner run` with a valid record (one
--run-dir kept over the rounds, calibrated once before them).

The metric is CMD's finish time: from starting the variant to CMD's exit, read from a marker
CMD's shell writes when it ends (`date +%s%N`), so that what `gleaner run` does after its
workload (measuring this VM's wake costs for the next runs, once per boot) is reported apart,
as `exit`: the time until `gleaner run` itself returned.

    sudo scripts/bench/first-run.py --rounds 5 --gleaner target/release/gleaner -- sleep 1
    sudo scripts/bench/first-run.py --rounds 5 -- sysbench cpu --threads=2 --events=4000 --time=0 run

Summary per variant: median finish [min..max] in seconds, and the median over rounds of the
per-round ratio to stock with its range; `--json FILE` writes every round.
"""

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab import round_order  # noqa: E402  (the Williams design `gleaner compare` uses)

VARIANTS = ["stock", "fresh", "cached"]


def run_once(variant, cmd, gleaner, cached_dir):
    """(finish s, exit s) of one run of `cmd` under `variant`."""
    with tempfile.TemporaryDirectory(prefix="gleaner-first-run-") as tmp:
        marker = os.path.join(tmp, "end")
        inner = f"{shlex.join(cmd)}; s=$?; date +%s%N > {shlex.quote(marker)}; exit $s"
        argv = ["sh", "-c", inner]
        if variant == "fresh":
            run_dir = os.path.join(tmp, "run")
            os.mkdir(run_dir, 0o700)
            argv = [gleaner, "run", "--run-dir", run_dir, "--"] + argv
        elif variant == "cached":
            argv = [gleaner, "run", "--run-dir", cached_dir, "--"] + argv
        t0 = time.time_ns()
        p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
        t1 = time.time_ns()
        if p.returncode != 0:
            sys.exit(f"first-run.py: {variant}: {shlex.join(argv)} exited {p.returncode}: {p.stderr.strip()[-400:]}")
        with open(marker, encoding="ascii") as f:
            end = int(f.read().strip())
        return (end - t0) / 1e9, (t1 - t0) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gleaner", default=os.environ.get("GLEANER", "target/release/gleaner"))
    ap.add_argument("--json", help="write every round here")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("CMD: give the program to run after --")
    if a.rounds < 1:
        ap.error(f"--rounds {a.rounds}: at least 1")
    if os.geteuid() != 0:
        sys.exit("first-run.py: run as root (gleaner run manages a cpuset and the idle knobs)")
    cached_dir = tempfile.mkdtemp(prefix="gleaner-first-run-cached-")
    rounds = []
    try:
        subprocess.run([a.gleaner, "calibrate", "--run-dir", cached_dir], stdout=subprocess.DEVNULL, check=True)
        for r in range(a.rounds):
            row = {}
            for v in [VARIANTS[i] for i in round_order(len(VARIANTS), r)]:
                finish, exit_s = run_once(v, cmd, a.gleaner, cached_dir)
                row[v] = {"finish_s": finish, "exit_s": exit_s}
            rounds.append(row)
            print(f"round {r + 1}: " + ", ".join(f"{v} {row[v]['finish_s']:.3f} s (exit {row[v]['exit_s']:.3f})" for v in VARIANTS),
                  file=sys.stderr)
    finally:
        shutil.rmtree(cached_dir, ignore_errors=True)
    print(f"CMD: {shlex.join(cmd)}; {a.rounds} rounds")
    for v in VARIANTS:
        fin = [r[v]["finish_s"] for r in rounds]
        ex = [r[v]["exit_s"] for r in rounds]
        line = f"  {v:<7} finish {statistics.median(fin):.3f} s [{min(fin):.3f}..{max(fin):.3f}], exit {statistics.median(ex):.3f} s"
        if v != "stock":
            ratios = [r[v]["finish_s"] / r["stock"]["finish_s"] for r in rounds]
            line += f"; finish / stock {statistics.median(ratios):.3f} [{min(ratios):.3f}..{max(ratios):.3f}]"
        print(line)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"cmd": cmd, "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()
