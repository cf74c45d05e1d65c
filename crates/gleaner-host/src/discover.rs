//! Finds VMs and their vCPU threads in /proc.
//!
//! | VMM | process | vCPU thread names |
//! |---|---|---|
//! | QEMU | `qemu-system-*`, `qemu-kvm` | `CPU <n>/KVM`, `CPU <n>/TCG` (only with `-name NAME,debug-threads=on`) |
//! | Firecracker | `firecracker` | `fc_vcpu <n>` |
//! | Cloud Hypervisor | `cloud-hypervisor` | `vcpu<n>` |
//!
//! A QEMU started without `debug-threads=on` has unnamed threads: then the `-smp` count of
//! threads with the most CPU time (the main thread excluded) are taken as vCPUs and marked
//! [`Evidence::CpuTime`]; their indexes are guesses (thread creation order).

use std::path::PathBuf;

use gleaner_os::procfs::Procfs;
use gleaner_os::OsError;
use serde::Serialize;

/// The virtual machine monitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Vmm {
    Qemu,
    Firecracker,
    CloudHypervisor,
}

/// How a thread was recognized as a vCPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Evidence {
    /// The VMM named the thread (`CPU 0/KVM`, `fc_vcpu 0`, `vcpu0`).
    ThreadName,
    /// Unnamed threads: among the busiest (guess; use `-name NAME,debug-threads=on`).
    CpuTime,
}

/// A vCPU thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VcpuThread {
    pub index: u32,
    pub tid: i32,
    pub name: String,
    pub evidence: Evidence,
}

/// A running VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Vm {
    pub pid: i32,
    pub name: String,
    pub vmm: Vmm,
    /// `KVM`, `TCG`, or `None` when unknown.
    pub accel: Option<String>,
    pub vcpus: Vec<VcpuThread>,
    /// The VMM's other threads (main loop, I/O threads, workers).
    pub other_threads: Vec<i32>,
    /// QMP socket found on the command line (QEMU).
    pub qmp_socket: Option<PathBuf>,
    /// Remarks for the user (e.g. how to get named vCPU threads).
    pub notes: Vec<String>,
}

fn basename(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

/// Which VMM a process is, from its `comm` and `argv[0]`.
pub fn identify(comm: &str, argv: &[String]) -> Option<Vmm> {
    let exe = argv.first().map(|a| basename(a)).unwrap_or("");
    let is = |p: &str| comm.starts_with(p) || exe.starts_with(p);
    if is("qemu-system") || is("qemu-kvm") {
        Some(Vmm::Qemu)
    } else if comm == "firecracker" || exe == "firecracker" {
        Some(Vmm::Firecracker)
    } else if comm == "cloud-hyperviso" || exe == "cloud-hypervisor" {
        Some(Vmm::CloudHypervisor)
    } else {
        None
    }
}

/// The vCPU index (and accelerator, for QEMU) encoded in a thread name.
pub fn vcpu_from_name(vmm: Vmm, name: &str) -> Option<(u32, Option<&str>)> {
    match vmm {
        Vmm::Qemu => {
            let rest = name.strip_prefix("CPU ")?;
            let (n, accel) = rest.split_once('/')?;
            Some((n.trim().parse().ok()?, Some(accel.trim())))
        }
        Vmm::Firecracker => Some((name.strip_prefix("fc_vcpu")?.trim().parse().ok()?, Some("KVM"))),
        Vmm::CloudHypervisor => Some((name.strip_prefix("vcpu")?.trim().parse().ok()?, Some("KVM"))),
    }
}

/// The value following `flag` (`-name X` or `-name=X`).
fn arg<'a>(argv: &'a [String], flag: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut it = argv.iter().peekable();
    while let Some(a) = it.next() {
        if a == flag {
            if let Some(v) = it.peek() {
                out.push(v.as_str());
            }
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            out.push(v);
        }
    }
    out
}

/// `-name guest=X,debug-threads=on` / `-name X,...` -> X.
fn qemu_name(argv: &[String]) -> Option<String> {
    let v = arg(argv, "-name").into_iter().next()?;
    for part in v.split(',') {
        if let Some(n) = part.strip_prefix("guest=") {
            return Some(n.to_string());
        }
    }
    let first = v.split(',').next()?;
    (!first.contains('=')).then(|| first.to_string())
}

