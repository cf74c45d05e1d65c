#!/bin/sh
# Inside a TCG guest: the workload alone vs under an agent that only samples, at three periods;
# prints wall (from the bench JSON) and the agent's own CPU (its exit event).
# Run it with an absolute path: gleaner lab exec --accel tcg -- "$PWD/scripts/lab/presence.sh"
# W is the balanced pipeline of a `gleaner lab run uc` on this machine (its results.json
# `guest_args`); put your own run's there.
G=${GLEANER:-$(dirname "$0")/../../target/release/gleaner}
W="bench workload pipeline --json --items 8000 --iters-per-us 6438.512 --work-us 61.4"
wall() { sed -n 's/.*"wall_ns": *\([0-9]*\).*/\1/p' | head -1; }
$G calibrate --json >/dev/null 2>&1
for i in 1 2 3 4 5; do
  echo "stock $($G $W 2>/dev/null | wall)"
  for p in 200 50 1000; do
    rm -f /tmp/ev
    w=$($G run --no-retention --no-consolidation --period-ms $p --events /tmp/ev -- $G $W 2>/dev/null | wall)
    c=$(sed -n 's/.*"event":"exit".*"agent_cpu_ns":\([0-9]*\).*/\1/p' /tmp/ev)
    n=$(grep -c '"period"' /tmp/ev)
    echo "period$p $w agent_cpu_ns=$c periods=$n"
  done
done
