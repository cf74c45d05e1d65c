#!/usr/bin/env python3
"""Is `gleaner run` on the latency-vs-CPU front? One program under every idle policy a tenant
could pick, as a tenant would run it (each peer a separate process tree, gleaner as the
`gleaner run` binary, so its start-up and exit count), in rotated rounds; per round the
program's figure and the CPU the whole VM took.

Peers (--peers, comma-separated; default every one this machine offers):
  stock            the machine as found
  haltpoll         the kernel's guest haltpoll at its upstream defaults (cap 200 us, grow 2
                   from 50 us, shrink 2)
  haltpoll:CAP     the same with another cap, e.g. haltpoll:2400us (a vendor's latency tuning)
  poll             every vCPU's PM QoS resume latency "n/a": the POLL state only (idle=poll)
  naive            a never-sleeping SCHED_IDLE sched_yield() thread per vCPU
  gleaner          `$GLEANER run --` with no flags (GLEANER: default target/release/gleaner)
  NAME=PREFIX      any other prefix, e.g. 'old=/tmp/gleaner-base run --'
Every knob a peer turns is put back after its run, and each vCPU's own haltpoll window is reset
(the cpuidle governor switched away and back), so no run inherits another's windows. While a
peer's knobs are turned, the values found are recorded in /run/gleaner-front/knobs.json: a
series killed outright (SIGKILL; SIGTERM and SIGHUP put them back themselves) leaves the record,
and the next run, or `front.py --restore` alone, puts them back from it (scripts/test.sh does so
before the test suite).

The figure: the latency of a `gleaner bench workload --json` document (p50, p99, mean), the
usecs/op of `perf bench sched pipe`, the seconds of `perf bench sched messaging` and hackbench,
the average latency of pgbench, the wall seconds of the command otherwise; lower is better.
CPU: busy time of every vCPU (/proc/stat, steal excluded) plus the time they polled in the
POLL state (cpuidle state0, which /proc/stat counts idle), vCPU-seconds over the run.

Per peer: the median over rounds of gleaner's figure over the peer's in the same round, with a
95% bootstrap interval, and the same for CPU; a latency document is judged by its p50, p99 and
mean each. gleaner is *dominated* by a peer whose figure is better beyond noise (the interval
of gleaner/peer above 1) at no more CPU (the CPU ratio's median at least 0.98). --json FILE
writes every run and the summary.

Each interval holds at 95% for its own comparison, but a series makes many (five peers, up to
three figures each), and these VMs drift for minutes at a time: a series of 6 rounds calls
gleaner "dominated" by a variant of itself that changes nothing about once in every few
programs. --control runs gleaner a second time each round, as the peer `control`, and measures
that noise: gleaner/control, median and interval, per figure. With it, a peer dominates only if
gleaner/peer's median is also above the control's interval (worse by more than gleaner differs
from itself), and a series whose control is itself "beyond chance" says so.

    sudo scripts/bench/front.py --rounds 6 -- perf bench sched pipe -l 200000
"""

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time

HALTPOLL = "/sys/module/haltpoll/parameters"
UPSTREAM = {"guest_halt_poll_ns": "200000", "guest_halt_poll_grow": "2", "guest_halt_poll_grow_start": "50000",
            "guest_halt_poll_shrink": "2", "guest_halt_poll_allow_shrink": "Y"}
CPU_DIR = "/sys/devices/system/cpu"
GOVERNOR = CPU_DIR + "/cpuidle/current_governor"
YIELDER = ("import os,sys\n"
           "c=int(sys.argv[1]); os.sched_setaffinity(0,{c}); os.sched_setscheduler(0,os.SCHED_IDLE,os.sched_param(0))\n"
           "y=os.sched_yield\n"
           "while True: y()\n")


def cpus():
    with open(CPU_DIR + "/online") as f:
        out = []
        for part in f.read().strip().split(","):
            a, _, b = part.partition("-")
            out += range(int(a), int(b or a) + 1)
        return out


def read(path):
    with open(path) as f:
        return f.read().strip()


def write(path, value):
    with open(path, "w") as f:
        f.write(value)


def poll_state(cpu):
    d = f"{CPU_DIR}/cpu{cpu}/cpuidle/state0"
    return d if os.path.isdir(d) and read(d + "/name") == "POLL" else None


