#!/usr/bin/env python3
"""Renders README's result tables from the documents under docs/data/current and writes them
between their markers in README.md (`<!-- table:NAME -->` ... `<!-- /table:NAME -->`), so the
README says only what a committed document says. scripts/bench/readme-tables.sh makes the
documents again and then runs this.

    scripts/bench/readme-tables.py            # rewrite README.md's tables
    scripts/bench/readme-tables.py --check    # exit 1 if README.md differs from what the documents give

Tables:
  front    docs/data/current/front/*.json (scripts/bench/front.py --json), machine.json: per row
           each peer's headline figure and CPU, gleaner's per-round ratio to the best peer at
           no more CPU and to the best peer outright, and whether it is on the front
  held-out the same from docs/data/current/held-out (scripts/bench/held-out/held-out.sh), with
           gleaner over its control (front.py --control) where the series ran one
  held-out-2 the same from docs/data/current/held-out-2 (held-out.sh's second set of programs)
  first-run docs/data/current/first-run.txt (`gleaner compare` with no arguments, its stdout),
           as a code block
"""

import json
import os
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CURRENT = os.path.join(ROOT, "docs", "data", "current")
PEERS = ["stock", "haltpoll", "haltpoll:2400us", "poll", "naive", "gleaner"]
UNITS = {"p50_us": "p50 us", "p99_us": "p99 us", "mean_us": "mean us", "usecs_per_op": "us/op",
         "seconds": "s", "latency_ms": "ms", "us_per_item": "us/item", "wall_s": "wall s"}


def front_table(sub):
    d = os.path.join(CURRENT, sub)
    if not os.path.isdir(d):
        return None
    machine = json.load(open(os.path.join(d, "machine.json"))) if os.path.exists(os.path.join(d, "machine.json")) else {}
    rows = []
    for name in sorted(f[:-5] for f in os.listdir(d) if f.endswith(".json") and f != "machine.json"):
        doc = json.load(open(os.path.join(d, name + ".json")))
        s = doc["summary"]
        rows.append((name, s))
    out = []
    if machine:
        out.append(f"Machine: {machine.get('cpu', '?')}, {machine.get('vcpus', '?')} vCPUs, Linux {machine.get('kernel', '?')}, "
                   f"cpuidle {machine.get('cpuidle', '?')}; gleaner {machine.get('git', '?')}; {machine.get('date', '?')}; "
                   f"{machine.get('rounds', '?')} rounds per row.")
        out.append("")
    control = any("control" in s.get("peers", {}) for _, s in rows)
    out.append("| row (metric) | " + " | ".join(PEERS) + " | gleaner / best at no more CPU | gleaner / best outright |"
               + (" gleaner / control |" if control else "") + " on the front |")
    out.append("|---|" + "---|" * (len(PEERS) + 3 + control))
    for name, s in rows:
        peers = s["peers"]
        for m in s.get("metrics", [s["metric"]]):
            cells = []
            for p in PEERS:
                r = peers.get(p)
                cells.append("-" if r is None or m not in r else f"{r[m]:.3g} @{r['vcpus']:.2f}")
            others = [(p, r) for p, r in peers.items() if p not in ("gleaner", "control") and f"{m}_ratio" in r]
            # gleaner / peer per round: above 1 the peer did better.
            cheaper = [(p, r) for p, r in others if r["cpu_ratio"] >= 0.98]
            worst = lambda rs: max(rs, key=lambda pr: pr[1][f"{m}_ratio"]) if rs else None
            fmt = lambda pr: "-" if pr is None else f"{pr[1][f'{m}_ratio']:.3f} ({pr[1][f'{m}_ratio_ci'][0]:.2f}..{pr[1][f'{m}_ratio_ci'][1]:.2f}) {pr[0]}"
            dom = s.get("dominated_by", {})
            dom = dom.get(m, []) if isinstance(dom, dict) else dom
            verdict = "yes" if not dom else "no: " + ", ".join(dom)
            noise = ""
            if control:
                c = s.get("control", {}).get(m)
                noise = " - |" if c is None else f" {c['ratio']:.3f} ({c['ci'][0]:.2f}..{c['ci'][1]:.2f}) |"
            out.append(f"| {name} ({UNITS.get(m, m)}) | " + " | ".join(cells) + f" | {fmt(worst(cheaper))} | {fmt(worst(others))} |"
                       + noise + f" {verdict} |")
    return "\n".join(out)


def first_run():
    p = os.path.join(CURRENT, "first-run.txt")
    if not os.path.exists(p):
        return None
    return "```\n" + open(p).read().rstrip("\n") + "\n```"


TABLES = {
    "front": lambda: front_table("front"),
    "held-out": lambda: front_table("held-out"),
    "held-out-2": lambda: front_table("held-out-2"),
    "first-run": first_run,
}


def render(readme):
    for name, make in TABLES.items():
        start, end = f"<!-- table:{name} -->", f"<!-- /table:{name} -->"
        if start not in readme:
            continue
        table = make()
        if table is None:
            continue
        a = readme.index(start) + len(start)
        b = readme.index(end)
        readme = readme[:a] + "\n" + table + "\n" + readme[b:]
    return readme


def main():
    path = os.path.join(ROOT, "README.md")
    old = open(path).read()
    new = render(old)
    if "--check" in sys.argv[1:]:
        if new != old:
            sys.exit("README.md's tables differ from docs/data/current: run scripts/bench/readme-tables.py")
        return
    if new != old:
        open(path, "w").write(new)


if __name__ == "__main__":
    main()
