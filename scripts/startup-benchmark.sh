#!/usr/bin/env bash
# Start-up cost of the guest agent with a valid calibration record (issue 13), against stock in
# the same run: paired runs in rotating order, medians, min..max and ratios.
#
# Usage: scripts/startup-benchmark.sh        (as root; builds the release binary first)
#   RUNS=N        rounds (default 11; each round runs every column once)
#   OPS=N         stress-ng --cpu 2 --cpu-ops N for the CPU-bound row (default 6000, ~3 s here)
#   ITEMS=N       gleaner bench workload matmul --threads 2 --items N (default 60000, ~3 s here)
#   BASELINE=BIN  adds another gleaner binary as a third column (e.g. one built before the
#                 calibration cache, which measures at every start)
#
# The agents use a private temp run dir (their calibration record included), removed at exit:
# nothing is left in /run/gleaner. The machine may be shared and noisy: read the ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
g=$PWD/target/release/gleaner
run_dir=$(mktemp -d /tmp/gleaner-startup-XXXXXX)
trap 'rm -rf "$run_dir"' EXIT
echo "# git $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u), $(nproc) CPUs, kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
"$g" calibrate --run-dir "$run_dir" | sed -n 1p
python3 - "$g" "$run_dir" "${RUNS:-11}" "${OPS:-6000}" "${ITEMS:-60000}" "${BASELINE:-}" <<'PY'
import resource, statistics, subprocess, sys, time

g, run_dir, runs, ops, items, baseline = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
agent = lambda binary: [binary, "run", "--run-dir", run_dir, "--"]
columns = [("stock", []), ("gleaner run", agent(g))]
if baseline:
    columns.append(("baseline run", agent(baseline)))
benchmarks = [
    ("true", ["true"]),
    (f"stress-ng --cpu 2 --cpu-ops {ops}", ["stress-ng", "--cpu", "2", "--cpu-ops", ops, "--cpu-method", "matrixprod", "-q"]),
    (f"matmul --threads 2 --items {items}", [g, "bench", "workload", "matmul", "--threads", "2", "--items", items, "--json"]),
]

def run(argv):
    """Wall time, and CPU time (user + sys) of the whole process tree, the agent included."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(argv)}: {p.stderr.decode().strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu

def fmt(v):
    return f"{v * 1e3:.1f} ms" if v < 1 else f"{v:.3f} s"

print(f"{runs} rounds; each round runs every column once, the order rotating round by round.")
print("ratio: gleaner median / stock median; pair ratio: median of the per-round ratios (same round, same load).")
print("cpu: user + sys of the whole process tree (the agent included); it does not grow when others take the CPU.")
print(f"{'workload':34}{'':6}" + "".join(f"{name + ' median [min..max]':>34}" for name, _ in columns) + f"{'ratio':>8}{'pair ratio':>12}")
for name, argv in benchmarks:
    samples = {c: [] for c, _ in columns}
    for r in range(runs):
        order = columns[r % len(columns):] + columns[:r % len(columns)]
        for c, prefix in order:
            samples[c].append(run(prefix + argv))
    for k, metric in enumerate(["wall", "cpu"]):
        row = f"{name if k == 0 else '':34}{metric:6}"
        for c, _ in columns:
            v = [x[k] for x in samples[c]]
            row += f"{fmt(statistics.median(v)) + ' [' + fmt(min(v)) + '..' + fmt(max(v)) + ']':>34}"
        gl = [x[k] for x in samples["gleaner run"]]
        st = [x[k] for x in samples["stock"]]
        ratio = statistics.median(gl) / statistics.median(st)
        pair = statistics.median(a / b for a, b in zip(gl, st)) if all(st) else float("nan")
        row += f"{ratio:>7.3f}x{pair:>11.3f}x"
        print(row, flush=True)
    if name == "true":
        gl = [x[0] for x in samples["gleaner run"]]
        st = [x[0] for x in samples["stock"]]
        print(f"{'':40}gleaner run overhead: {1e3 * (statistics.median(gl) - statistics.median(st)):.1f} ms wall (median minus median)")
PY
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