def cpu_now():
    """(busy ns, polled ns) of every vCPU so far."""
    tick = 1e9 / os.sysconf("SC_CLK_TCK")
    busy = 0.0
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                v = [int(x) for x in line.split()[1:]]
                # user nice system idle iowait irq softirq steal (guest counted in user)
                busy += (v[0] + v[1] + v[2] + v[5] + v[6]) * tick
    polled = 0
    for c in cpus():
        s = poll_state(c)
        if s:
            polled += int(read(s + "/time")) * 1000
    return busy, polled


def figure(out, wall):
    """{name: value} of the run, lower is better; the first key is the headline."""
    dec = json.JSONDecoder()
    for i in reversed([i for i in range(len(out)) if out[i] == "{" and (i == 0 or out[i - 1] == "\n")]):
        try:
            doc, _ = dec.raw_decode(out, i)
        except json.JSONDecodeError:
            continue
        run = doc.get("runs", [{}])[0] if isinstance(doc, dict) else {}
        lat = run.get("latency")
        if lat:
            return {"p50_us": lat["p50_ns"] / 1e3, "p99_us": lat["p99_ns"] / 1e3,
                    "mean_us": lat.get("mean_ns", lat["p50_ns"]) / 1e3, "wall_s": wall}
        if run.get("throughput"):
            return {"us_per_item": 1e6 / run["throughput"], "wall_s": wall}
    m = re.search(r"([\d.]+) usecs/op", out)
    if m:
        return {"usecs_per_op": float(m.group(1)), "wall_s": wall}
    m = re.search(r"Total time:\s+([\d.]+) \[sec\]", out) or re.search(r"^Time:\s+([\d.]+)", out, re.M)
    if m:
        return {"seconds": float(m.group(1)), "wall_s": wall}
    m = re.search(r"latency average = ([\d.]+) ms", out)
    if m:
        return {"latency_ms": float(m.group(1)), "wall_s": wall}
    return {"wall_s": wall}


RECORD_DIR = "/run/gleaner-front"
RECORD = RECORD_DIR + "/knobs.json"


def drop_record():
    """Removes the record of the knobs found, and its directory."""
    os.remove(RECORD)
    os.rmdir(RECORD_DIR)


def restore_recorded():
    """Puts back the knobs a killed series left turned (its record), and removes the record.
    Returns whether there was one."""
    if not os.path.exists(RECORD):
        return False
    with open(RECORD) as f:
        found = json.load(f)
    for path, value in found.items():
        if os.path.exists(path):
            write(path, value)
    drop_record()
    print(f"front: put back {len(found)} idle knobs a killed series left turned ({RECORD})", file=sys.stderr)
    return True


class Knobs:
    """What the peers turn, recorded once and put back after every run."""

    def __init__(self):
        restore_recorded()
        self.haltpoll = {k: read(f"{HALTPOLL}/{k}") for k in UPSTREAM} if os.path.isdir(HALTPOLL) else None
        self.qos = {c: read(f"{CPU_DIR}/cpu{c}/power/pm_qos_resume_latency_us") for c in cpus()
                    if os.path.exists(f"{CPU_DIR}/cpu{c}/power/pm_qos_resume_latency_us")}
        self.governor = read(GOVERNOR) if os.path.exists(GOVERNOR) else None

    def record(self):
        """Writes the values found before a peer turns a knob (restore_recorded reads them)."""
        found = {f"{HALTPOLL}/{k}": v for k, v in (self.haltpoll or {}).items()}
        found.update({f"{CPU_DIR}/cpu{c}/power/pm_qos_resume_latency_us": v for c, v in self.qos.items()})
        os.makedirs(RECORD_DIR, exist_ok=True)
        with open(RECORD + ".tmp", "w") as f:
            json.dump(found, f)
        os.replace(RECORD + ".tmp", RECORD)

    def haltpoll_cap(self, cap_ns):
        if self.haltpoll is None:
            sys.exit("front: haltpoll peers need the haltpoll cpuidle driver (no " + HALTPOLL + ")")
        self.record()
        for k, v in UPSTREAM.items():
            write(f"{HALTPOLL}/{k}", str(cap_ns) if k == "guest_halt_poll_ns" else v)

    def poll(self):
        if not self.qos:
            sys.exit("front: the poll peer needs per-CPU pm_qos_resume_latency_us")
        self.record()
        for c in self.qos:
            write(f"{CPU_DIR}/cpu{c}/power/pm_qos_resume_latency_us", "n/a")

    def restore(self):
        if self.haltpoll:
            for k, v in self.haltpoll.items():
                write(f"{HALTPOLL}/{k}", v)
        for c, v in self.qos.items():
            write(f"{CPU_DIR}/cpu{c}/power/pm_qos_resume_latency_us", v)
        if self.governor == "haltpoll":
            other = next(g for g in ("menu", "ladder", "teo") if g in read(CPU_DIR + "/cpuidle/available_governors").split())
            write(GOVERNOR, other)
            write(GOVERNOR, "haltpoll")
        if os.path.exists(RECORD):
            drop_record()


