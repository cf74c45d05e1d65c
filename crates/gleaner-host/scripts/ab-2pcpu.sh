#!/bin/bash
# A/B on 2 pCPUs: 2 I/O guests + 2 spinning guests (TCG, 1 vCPU each).
# stock (no agent) vs fixed 30 ms slice for all (one pool) vs AQL (paper quanta: pools by type).
# Usage: ab-2pcpu.sh [path/to/gleaner]   (root; qemu-system-x86, busybox-static, a lab kernel:
# `gleaner lab fetch-kernel`). Prints one line per configuration and round.
set -u
G=${1:-gleaner}
K=$(ls -d /var/cache/gleaner-lab/kernels/*/vmlinux | tail -1)
D=$(mktemp -d /tmp/gleaner-host-ab.XXXXXX)
mkdir -p $D/root/bin $D/root/proc $D/root/dev
cp /usr/bin/busybox $D/root/bin/busybox
cat > $D/root/init <<'T'
#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t devtmpfs dev /dev
case "$(/bin/busybox cat /proc/cmdline)" in
  *gl=io*) while :; do echo 0123456789012345678901234567890123456789 > /dev/ttyS0; done ;;
  *gl=cpu*) while :; do :; done ;;
esac
T
chmod +x $D/root/init
(cd $D/root && find . | busybox cpio -o -H newc 2>/dev/null) > $D/init.cpio
I=$D/init.cpio
cat > $D/fixed30.toml <<T
[quanta]
io_int_ns = 30000000
con_spin_ns = 30000000
llcf_ns = 30000000
default_ns = 30000000
T
cat > $D/paper.toml <<T
[quanta]
io_int_ns = 1000000
con_spin_ns = 1000000
llcf_ns = 90000000
default_ns = 30000000
T
PIDS=()
for g in io1 io2 cpu1 cpu2; do
  mode=${g%?}
  qemu-system-x86_64 -name gl-$g,debug-threads=on -machine pc -accel tcg -cpu max -smp 1 -m 128 \
    -display none -nodefaults -no-user-config -kernel $K -initrd $I \
    -append "console=ttyS0 quiet loglevel=0 gl=$mode" -serial file:$D/$g.serial </dev/null >/dev/null 2>&1 &
  PIDS+=($!)
done
trap 'for p in "${PIDS[@]}"; do kill $p 2>/dev/null; done; sleep 1; rm -rf $D' EXIT
# wait (up to 90 s) until both I/O guests write
for i in $(seq 90); do
  [ -s $D/io1.serial ] && [ -s $D/io2.serial ] && break
  sleep 1
done
vcpu_tid() { for t in /proc/$1/task/*; do [ "$(cat $t/comm)" = "CPU 0/TCG" ] && basename $t; done; }
measure() { # $1 = label
  local s0a s0b r0a r0b s1a s1b r1a r1b ta tb
  ta=$(vcpu_tid ${PIDS[2]}); tb=$(vcpu_tid ${PIDS[3]})
  s0a=$(stat -c %s $D/io1.serial); s0b=$(stat -c %s $D/io2.serial)
  r0a=$(cut -d' ' -f1 /proc/${PIDS[2]}/task/$ta/schedstat); r0b=$(cut -d' ' -f1 /proc/${PIDS[3]}/task/$tb/schedstat)
  sleep 8
  s1a=$(stat -c %s $D/io1.serial); s1b=$(stat -c %s $D/io2.serial)
  r1a=$(cut -d' ' -f1 /proc/${PIDS[2]}/task/$ta/schedstat); r1b=$(cut -d' ' -f1 /proc/${PIDS[3]}/task/$tb/schedstat)
  echo "$1 io_bytes_per_s $(( (s1a-s0a)/8 )) $(( (s1b-s0b)/8 )) cpu_guest_ms_per_s $(( (r1a-r0a)/8000000 )) $(( (r1b-r0b)/8000000 ))"
}
for round in 1 2 3; do
  measure stock
  for cfg in fixed30 paper; do
    $G host run --config $D/$cfg.toml --vm gl-io1 --vm gl-io2 --vm gl-cpu1 --vm gl-cpu2 --duration-s 11 \
       --state $D/state.json --json > $D/run-$cfg-$round.json 2>$D/run-$cfg-$round.err &
    AG=$!
    sleep 2.5
    measure $cfg
    wait $AG
    echo "  $cfg plans_applied $(grep -o '"plans_applied": [0-9]*' $D/run-$cfg-$round.json | grep -o '[0-9]*$')"
  done
done
