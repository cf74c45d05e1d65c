//! Is this a virtual machine, and on which hypervisor?
//!
//! Evidence, strongest first: the CPUID hypervisor vendor leaf (0x40000000, x86_64 only),
//! the `hypervisor` CPU flag in `/proc/cpuinfo`, `/sys/hypervisor/type`, DMI strings.
//! [`detect_with`] takes the CPUID vendor as an argument so the logic is testable.

use serde::Serialize;

use crate::error::Result;
use crate::procfs::Procfs;
use crate::sysfs::Sysfs;

/// What [`detect`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Virtualization {
    /// True when any evidence says this is a guest.
    pub virtualized: bool,
    /// Hypervisor name (`KVM`, `Hyper-V`, `VMware`, `Xen`, `QEMU TCG`, `Firecracker`, ...)
    /// when it could be told.
    pub hypervisor: Option<String>,
    /// One line per piece of evidence, for `diagnose` output.
    pub evidence: Vec<String>,
}

/// Detects virtualization on this machine (CPUID on x86_64, then files).
pub fn detect(procfs: &Procfs, sysfs: &Sysfs) -> Result<Virtualization> {
    detect_with(cpuid_hypervisor_vendor(), procfs, sysfs)
}

/// The CPUID hypervisor vendor string (leaf 0x40000000: EBX, ECX, EDX), when CPUID leaf 1
/// reports a hypervisor (ECX bit 31). `None` on bare metal and on non-x86_64.
pub fn cpuid_hypervisor_vendor() -> Option<String> {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::__cpuid;
        // SAFETY: CPUID is available on every x86_64 CPU; leaf 1 is always valid and leaf
        // 0x40000000 is read only after leaf 1 says a hypervisor is present (hypervisors
        // reserve that range; the instruction itself never faults).
        // (`__cpuid` is a safe fn on newer toolchains, hence the allow.)
        #[allow(unused_unsafe)]
        let (leaf1, leaf) = unsafe { (__cpuid(1), __cpuid(0x4000_0000)) };
        if leaf1.ecx & (1 << 31) == 0 {
            return None;
        }
        let mut bytes = Vec::with_capacity(12);
        for r in [leaf.ebx, leaf.ecx, leaf.edx] {
            bytes.extend_from_slice(&r.to_le_bytes());
        }
        let s: String = String::from_utf8_lossy(&bytes).trim_end_matches('\0').to_string();
        Some(s)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// Maps a CPUID hypervisor vendor signature to a name.
pub fn hypervisor_from_cpuid(vendor: &str) -> Option<&'static str> {
    let v = vendor.trim_end_matches('\0');
    Some(match v {
        "KVMKVMKVM" => "KVM",
        "Microsoft Hv" => "Hyper-V",
        "VMwareVMware" => "VMware",
        "XenVMMXenVMM" => "Xen",
        "TCGTCGTCGTCG" => "QEMU TCG",
        " lrpepyh vr" | "prl hyperv" => "Parallels",
        "VBoxVBoxVBox" => "VirtualBox",
        "bhyve bhyve" => "bhyve",
        "ACRNACRNACRN" => "ACRN",
        "QNXQVMBSQG" => "QNX",
        "Linux KVM Hv" => "KVM (Hyper-V enlightenments)",
        "EVMMEVMMEVMM" => "EVMM",
        _ => return None,
    })
}

/// Maps DMI strings to a hypervisor/cloud name.
fn hypervisor_from_dmi(s: &str) -> Option<&'static str> {
    let l = s.to_ascii_lowercase();
    [
        ("firecracker", "Firecracker"),
        ("qemu", "QEMU"),
        ("kvm", "KVM"),
        ("amazon ec2", "Amazon EC2"),
        ("google", "Google Compute Engine"),
        ("microsoft corporation", "Hyper-V"),
        ("vmware", "VMware"),
        ("innotek", "VirtualBox"),
        ("virtualbox", "VirtualBox"),
        ("xen", "Xen"),
        ("bochs", "Bochs"),
        ("cloud hypervisor", "Cloud Hypervisor"),
        ("parallels", "Parallels"),
    ]
    .into_iter()
    .find(|(k, _)| l.contains(k))
    .map(|(_, v)| v)
}

