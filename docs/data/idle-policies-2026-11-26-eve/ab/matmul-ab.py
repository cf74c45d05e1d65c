import json, subprocess, statistics, sys
G = sys.argv[1]; rounds = int(sys.argv[2])
variants = {"gleaner": [G, "run", "--"], "no-trace": [G, "run", "--no-trace", "--"], "stock": []}
cmd = ["/work/main/target/release/gleaner", "bench", "workload", "matmul", "--json"]
res = {k: [] for k in variants}
for r in range(rounds):
    order = list(variants)[r % 3:] + list(variants)[:r % 3]
    for k in order:
        out = subprocess.run(variants[k] + cmd, capture_output=True, text=True).stdout
        d = json.loads(out[out.index("{"):])
        res[k].append(15000 / (d["runs"][0]["wall_ns"] / 1e9))
for k, v in res.items():
    v2 = sorted(v)
    print(k, "median", statistics.median(v2), "range", v2[0], v2[-1])
print("ratio gleaner/stock", statistics.median(res["gleaner"]) / statistics.median(res["stock"]),
      "no-trace/stock", statistics.median(res["no-trace"]) / statistics.median(res["stock"]))
