import subprocess, statistics, time, sys
rounds = int(sys.argv[1])
G = "/work/main/target/release/gleaner"
cmd = ["sysbench", "threads", "--threads=8", "--time=0", "--events=20000", "run"]
variants = {"stock": [], "gleaner": [G, "run", "--"], "no-trace": [G, "run", "--no-trace", "--"]}
res = {k: [] for k in variants}
for r in range(rounds):
    ks = list(variants); ks = ks[r % 3:] + ks[:r % 3]
    for k in ks:
        t0 = time.monotonic()
        subprocess.run(variants[k] + cmd, capture_output=True, check=True)
        res[k].append(time.monotonic() - t0)
    print(r + 1, {k: round(v[-1], 2) for k, v in res.items()}, flush=True)
for k, v in res.items():
    print(k, "median %.3f" % statistics.median(v), "range %.2f..%.2f" % (min(v), max(v)), "ratio stock/x %.3f" % (statistics.median(res['stock'])/statistics.median(v)))