def parse_cap(s):
    m = re.fullmatch(r"(\d+)(ns|us|ms)?", s)
    if not m:
        raise ValueError(s)
    return int(m.group(1)) * {"ns": 1, "us": 1000, "ms": 1000000, None: 1000}[m.group(2)]


def run_peer(peer, prefix, cmd, knobs):
    yielders = []
    try:
        if peer == "haltpoll":
            knobs.haltpoll_cap(200000)
        elif peer.startswith("haltpoll:"):
            knobs.haltpoll_cap(parse_cap(peer.split(":", 1)[1]))
        elif peer == "poll":
            knobs.poll()
        elif peer == "naive":
            yielders = [subprocess.Popen([sys.executable, "-c", YIELDER, str(c)]) for c in cpus()]
            time.sleep(0.05)
        b0, p0 = cpu_now()
        t0 = time.monotonic()
        # A program may write bytes that are not UTF-8 (a compressor to stdout): kept, replaced.
        p = subprocess.run(prefix + cmd, capture_output=True, text=True, errors="replace")
        wall = time.monotonic() - t0
        b1, p1 = cpu_now()
    finally:
        for y in yielders:
            y.send_signal(signal.SIGKILL)
            y.wait()
        knobs.restore()
    if p.returncode != 0:
        sys.exit(f"front: {' '.join(prefix + cmd)} exited {p.returncode} under {peer}: {p.stderr[-400:]}")
    f = figure(p.stdout, wall)
    f["cpu_s"] = (b1 - b0 + p1 - p0) / 1e9
    f["vcpus"] = f["cpu_s"] / wall
    return f


