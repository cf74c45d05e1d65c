import json, subprocess, statistics, sys
P = "/sys/module/haltpoll/parameters/"
names = ["guest_halt_poll_allow_shrink", "guest_halt_poll_grow", "guest_halt_poll_grow_start", "guest_halt_poll_ns", "guest_halt_poll_shrink"]
orig = {n: open(P + n).read().strip() for n in names}
def setk(d):
    for n, v in d.items():
        open(P + n, "w").write(str(v))
G = "/work/main/target/release/gleaner"
agents = {
    "agent": [G, "run", "--no-trace", "--no-consolidation", "--"],
    "agent1s": [G, "run", "--no-trace", "--no-consolidation", "--period-ms", "1000", "--"],
}
variants = {
    "agent": {}, "agent1s": {},
    "upstream": {"guest_halt_poll_ns": 200000, "guest_halt_poll_grow_start": 50000, "guest_halt_poll_allow_shrink": "Y"},
    "fixed131k": {"guest_halt_poll_ns": 131072, "guest_halt_poll_grow_start": 131072, "guest_halt_poll_allow_shrink": "N"},
}
cmd = sys.argv[2:]
rounds = int(sys.argv[1])
res = {k: [] for k in variants}
try:
    for r in range(rounds):
        ks = list(variants)
        ks = ks[r % len(ks):] + ks[:r % len(ks)]
        for k in ks:
            setk(orig); setk(variants[k])
            out = subprocess.run(agents.get(k, []) + cmd, capture_output=True, text=True).stdout
            d = json.loads(out[out.index("{"):])
            l = d["runs"][0]["latency"]
            res[k].append((l["p50_ns"] / 1e3, l["p99_ns"] / 1e3))
        print(f"round {r+1}: " + ", ".join(f"{k} {v[-1][0]:.1f}/{v[-1][1]:.1f}" for k, v in res.items()), flush=True)
finally:
    setk(orig)
for k, v in res.items():
    p50 = sorted(x[0] for x in v); p99 = sorted(x[1] for x in v)
    print(f"{k:10} p50 {statistics.median(p50):6.1f} [{p50[0]:.1f}..{p50[-1]:.1f}]  p99 {statistics.median(p99):6.1f} [{p99[0]:.1f}..{p99[-1]:.1f}]")
