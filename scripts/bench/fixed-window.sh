#!/bin/bash
# Runs "$@" with the haltpoll knobs as the agent sets a fixed kernel polling window
# (guest_halt_poll_ns = grow_start = WINDOW_NS, default 131072; allow_shrink N), and puts the
# three knobs back when it exits. ADAPTIVE=1 sets the cap alone and leaves the kernel's adaptive
# rules (grow_start, allow_shrink) as they are. Root; the haltpoll cpuidle driver. For ab.py:
#   scripts/bench/ab.py --variant haltpoll=@haltpoll --variant fixed=scripts/bench/fixed-window.sh ... -- CMD
set -euo pipefail
P=/sys/module/haltpoll/parameters
W=${WINDOW_NS:-131072}
declare -A old
for k in guest_halt_poll_ns guest_halt_poll_grow_start guest_halt_poll_allow_shrink; do old[$k]=$(cat $P/$k); done
restore() { for k in "${!old[@]}"; do echo "${old[$k]}" > $P/$k; done; }
trap restore EXIT
if [ "${ADAPTIVE:-0}" = 1 ]; then
  echo $W > $P/guest_halt_poll_ns
else
  echo $W > $P/guest_halt_poll_grow_start; echo $W > $P/guest_halt_poll_ns; echo N > $P/guest_halt_poll_allow_shrink
fi
"$@"
