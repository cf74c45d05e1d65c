#!/usr/bin/env python3
"""Summarizes the `gleaner compare --json` documents of a directory (scripts/bench/idle-policies.sh):
per workload and policy the medians [min..max] of latency p50 and p99 (latency workloads) or
throughput / wall time, the CPU taken (busy + kernel polling, vCPUs), and gleaner's ratio to
the best of the other policies (latency: gleaner / best, <= 1.05 is the target; throughput:
gleaner / stock, >= 0.98), both as ratios of medians and, where the document has rounds, as
medians of each round's ratio with their 95% interval (the worst against any other policy).
Latency workloads also get each policy's steal time (the host ran something else on a vCPU:
/proc/stat, in 10 ms ticks): how many runs had any, and the median p99 of the runs that had
none, since the host's preemptions make p99 bimodal here."""

import json
import os
import sys


def med(s):
    return s["p50"] if s else None


def fmt(s, d=1):
    return "-" if not s else f"{s['p50']:.{d}f} [{s['min']:.{d}f}..{s['max']:.{d}f}]"


def steal(d, policy):
    runs = [x for x in d.get("samples", []) if x.get("mode") == policy and x.get("latency")]
    if not runs:
        return ""
    stolen = [x for x in runs if x.get("steal_ns")]
    calm = sorted(x["latency"]["p99_ns"] / 1e3 for x in runs if not x.get("steal_ns"))
    calm_p99 = f", p99 without {calm[(len(calm) - 1) // 2]:.1f} us ({len(calm)} runs)" if calm else ""
    return f"  steal in {len(stolen)}/{len(runs)} runs{calm_p99}"


def main():
    out = sys.argv[1]
    for name in sorted(os.listdir(out)):
        if not name.endswith(".json"):
            continue
        try:
            d = json.load(open(os.path.join(out, name)))
        except ValueError:
            print(f"\n{name[:-5]}: not a complete document (still running, or the compare failed)")
            continue
        sums = {s["policy"]: s for s in d["summaries"]}
        print(f"\n{name[:-5]}: {' '.join(d['command'])}  ({d['runs']} runs each)")
        lat = any(s.get("latency_p50_us") for s in sums.values())
        for p, s in sums.items():
            cpu = f"{s['total_vcpus']['p50']:.2f} ({s['poll_vcpus']['p50']:.2f} polling)"
            if lat:
                print(f"  {p:9} p50 {fmt(s['latency_p50_us']):>24} us  p99 {fmt(s['latency_p99_us']):>28} us  CPU {cpu}{steal(d, p)}")
            elif s.get("throughput"):
                print(f"  {p:9} {fmt(s['throughput'], 0):>30} items/s  wall {fmt(s['wall_s'], 3):>24} s  CPU {cpu}")
            else:
                print(f"  {p:9} wall {fmt(s['wall_s'], 3):>24} s  CPU {cpu}")
        g = sums.get("gleaner")
        if not g:
            continue
        others = [s for p, s in sums.items() if p != "gleaner"]
        # Round by round (`per_round`, oriented "above 1: gleaner did better"): each round's
        # ratio is of two runs seconds apart, so a slow stretch longer than a round cancels.
        rounds = {r["against"]: r for r in d.get("per_round", []) if r["policy"] == "gleaner"}
        if lat:
            for key in ("latency_p50_us", "latency_p99_us"):
                best = min(others, key=lambda s: med(s[key]))
                line = f"  gleaner {key[8:11]} / best ({best['policy']}): {med(g[key]) / med(best[key]):.2f}"
                paired = [(1 / r[key[:11]]["p50"], a, r[key[:11]].get("median_ci95")) for a, r in rounds.items() if r.get(key[:11])]
                if paired:
                    worst, against, ci = max(paired, key=lambda x: x[0])
                    line += f";  per round, worst of {len(paired)}: {worst:.2f} against {against}"
                    if ci:
                        line += f" (95% {1 / ci['hi']:.2f}..{1 / ci['lo']:.2f})"
                print(line)
        elif "stock" in sums:
            st = sums["stock"]
            if g.get("throughput") and st.get("throughput"):
                print(f"  gleaner / stock throughput: {med(g['throughput']) / med(st['throughput']):.3f}")
            print(f"  gleaner / stock speed (wall): {med(st['wall_s']) / med(g['wall_s']):.3f}")
            r = rounds.get("stock")
            if r:
                key = "throughput" if r.get("throughput") else "speedup"
                ci = r[key].get("median_ci95")
                ci = f", 95% {ci['lo']:.3f}..{ci['hi']:.3f}" if ci else ""
                print(f"  gleaner / stock {key}, per round: {r[key]['p50']:.3f} [{r[key]['min']:.3f}..{r[key]['max']:.3f}] ({r['rounds']} rounds{ci})")


if __name__ == "__main__":
    main()