fn qemu_debug_threads(argv: &[String]) -> bool {
    arg(argv, "-name").iter().any(|v| v.split(',').any(|p| p == "debug-threads=on"))
}

/// `-smp 4`, `-smp cpus=4,...` -> 4 (QEMU's default is 1).
fn qemu_smp(argv: &[String]) -> u32 {
    let Some(v) = arg(argv, "-smp").into_iter().next() else { return 1 };
    for part in v.split(',') {
        if let Some(n) = part.strip_prefix("cpus=") {
            return n.parse().unwrap_or(1);
        }
        if let Ok(n) = part.parse() {
            return n;
        }
    }
    1
}

fn qemu_accel(argv: &[String]) -> Option<String> {
    if argv.iter().any(|a| a == "-enable-kvm") {
        return Some("KVM".into());
    }
    if let Some(v) = arg(argv, "-accel").into_iter().next() {
        return Some(v.split(',').next().unwrap_or("").to_uppercase());
    }
    for v in arg(argv, "-machine").into_iter().chain(arg(argv, "-M")) {
        for p in v.split(',') {
            if let Some(a) = p.strip_prefix("accel=") {
                return Some(a.split(':').next().unwrap_or(a).to_uppercase());
            }
        }
    }
    None
}

/// The QMP socket from `-qmp unix:PATH,...` or `-chardev socket,id=I,path=PATH` plus
/// `-mon chardev=I,mode=control`.
pub fn qemu_qmp_socket(argv: &[String]) -> Option<PathBuf> {
    for v in arg(argv, "-qmp") {
        if let Some(rest) = v.strip_prefix("unix:") {
            let p = rest.split(',').next().unwrap_or(rest);
            let p = p.strip_prefix("path=").unwrap_or(p);
            return Some(PathBuf::from(p));
        }
    }
    let mons: Vec<String> = arg(argv, "-mon")
        .into_iter()
        .filter(|m| m.split(',').any(|p| p == "mode=control"))
        .filter_map(|m| m.split(',').find_map(|p| p.strip_prefix("chardev=")).map(str::to_string))
        .collect();
    for c in arg(argv, "-chardev") {
        let parts: Vec<&str> = c.split(',').collect();
        if parts.first() != Some(&"socket") {
            continue;
        }
        let id = parts.iter().find_map(|p| p.strip_prefix("id="));
        let path = parts.iter().find_map(|p| p.strip_prefix("path="));
        if let (Some(id), Some(path)) = (id, path) {
            if mons.iter().any(|m| m == id) {
                return Some(PathBuf::from(path));
            }
        }
    }
    None
}

fn firecracker_name(argv: &[String]) -> Option<String> {
    arg(argv, "--id").into_iter().next().map(str::to_string)
}