def round_order(n, r):
    first = [(j + 1) // 2 if j % 2 else (n - j // 2) % n for j in range(n)]
    row = [(v + r) % n for v in first]
    return row[::-1] if n % 2 and (r // n) % 2 else row


def median_interval(xs, draws=4000):
    rng = random.Random(1)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(draws))
    return statistics.median(xs), meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", default=None, help="comma-separated peers (default: stock,haltpoll,haltpoll:2400us,poll,naive,gleaner)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json", metavar="FILE", help="write every run and the summary to FILE")
    ap.add_argument("--metric", help="the figure to judge by (default: the first the program gives)")
    ap.add_argument("--control", action="store_true",
                    help="run gleaner twice a round (the second as the peer `control`): the noise a peer's gap must exceed")
    ap.add_argument("--restore", action="store_true",
                    help="only put back the knobs a killed series left turned (its record), then exit")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if a.restore:
        if not restore_recorded():
            print("front: no knobs left turned", file=sys.stderr)
        return
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd or a.rounds < 1:
        ap.error("give --rounds >= 1 and a command after --")
    gleaner = os.environ.get("GLEANER", os.path.join(os.path.dirname(__file__), "../../target/release/gleaner"))
    names = (a.peers or "stock,haltpoll,haltpoll:2400us,poll,naive,gleaner").split(",")
    prefixes = {}
    for n in names:
        name, sep, pre = n.partition("=")
        prefixes[name] = pre.split() if sep else ([gleaner, "run", "--"] if name == "gleaner" else [])
    if "gleaner" not in prefixes:
        ap.error("--peers must include gleaner (the one judged)")
    if a.control:
        if "control" in prefixes:
            ap.error("--control adds the peer `control`: --peers must not name one")
        prefixes["control"] = prefixes["gleaner"]
    peers = list(prefixes)
    knobs = Knobs()
    # A peer's knobs go back in run_peer's `finally`: a SIGTERM or SIGHUP (a session or a
    # `timeout` ending the script) must unwind through it too, not end Python where it stands
    # (the poll peer's "n/a" resume latency outlived a killed series and made every later idle
    # measurement on the machine poll).
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda n, _f: sys.exit(f"front: ended by signal {n}, knobs put back"))
    runs = {p: [] for p in peers}
    for r in range(a.rounds):
        for i in round_order(len(peers), r):
            p = peers[i]
            runs[p].append(run_peer(p, prefixes[p], cmd, knobs))
        head = a.metric or next(iter(runs["gleaner"][-1]))
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(
            f"{p} {runs[p][-1][head]:.3f} @{runs[p][-1]['cpu_s']:.2f}s" for p in peers), flush=True)
    head = a.metric or next(iter(runs["gleaner"][0]))
    metrics = [head] + [m for m in ("p99_us", "mean_us") if m != head and m in runs["gleaner"][0]]
    summary = {"command": cmd, "metric": head, "metrics": metrics, "rounds": a.rounds, "peers": {}, "dominated_by": {}}
    # The control's interval per figure: how far gleaner/gleaner strays in this series.
    noise = {}
    if a.control:
        for m in metrics:
            noise[m] = median_interval([g[m] / x[m] for g, x in zip(runs["gleaner"], runs["control"]) if x[m] > 0])
        summary["control"] = {m: {"ratio": r, "ci": [lo, hi]} for m, (r, lo, hi) in noise.items()}
    print(f"\n{' '.join(cmd)}: {', '.join(metrics)} (lower is better), CPU vCPU-s per run; per round gleaner/peer, median (95%)")
    for p in peers:
        cs = [x["cpu_s"] for x in runs[p]]
        row = {"cpu_s": statistics.median(cs), "vcpus": statistics.median(x["vcpus"] for x in runs[p])}
        line = f"  {p:18}"
        for m in metrics:
            row[m] = statistics.median(x[m] for x in runs[p])
            line += f" {m} {row[m]:9.3f}"
        line += f"  CPU {row['cpu_s']:7.3f} s ({row['vcpus']:.2f} vCPUs)"
        if p != "gleaner":
            # A run shorter than a tick can read no CPU at all (/proc/stat counts in ticks).
            cm, clo, chi = median_interval([g["cpu_s"] / x["cpu_s"] for g, x in zip(runs["gleaner"], runs[p]) if x["cpu_s"] > 0] or [1.0])
            row.update(cpu_ratio=cm, cpu_ratio_ci=[clo, chi])
            line += f"  CPU {cm:.2f} ({clo:.2f}..{chi:.2f})"
            for m in metrics:
                r, lo, hi = median_interval([g[m] / x[m] for g, x in zip(runs["gleaner"], runs[p]) if x[m] > 0])
                row[f"{m}_ratio"] = r
                row[f"{m}_ratio_ci"] = [lo, hi]
                # Dominated: the peer better beyond chance (the interval of gleaner/peer above 1)
                # at no more CPU (the CPU ratio's median at least 0.98).
                # With a control, also worse by more than gleaner differs from itself.
                dominated = lo > 1.0 and cm >= 0.98 and p != "control" and (m not in noise or r > noise[m][2])
                if dominated:
                    summary["dominated_by"].setdefault(m, []).append(p)
                line += f"  {m} {r:.3f} ({lo:.3f}..{hi:.3f})" + (" DOMINATED" if dominated else "")
        summary["peers"][p] = row
        print(line)
    for m, (r, lo, hi) in noise.items():
        if lo > 1.0 or hi < 1.0:
            print(f"{m}: gleaner/control {r:.3f} ({lo:.3f}..{hi:.3f}) is beyond chance: this series drifted more than its intervals allow")
    if not summary["dominated_by"]:
        print("on the front")
    for m, ps in summary["dominated_by"].items():
        print(f"{m}: dominated by {', '.join(ps)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": summary, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
