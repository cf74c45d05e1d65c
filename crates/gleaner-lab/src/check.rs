//! `gleaner lab check`: preflight with instructions for whatever is missing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Serialize;

use gleaner_qemu::kernel as cache;
use gleaner_qemu::{accel, guest, Accel, GuestError};

#[derive(Debug, Clone, Serialize)]
pub struct Item {
    pub name: String,
    pub ok: bool,
    /// Required for `lab run` (false: informational).
    pub required: bool,
    pub detail: String,
    /// What to do when not ok.
    pub fix: Option<String>,
}

fn item(name: &str, ok: bool, required: bool, detail: String, fix: Option<&str>) -> Item {
    Item { name: name.into(), ok, required, detail, fix: (!ok).then(|| fix.map(str::to_string)).flatten() }
}

fn tool(cmd: &str, arg: &str) -> Option<String> {
    let o = Command::new(cmd).arg(arg).output().ok()?;
    let text = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    Some(text.lines().next().unwrap_or("").to_string())
}

/// Runs every check; `fetch` fetches the kernel when the cache has none; `boot` probes
/// acceleration by booting guests.
pub fn run_checks(cache_dir: &Path, fetch: bool, boot: bool, gleaner: Option<&Path>) -> Vec<Item> {
    let mut items = Vec::new();
    let bb = check_tools(&mut items);
    let kernel = check_kernel(&mut items, cache_dir, fetch);
    let kvm = Path::new("/dev/kvm").exists();
    if boot {
        if let (Ok(k), Ok(b)) = (&kernel, &bb) {
            probe_boots(&mut items, k, b, kvm);
        }
    }
    if !kvm {
        items.push(item(
            "kvm",
            false,
            false,
            "/dev/kvm missing: TCG will be used".into(),
            Some("modprobe kvm_intel or kvm_amd on a host with hardware virtualization"),
        ));
    }
    check_host(&mut items, gleaner);
    items
}

/// The host tools: QEMU, a static busybox, apt-get and dpkg-deb; returns busybox's path.
fn check_tools(items: &mut Vec<Item>) -> Result<PathBuf, GuestError> {
    let q = tool("qemu-system-x86_64", "--version");
    items.push(item(
        "qemu",
        q.is_some(),
        true,
        q.unwrap_or_else(|| "qemu-system-x86_64 not found".into()),
        Some("apt-get install qemu-system-x86"),
    ));
    let bb = guest::find_busybox();
    items.push(item(
        "busybox",
        bb.is_ok(),
        true,
        bb.as_ref().map_or_else(|e| e.to_string(), |p| format!("{} (static)", p.display())),
        Some("apt-get install busybox-static"),
    ));
    let apt = tool("apt-get", "--version").is_some() && tool("dpkg-deb", "--version").is_some();
    items.push(item(
        "apt",
        apt,
        false,
        if apt { "apt-get and dpkg-deb present (for fetch-kernel)".into() } else { "apt-get/dpkg-deb missing".into() },
        Some("a Debian or Ubuntu host is needed to fetch the guest kernel"),
    ));
    bb
}

/// The cached guest kernel (fetched first when `fetch` and the cache has none); returns it.
fn check_kernel(items: &mut Vec<Item>, cache_dir: &Path, fetch: bool) -> Result<cache::Kernel, cache::CacheError> {
    let mut kernel = cache::find_kernel(cache_dir, None);
    if kernel.is_err() && fetch {
        kernel = cache::fetch_kernel(cache_dir, None, &mut |s| eprintln!("lab: {s}"));
    }
    items.push(item(
        "kernel",
        kernel.is_ok(),
        true,
        match &kernel {
            Ok(k) => format!(
                "{} ({}), {} in {}",
                k.meta.version,
                k.meta.package_version,
                if k.meta.vmlinux { "vmlinux" } else { "vmlinuz" },
                k.dir.display()
            ),
            Err(e) => e.to_string(),
        },
        Some("gleaner lab fetch-kernel   (or: gleaner lab check --fetch; needs `apt-get update` done)"),
    ));
    kernel
}

/// Boots a guest under TCG, and under KVM when `/dev/kvm` exists, to see what accelerates.
fn probe_boots(items: &mut Vec<Item>, k: &cache::Kernel, b: &Path, kvm: bool) {
    match accel::probe(Accel::Tcg, k, b, Duration::from_secs(60)) {
        Ok(p) => items.push(item(
            "tcg",
            p.boot_s.is_some(),
            true,
            p.boot_s.map_or(p.detail.clone(), |s| format!("boots to init in {s:.1} s")),
            Some("see the console lines above; is the kernel cache complete?"),
        )),
        Err(e) => items.push(item("tcg", false, true, e.to_string(), None)),
    }
    if kvm {
        match accel::probe(Accel::Kvm, k, b, Duration::from_secs(accel::KVM_PROBE_S)) {
            Ok(p) => items.push(item(
                "kvm",
                p.boot_s.is_some(),
                false,
                p.boot_s.map_or(format!("/dev/kvm exists but a guest did not boot: {} (TCG will be used)", p.detail), |s| {
                    format!("boots to init in {s:.1} s (KVM will be used)")
                }),
                Some("no hardware virtualization reachable (nested without VMX/SVM?): TCG is used"),
            )),
            Err(e) => items.push(item("kvm", false, false, e.to_string(), None)),
        }
    }
}

/// The host's cgroups, memory and font, and the gleaner binary shared into the guests.
fn check_host(items: &mut Vec<Item>, gleaner: Option<&Path>) {
    let (cpuset, detail) = match gleaner_os::cgroup::Cgroups::detect() {
        Ok(c) => (true, format!("cpuset on cgroup v{} at {}", c.layout().version(), c.root().display())),
        Err(e) => (false, format!("{e:#}")),
    };
    items.push(item(
        "host cgroups",
        cpuset,
        false,
        format!("{detail} (guests mount their own cgroup2 with cpuset)"),
        Some("only needed for host-side pinning experiments"),
    ));
    let mem = gleaner_os::procfs::Procfs::new().mem_available_kib().ok().flatten().map(|kib| kib / 1024);
    items.push(item(
        "memory",
        mem.is_some_and(|m| m >= 1536),
        true,
        mem.map_or("unknown".into(), |m| format!("{m} MiB available (two 512 MiB guests need ~1.5 GiB)")),
        Some("free memory or lower memory_mib in the experiment"),
    ));
    let font = std::env::var_os("GLEANER_FONT")
        .map_or_else(|| "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf".into(), |v| v.to_string_lossy().into_owned());
    items.push(item("font", Path::new(&font).is_file(), false, font.clone(), Some("apt-get install fonts-dejavu-core (report plots)")));
    if let Some(g) = gleaner {
        let share = if guest::visible_in_guest(g) { "" } else { " (under a guest tmpfs: its directory is shared into the guests)" };
        items.push(item(
            "gleaner",
            g.is_file() && guest::shareable(g),
            true,
            format!("{}{share}", g.display()),
            Some("cargo build --release, or pass --gleaner PATH (not under /dev, /proc, /sys)"),
        ));
    }
}