/// Looks at one process; `None` if it is not a VMM. Errors only for unexpected failures
/// (a process that vanished is `Ok(None)`).
pub fn inspect(procfs: &Procfs, pid: i32) -> Result<Option<Vm>, OsError> {
    let gone = |e: OsError| if e.is_vanished() { Ok(None) } else { Err(e) };
    let comm = match procfs.comm(pid) {
        Ok(c) => c,
        Err(e) => return gone(e),
    };
    let argv = match procfs.cmdline(pid) {
        Ok(a) => a,
        Err(e) => return gone(e),
    };
    let Some(vmm) = identify(&comm, &argv) else { return Ok(None) };
    let tids = match procfs.tasks(pid) {
        Ok(t) => t,
        Err(e) => return gone(e),
    };
    let mut vcpus = Vec::new();
    let mut other = Vec::new();
    let mut accel = None;
    for &tid in &tids {
        let name = match procfs.task_comm(pid, tid) {
            Ok(n) => n,
            Err(e) if e.is_vanished() => continue,
            Err(e) => return Err(e),
        };
        match vcpu_from_name(vmm, &name) {
            Some((index, a)) => {
                accel = accel.or(a.map(str::to_string));
                vcpus.push(VcpuThread { index, tid, name, evidence: Evidence::ThreadName });
            }
            None => other.push(tid),
        }
    }
    let mut notes = Vec::new();
    let (name, qmp) = match vmm {
        Vmm::Qemu => (qemu_name(&argv), qemu_qmp_socket(&argv)),
        Vmm::Firecracker => (firecracker_name(&argv), None),
        Vmm::CloudHypervisor => (None, None),
    };
    if vmm == Vmm::Qemu {
        accel = accel.or_else(|| qemu_accel(&argv));
        if vcpus.is_empty() {
            // No named threads: the busiest non-main threads, as many as -smp says.
            let n = qemu_smp(&argv) as usize;
            let mut busy: Vec<(u64, i32)> = Vec::new();
            for &tid in tids.iter().filter(|&&t| t != pid) {
                match procfs.task_schedstat(pid, tid) {
                    Ok(s) => busy.push((s.run_ns, tid)),
                    Err(e) if e.is_vanished() => {}
                    Err(e) => return Err(e),
                }
            }
            busy.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            let mut chosen: Vec<i32> = busy.iter().take(n).map(|b| b.1).collect();
            chosen.sort_unstable();
            for (i, tid) in chosen.iter().enumerate() {
                let name = procfs.task_comm(pid, *tid).unwrap_or_default();
                vcpus.push(VcpuThread { index: u32::try_from(i).unwrap_or(u32::MAX), tid: *tid, name, evidence: Evidence::CpuTime });
            }
            other.retain(|t| !chosen.contains(t));
            let hint = if qemu_debug_threads(&argv) { "" } else { " (start QEMU with -name NAME,debug-threads=on)" };
            notes.push(format!("vCPU threads are not named{hint}: the {} busiest threads were taken as vCPUs", vcpus.len()));
        }
    }
    vcpus.sort_by_key(|v| v.index);
    Ok(Some(Vm {
        pid,
        name: name.unwrap_or_else(|| format!("{}-{pid}", comm)),
        vmm,
        accel,
        vcpus,
        other_threads: other,
        qmp_socket: qmp,
        notes,
    }))
}

