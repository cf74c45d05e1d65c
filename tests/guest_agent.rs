//! The agent inside a real guest: `gleaner lab exec` boots a QEMU guest (TCG on these
//! machines) with 8 vCPUs, Debian's 6.1 kernel and its own cgroup2 hierarchy, and runs this
//! very binary there (the lab shares its directory into the guest). It checks what no test on
//! the host can: the agent on more than 2 vCPUs, on cgroup v2, on a kernel before 6.2 (which
//! does not keep a thread's requested affinity across a cpuset move), and that the guest is
//! left as it was found. Needs root, QEMU and the lab's guest kernel (fetched if missing, as
//! `scripts/test.sh --install-only` does); fails naming what is missing.

mod common;

use std::collections::BTreeMap;

use common::*;
use serial_test::serial;

/// The guest's half: `KEY value` lines the test reads back. `@G@` is this binary.
const SCRIPT: &str = r#"
set -u
G=@G@
snap() {
  for c in /sys/devices/system/cpu/cpu[0-9]*; do echo "$(basename "$c") $(cat "$c/power/pm_qos_resume_latency_us" 2>/dev/null)"; done
  cat /sys/fs/cgroup/cpuset.cpus.effective 2>/dev/null
  find /sys/fs/cgroup -name 'gleaner*' 2>/dev/null
}
# The workload's bench process (its command line starts with this binary): its threads' masks.
bench_pid() { pgrep -f "^$G bench workload pingpong --duration-ms $1" | head -1; }
# Waits (at most 20 s) until that process runs with a thread pinned (its client and server).
wait_pinned() {
  i=0
  while [ $i -lt 100 ]; do
    p=$(bench_pid "$1")
    [ -n "$p" ] && grep -qs "^Cpus_allowed_list:[[:space:]]*$2\$" /proc/$p/task/*/status && return
    sleep 0.2; i=$((i + 1))
  done
}
masks() {
  p=$(bench_pid "$1")
  [ -n "$p" ] || { echo "$2 none"; return; }
  for t in /proc/$p/task/*; do echo "$2 $(awk '/^Cpus_allowed_list/ {print $2}' "$t/status")"; done
  echo "$2_cgroup $(cat /proc/$p/cgroup)"
}
echo "vcpus $(nproc)"
echo "kernel $(uname -r)"
echo "cgroup $(stat -fc %T /sys/fs/cgroup)"
snap > /tmp/before
$G calibrate > /dev/null 2>&1; echo "calibrate_rc $?"

# Eight threads on eight vCPUs, managed end to end.
$G run --events /tmp/ev -- $G bench workload barrier --threads 8 --quick > /dev/null 2> /tmp/err
echo "barrier_rc $?"
echo "periods $(grep -c '"event":"period"' /tmp/ev)"
echo "active_sets $(grep -o '"active_cpus":"[^"]*"' /tmp/ev | sort -u | cut -d'"' -f4 | tr '\n' ' ')"

# A program that pins its threads (client to vCPU 2, server to 5) keeps them pinned while managed.
# Without retention: the subject is the pins and the restore, not the idle policy (what that
# does on this guest, whose 8 vCPUs share 2 host CPUs, is docs/lab.md's "Eight vCPUs").
# The workloads run until stopped here: a slow guest must not see them end before their masks
# are read. SIGTERM to the agent stops its workload (the run's status is then 128 + 15).
$G run --no-retention -- $G bench workload pingpong --duration-ms 60000 --client-cpu 2 --server-cpu 5 > /dev/null 2>&1 &
agent=$!
wait_pinned 60000 5
sleep 2
masks 60000 managed
kill -TERM "$agent"; wait "$agent"; echo "pinned_rc $?"

# The agent killed with -9 in the middle: its guardian moves the workload back; its pins stay.
$G run --no-retention -- $G bench workload pingpong --duration-ms 59999 --client-cpu 1 --server-cpu 6 > /dev/null 2>&1 &
agent=$!
wait_pinned 59999 6
sleep 2
kill -9 "$agent"
p=$(bench_pid 59999)
i=0
while [ -n "$p" ] && [ $i -lt 100 ] && [ "$(cat /proc/$p/cgroup 2>/dev/null)" != "0::/" ]; do sleep 0.2; i=$((i + 1)); done
masks 59999 after_kill
[ -n "$p" ] && kill "$p"
while [ -n "$p" ] && kill -0 "$p" 2>/dev/null; do sleep 0.2; done

snap > /tmp/after
if diff /tmp/before /tmp/after > /tmp/diff; then echo "restored yes"; else echo "restored no: $(tr '\n' ';' < /tmp/diff)"; fi
echo "end"
"#;

#[test]
#[serial(host)]
fn the_agent_on_an_8_vcpu_guest_with_cgroup_v2_and_linux_6_1_keeps_pins_and_leaves_no_trace() {
    require_root_and_cpuset();
    let bin = env!("CARGO_BIN_EXE_gleaner");
    let script = SCRIPT.replace("@G@", bin);
    let out = gleaner()
        .args(["lab", "exec", "--vcpus", "8", "--memory-mib", "1024", "--timeout-s", "900", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "lab exec failed (it needs QEMU and the lab's guest kernel: `gleaner lab check`): {stderr}\n{stdout}");
    let mut lines: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for l in stdout.lines() {
        let (k, v) = l.split_once(' ').unwrap_or((l, ""));
        lines.entry(k).or_default().push(v.trim());
    }
    let one = |k: &str| lines.get(k).and_then(|v| v.first().copied()).unwrap_or_else(|| panic!("no `{k}` line: {stdout}\n{stderr}"));
    assert!(lines.contains_key("end"), "the guest script did not finish: {stdout}\n{stderr}");
    assert_eq!(one("vcpus"), "8", "{stdout}");
    assert!(one("kernel").starts_with("6.1."), "the lab's guest kernel is Debian 12's 6.1: {stdout}");
    assert_eq!(one("cgroup"), "cgroup2fs", "{stdout}");
    assert_eq!(one("calibrate_rc"), "0", "{stdout}");
    assert_eq!(one("barrier_rc"), "0", "{stdout}");
    assert!(one("periods").parse::<u64>().unwrap() >= 1, "{stdout}");
    eprintln!("active vCPU sets over the run: {}", one("active_sets"));
    // The pinned threads keep their own vCPU while managed and after the agent is killed.
    for (key, pins) in [("managed", ["2", "5"]), ("after_kill", ["1", "6"])] {
        let masks = lines.get(key).cloned().unwrap_or_default();
        for pin in pins {
            assert!(masks.contains(&pin), "{key}: no thread pinned to vCPU {pin}: {masks:?}\n{stdout}");
        }
    }
    assert_eq!(one("pinned_rc"), "143", "the managed run ends with the workload stopped by SIGTERM: {stdout}");
    assert_eq!(one("after_kill_cgroup"), "0::/", "the guardian did not move the workload back: {stdout}");
    assert_eq!(one("restored"), "yes", "{stdout}");
}
