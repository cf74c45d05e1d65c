#!/usr/bin/env bash
# Start-up cost of the guest agent with a valid calibration record (issue 13), against stock in
# the same run: paired runs in rotating order, medians, min..max and ratios.
#
# Usage: scripts/startup-benchmark.sh        (as root; builds the release binary first)
#   RUNS=N        rounds (default 11; each round runs every column once)
#   OPS=N         stress-ng --cpu 2 --cpu-ops N for the CPU-bound row (default 6000, ~3 s here)
#   ITEMS=N       gleaner bench workload matmul --threads 2 --items N (default 30000, ~3 s here)
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
python3 - "$g" "$run_dir" "${RUNS:-11}" "${OPS:-6000}" "${ITEMS:-30000}" "${BASELINE:-}" <<'PY'
import statistics, subprocess, sys, time

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

def wall(argv):
    t = time.perf_counter()
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(argv)}: {p.stderr.decode().strip()}")
    return dt

def fmt(v):
    return f"{v * 1e3:.1f} ms" if v < 1 else f"{v:.3f} s"

print(f"{runs} rounds; each round runs every column once, the order rotating round by round")
head = f"{'workload':34}" + "".join(f"{name + ' median [min..max]':>34}" for name, _ in columns) + f"{'ratio':>8}{'pair ratio':>12}"
print(head)
for name, argv in benchmarks:
    samples = {c: [] for c, _ in columns}
    for r in range(runs):
        order = columns[r % len(columns):] + columns[:r % len(columns)]
        for c, prefix in order:
            samples[c].append(wall(prefix + argv))
    stock = samples["stock"]
    row = f"{name:34}"
    for c, _ in columns:
        v = samples[c]
        row += f"{fmt(statistics.median(v)) + ' [' + fmt(min(v)) + '..' + fmt(max(v)) + ']':>34}"
    gl = samples["gleaner run"]
    # ratio: median over median; pair ratio: median of the per-round ratios (same round, same load).
    ratio = statistics.median(gl) / statistics.median(stock)
    pair = statistics.median(a / b for a, b in zip(gl, stock))
    row += f"{ratio:>7.3f}x{pair:>11.3f}x"
    print(row, flush=True)
    if name == "true":
        print(f"{'':34}gleaner run overhead: {1e3 * (statistics.median(gl) - statistics.median(stock)):.1f} ms (median minus median)")
PY
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