/// [`detect`] with the CPUID vendor supplied by the caller (tests pass `None` or a string).
/// Missing files count as "no evidence", not as errors.
pub fn detect_with(cpuid_vendor: Option<String>, procfs: &Procfs, sysfs: &Sysfs) -> Result<Virtualization> {
    let mut v = Virtualization::default();
    if let Some(vendor) = cpuid_vendor {
        v.virtualized = true;
        let name = hypervisor_from_cpuid(&vendor);
        v.evidence.push(format!("CPUID 0x40000000 vendor '{vendor}'{}", name.map(|n| format!(" ({n})")).unwrap_or_default()));
        if let Some(n) = name {
            v.hypervisor = Some(n.to_string());
        }
    }
    match procfs.cpuinfo_flags() {
        Ok(flags) if flags.iter().any(|f| f == "hypervisor") => {
            v.virtualized = true;
            v.evidence.push("/proc/cpuinfo has the 'hypervisor' flag".into());
        }
        Ok(_) => {}
        Err(crate::OsError::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if let Some(t) = sysfs.hypervisor_type()? {
        v.virtualized = true;
        v.evidence.push(format!("/sys/hypervisor/type is '{t}'"));
        if v.hypervisor.is_none() {
            v.hypervisor = Some(if t == "xen" { "Xen".to_string() } else { t });
        }
    }
    let dmi = sysfs.dmi()?;
    for (field, val) in [("sys_vendor", &dmi.sys_vendor), ("product_name", &dmi.product_name), ("bios_vendor", &dmi.bios_vendor)] {
        let Some(val) = val else { continue };
        if let Some(name) = hypervisor_from_dmi(val) {
            v.virtualized = true;
            v.evidence.push(format!("DMI {field} '{val}' ({name})"));
            // DMI names the product (Firecracker, EC2) more precisely than CPUID's "KVM".
            match &v.hypervisor {
                None => v.hypervisor = Some(name.to_string()),
                Some(h) if h == "KVM" && name != "KVM" => v.hypervisor = Some(format!("KVM ({name})")),
                _ => {}
            }
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn tree(cpuinfo: Option<&str>, dmi: &[(&str, &str)], hyp: Option<&str>) -> (tempfile::TempDir, Procfs, Sysfs) {
        let d = tempfile::tempdir().unwrap();
        let proc_root = d.path().join("proc");
        let sys_root = d.path().join("sys");
        fs::create_dir_all(&proc_root).unwrap();
        fs::create_dir_all(sys_root.join("class/dmi/id")).unwrap();
        if let Some(c) = cpuinfo {
            fs::write(proc_root.join("cpuinfo"), c).unwrap();
        }
        for (f, v) in dmi {
            fs::write(sys_root.join("class/dmi/id").join(f), format!("{v}\n")).unwrap();
        }
        if let Some(h) = hyp {
            fs::create_dir_all(sys_root.join("hypervisor")).unwrap();
            fs::write(sys_root.join("hypervisor/type"), format!("{h}\n")).unwrap();
        }
        (d, Procfs::with_root(proc_root), Sysfs::with_root(sys_root))
    }

    #[test]
    fn bare_metal_has_no_evidence() {
        let (_d, p, s) = tree(Some("processor\t: 0\nflags\t\t: fpu vme sse2\n"), &[("sys_vendor", "Dell Inc.")], None);
        let v = detect_with(None, &p, &s).unwrap();
        assert!(!v.virtualized);
        assert_eq!(v.hypervisor, None);
        assert!(v.evidence.is_empty());
    }

    #[test]
    fn kvm_cpuid_and_flag() {
        let (_d, p, s) = tree(Some("processor\t: 0\nflags\t\t: fpu hypervisor sse2\n"), &[], None);
        let v = detect_with(Some("KVMKVMKVM".into()), &p, &s).unwrap();
        assert!(v.virtualized);
        assert_eq!(v.hypervisor.as_deref(), Some("KVM"));
        assert_eq!(v.evidence.len(), 2, "{:?}", v.evidence);
    }

    #[test]
    fn dmi_refines_kvm_and_alone_is_enough() {
        let (_d, p, s) = tree(None, &[("sys_vendor", "Amazon EC2"), ("product_name", "m5.large")], None);
        let v = detect_with(Some("KVMKVMKVM".into()), &p, &s).unwrap();
        assert_eq!(v.hypervisor.as_deref(), Some("KVM (Amazon EC2)"));
        let (_d2, p2, s2) = tree(None, &[("product_name", "Standard PC (i440FX + PIIX, 1996)"), ("sys_vendor", "QEMU")], None);
        let v2 = detect_with(None, &p2, &s2).unwrap();
        assert!(v2.virtualized);
        assert_eq!(v2.hypervisor.as_deref(), Some("QEMU"));
    }

    #[test]
    fn xen_from_sys_hypervisor_and_unknown_cpuid_vendor() {
        let (_d, p, s) = tree(None, &[], Some("xen"));
        let v = detect_with(None, &p, &s).unwrap();
        assert_eq!(v.hypervisor.as_deref(), Some("Xen"));
        let v = detect_with(Some("SomethingNew".into()), &p, &s).unwrap();
        assert!(v.virtualized);
        assert!(v.evidence[0].contains("SomethingNew"));
    }

    #[test]
    fn cpuid_vendor_table() {
        assert_eq!(hypervisor_from_cpuid("Microsoft Hv"), Some("Hyper-V"));
        assert_eq!(hypervisor_from_cpuid(" lrpepyh vr"), Some("Parallels"));
        assert_eq!(hypervisor_from_cpuid("TCGTCGTCGTCG"), Some("QEMU TCG"));
        assert_eq!(hypervisor_from_cpuid("GenuineIntel"), None);
    }

    /// The real detector agrees with the raw `hypervisor` CPU flag (the development machines
    /// are Firecracker/KVM guests: there it must report a VM and, on x86_64, CPUID "KVM").
    #[test]
    fn real_detection_agrees_with_cpu_flag() {
        let v = detect(&Procfs::new(), &Sysfs::new()).unwrap();
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap();
        let flag = cpuinfo.lines().any(|l| l.starts_with("flags") && l.split_whitespace().any(|w| w == "hypervisor"));
        if flag {
            assert!(v.virtualized, "{v:?}");
            assert!(v.evidence.iter().any(|e| e.contains("'hypervisor' flag")), "{v:?}");
            #[cfg(target_arch = "x86_64")]
            {
                let vendor = cpuid_hypervisor_vendor().expect("hypervisor flag set but CPUID leaf 1 ECX.31 clear");
                assert_eq!(v.hypervisor.is_some(), hypervisor_from_cpuid(&vendor).is_some() || v.evidence.len() > 2, "{v:?}");
            }
        } else {
            assert_eq!(v.virtualized, !v.evidence.is_empty(), "{v:?}");
        }
    }
}
