#!/usr/bin/env bash
# The Gleaner agent's benchmarks (issue 3), each against stock in the same run.
# Usage: scripts/agent-benchmarks.sh [OUT_DIR]   (as root; builds the release binary first)
# Writes one JSON file per benchmark into OUT_DIR (default: results/agent-<date>) and prints
# the tables. Takes about 6 minutes on a 2-vCPU VM.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/agent-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
cargo build --release -q
g=$PWD/target/release/gleaner
runs=${RUNS:-5}
echo "# git $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u), $(nproc) CPUs, kernel $(uname -r)" | tee "$out/README"

echo "## wakeup latency: settings B and C stock, C under the agent"
# Retention forced with a timeout longer than the benchmark's 1 ms gap: shows the mechanism.
$g bench wakeup --setting B --setting C --rounds 2000 --json > "$out/wakeup-stock.json"
$g run --no-consolidation --timeout-us 1500 -- $g bench wakeup --setting C --rounds 2000 --json > "$out/wakeup-retention.json"
$g run -- $g bench wakeup --setting C --rounds 2000 --json > "$out/wakeup-gleaner.json"
python3 - "$out" <<'PY'
import json, sys, os
d = sys.argv[1]
def load(name):
    j = json.load(open(os.path.join(d, name)))
    rs = j["settings"]
    return {r["setting"]: r for r in rs}
s, r, g = load("wakeup-stock.json"), load("wakeup-retention.json"), load("wakeup-gleaner.json")
print(f"{'':28} {'p50 us':>8} {'mean us':>8} {'p99 us':>8}")
for name, x in [("B stock (yielder)", s["B"]), ("C stock (idle vCPU)", s["C"]), ("C, retention 1.5 ms forced", r["C"]), ("C under run", g["C"])]:
    print(f"{name:28} {x['p50_us']:8.1f} {x['mean_us']:8.1f} {x['p99_us']:8.1f}")
print(f"C with retention forced / B stock (p50): {r['C']['p50_us']/s['B']['p50_us']:.2f}")
PY

for w in pipeline barrier condvar matmul; do
  echo "## $w: stock vs gleaner ($runs runs each)"
  $g compare --runs "$runs" -- $g bench workload $w --json | tee "$out/compare-$w.txt"
done
echo "## the host-polling check: retention forced with the timeout calibration would pick"
for w in pipeline barrier; do
  $g compare --runs "$runs" --timeout-us 30 -- $g bench workload $w --json | tee "$out/compare-$w-retention-forced.txt"
done
echo "## pipeline: each mechanism alone"
$g compare --runs "$runs" --no-consolidation --timeout-us 30 -- $g bench workload pipeline --json | tee "$out/compare-pipeline-retention.txt"
$g compare --runs "$runs" --no-retention -- $g bench workload pipeline --json | tee "$out/compare-pipeline-consolidation.txt"
echo "## agent cost with an idle workload (sleep 5)"
$g compare --runs 3 -- sleep 5 | tee "$out/compare-idle.txt"
