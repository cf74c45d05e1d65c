#!/bin/sh
# The agent end to end on an 8-vCPU guest (issue: the agent on any VM): the built-in kernels with
# 8 threads, stock and under `gleaner run`, alternated; per run the wall time, the agent's own
# process's CPU (the events file's exit record; its yielding threads' apart) and per vCPU, the sets of active vCPUs consolidation used
# and how many per-vCPU plans were applied; then every knob and cpuset compared with before.
# Runs inside a lab guest (docs/lab.md):
#   cp target/release/gleaner scripts/lab/eight-vcpus.sh /tmp/g8/ && \
#   gleaner lab exec --vcpus 8 --memory-mib 1024 --timeout-s 1500 -- sh /tmp/g8/eight-vcpus.sh
# ROUNDS (default 3) and KERNELS (default "pipeline barrier condvar mutex") from the environment.
set -u
G="${GLEANER:-$(dirname "$0")/gleaner}"
ROUNDS="${ROUNDS:-3}"
KERNELS="${KERNELS:-pipeline barrier condvar mutex}"
ARGS="${ARGS:---quick}"
EV=/tmp/eight-vcpus-events.jsonl

snapshot() {
  for c in /sys/devices/system/cpu/cpu[0-9]*; do
    echo "$(basename "$c") resume_latency=$(cat "$c/power/pm_qos_resume_latency_us" 2>/dev/null)"
  done
  for p in /sys/module/haltpoll/parameters/*; do [ -e "$p" ] && echo "$(basename "$p")=$(cat "$p")"; done
  for f in /sys/fs/cgroup/cpuset.cpus.effective /sys/fs/cgroup/cpuset/cpuset.cpus; do [ -e "$f" ] && echo "$f=$(cat "$f")"; done
  find /sys/fs/cgroup -maxdepth 3 -name 'gleaner*' 2>/dev/null | sed 's/^/cgroup left: /'
  for t in /proc/[0-9]*/task/[0-9]*; do grep -s '^Cpus_allowed_list' "$t/status" | awk -v t="$t" '{print t, $2}'; done | awk '{print $2}' | sort -u | sed 's/^/affinity: /'
}

echo "guest: $(nproc) vCPUs, kernel $(uname -r), cpuidle $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none)"
snapshot > /tmp/before
"$G" calibrate 2>&1 | sed -n '1,3p'
for r in $(seq 1 "$ROUNDS"); do
  for k in $KERNELS; do
    for mode in stock gleaner; do
      # Alternate which mode runs first, round by round.
      [ $((r % 2)) -eq 0 ] && { [ "$mode" = stock ] && mode=gleaner || mode=stock; }
      rm -f "$EV"
      t0=$(date +%s%N)
      if [ "$mode" = stock ]; then
        "$G" bench workload "$k" --threads ${THREADS:-8} $ARGS > /dev/null 2>&1
      else
        GLEANER_LOG=info "$G" run --events "$EV" -- "$G" bench workload "$k" --threads ${THREADS:-8} $ARGS > /dev/null 2>/tmp/agent.err
      fi
      rc=$?
      t1=$(date +%s%N)
      wall=$(( (t1 - t0) / 1000000 ))
      if [ "$mode" = gleaner ] && [ -s "$EV" ]; then
        # The agent process's CPU (its yielding threads included) and, apart, what the agent's
        # "done:" line counts for its yielding threads.
        yield_ms=$(sed -n 's/.*yielders \([0-9]*\) ms CPU.*/\1/p' /tmp/agent.err | tail -1)
        summary=$(awk -v n="$(nproc)" -v y="${yield_ms:-0}" '
          /"event":"exit"/ { if (match($0, /"agent_cpu_ns":[0-9]+/)) cpu = substr($0, RSTART + 15, RLENGTH - 15) }
          { if (match($0, /"active_cpus":"[^"]*"/)) sets[substr($0, RSTART + 15, RLENGTH - 16)] = 1 }
          /"plan":\{/ { plans++ }
          END { s = ""; for (k in sets) s = s (s == "" ? "" : " ") k;
                printf "agent_cpu_ms=%.0f per_vcpu_ms=%.1f yielders_ms=%d active_sets=[%s] plans=%d", cpu / 1e6, cpu / (n * 1e6), y, s, plans }' "$EV")
      else
        summary=""
      fi
      echo "round=$r kernel=$k mode=$mode rc=$rc wall_ms=$wall $summary"
      [ "$rc" -ne 0 ] && [ "$mode" = gleaner ] && sed 's/^/  agent: /' /tmp/agent.err | tail -5
    done
  done
done
snapshot > /tmp/after
if diff /tmp/before /tmp/after > /tmp/diff; then
  echo "RESTORED: every resume-latency knob, haltpoll parameter, cpuset and thread affinity as before; no gleaner cgroup left"
else
  echo "NOT RESTORED:"; cat /tmp/diff
fi