/// Every VM on the host, by pid.
pub fn discover(procfs: &Procfs) -> Result<Vec<Vm>, OsError> {
    let mut vms = Vec::new();
    for pid in procfs.pids()? {
        if let Some(vm) = inspect(procfs, pid)? {
            vms.push(vm);
        }
    }
    Ok(vms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn write_task(root: &Path, pid: i32, tid: i32, comm: &str, run_ns: u64) {
        let t = root.join(format!("{pid}/task/{tid}"));
        std::fs::create_dir_all(&t).unwrap();
        std::fs::write(t.join("comm"), format!("{comm}\n")).unwrap();
        std::fs::write(t.join("schedstat"), format!("{run_ns} 0 1\n")).unwrap();
    }

    fn write_proc(root: &Path, pid: i32, comm: &str, argv: &[&str]) {
        let p = root.join(pid.to_string());
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
        std::fs::write(p.join("cmdline"), argv.join("\0") + "\0").unwrap();
    }

    #[test]
    fn names_and_args() {
        assert_eq!(identify("qemu-system-x86", &[]), Some(Vmm::Qemu));
        assert_eq!(identify("bash", &s(&["/usr/bin/qemu-kvm"])), Some(Vmm::Qemu));
        assert_eq!(identify("firecracker", &[]), Some(Vmm::Firecracker));
        assert_eq!(identify("cloud-hyperviso", &[]), Some(Vmm::CloudHypervisor));
        assert_eq!(identify("bash", &s(&["bash"])), None);
        assert_eq!(vcpu_from_name(Vmm::Qemu, "CPU 3/KVM"), Some((3, Some("KVM"))));
        assert_eq!(vcpu_from_name(Vmm::Qemu, "CPU 0/TCG"), Some((0, Some("TCG"))));
        assert_eq!(vcpu_from_name(Vmm::Qemu, "CPU x/TCG"), None);
        assert_eq!(vcpu_from_name(Vmm::Qemu, "IO mon_iothread"), None);
        assert_eq!(vcpu_from_name(Vmm::Firecracker, "fc_vcpu 1"), Some((1, Some("KVM"))));
        assert_eq!(vcpu_from_name(Vmm::CloudHypervisor, "vcpu12"), Some((12, Some("KVM"))));
        assert_eq!(vcpu_from_name(Vmm::CloudHypervisor, "vmm"), None);
        let q =
            s(&["qemu", "-name", "guest=web,debug-threads=on", "-smp", "cpus=4,sockets=1", "-qmp", "unix:/tmp/q.sock,server=on,wait=off"]);
        assert_eq!(qemu_name(&q).as_deref(), Some("web"));
        assert!(qemu_debug_threads(&q));
        assert_eq!(qemu_smp(&q), 4);
        assert_eq!(qemu_qmp_socket(&q), Some(PathBuf::from("/tmp/q.sock")));
        let q = s(&[
            "qemu",
            "-name",
            "db",
            "-chardev",
            "socket,id=m0,path=/run/m.sock,server=on",
            "-mon",
            "chardev=m0,mode=control",
            "-accel",
            "tcg",
        ]);
        assert_eq!(qemu_name(&q).as_deref(), Some("db"));
        assert_eq!(qemu_qmp_socket(&q), Some(PathBuf::from("/run/m.sock")));
        assert_eq!(qemu_accel(&q).as_deref(), Some("TCG"));
        assert_eq!(qemu_smp(&q), 1);
        assert_eq!(qemu_qmp_socket(&s(&["qemu"])), None);
    }

    #[test]
    fn discovers_vmms_on_fixture() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        // QEMU with named threads.
        write_proc(r, 100, "qemu-system-x86", &["qemu-system-x86_64", "-name", "a,debug-threads=on", "-smp", "2"]);
        write_task(r, 100, 100, "qemu-system-x86", 5);
        write_task(r, 100, 101, "CPU 0/TCG", 10);
        write_task(r, 100, 102, "CPU 1/TCG", 10);
        write_task(r, 100, 103, "worker", 1);
        // QEMU without names: 2 busiest non-main threads.
        write_proc(r, 200, "qemu-system-x86", &["qemu-system-x86_64", "-smp", "2"]);
        write_task(r, 200, 200, "qemu-system-x86", 999_999);
        write_task(r, 200, 201, "qemu-system-x86", 10);
        write_task(r, 200, 202, "qemu-system-x86", 500);
        write_task(r, 200, 203, "qemu-system-x86", 400);
        // Firecracker and Cloud Hypervisor.
        write_proc(r, 300, "firecracker", &["firecracker", "--id", "fc1"]);
        write_task(r, 300, 300, "firecracker", 1);
        write_task(r, 300, 301, "fc_vcpu 0", 1);
        write_proc(r, 400, "cloud-hyperviso", &["cloud-hypervisor"]);
        write_task(r, 400, 400, "cloud-hyperviso", 1);
        write_task(r, 400, 402, "vcpu1", 1);
        write_task(r, 400, 401, "vcpu0", 1);
        // Not a VM.
        write_proc(r, 500, "bash", &["bash"]);
        write_task(r, 500, 500, "bash", 1);
        let vms = discover(&Procfs::with_root(r)).unwrap();
        assert_eq!(vms.len(), 4, "{vms:#?}");
        let a = &vms[0];
        assert_eq!((a.name.as_str(), a.accel.as_deref(), a.vmm), ("a", Some("TCG"), Vmm::Qemu));
        assert_eq!(a.vcpus.iter().map(|v| v.tid).collect::<Vec<_>>(), vec![101, 102]);
        assert_eq!(a.other_threads, vec![100, 103]);
        assert!(a.notes.is_empty());
        let b = &vms[1];
        assert_eq!(b.vcpus.iter().map(|v| (v.index, v.tid)).collect::<Vec<_>>(), vec![(0, 202), (1, 203)]);
        assert!(b.vcpus.iter().all(|v| v.evidence == Evidence::CpuTime));
        assert!(b.notes[0].contains("debug-threads=on"), "{:?}", b.notes);
        assert_eq!(b.name, "qemu-system-x86-200");
        assert_eq!((vms[2].name.as_str(), vms[2].vcpus.len()), ("fc1", 1));
        assert_eq!(vms[3].vcpus.iter().map(|v| v.index).collect::<Vec<_>>(), vec![0, 1]);
        // An empty /proc has no VMs.
        let e = tempfile::tempdir().unwrap();
        assert!(discover(&Procfs::with_root(e.path())).unwrap().is_empty());
    }
}
