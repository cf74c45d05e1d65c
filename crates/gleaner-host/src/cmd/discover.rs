//! `gleaner host discover`: list VMs and their vCPU threads.

use std::process::ExitCode;

use gleaner_os::procfs::Procfs;

use super::print_json;
use crate::cli::DiscoverArgs;
use crate::host_loop::find_vms;

pub fn cmd_discover(a: &DiscoverArgs) -> anyhow::Result<ExitCode> {
    let vms = find_vms(&Procfs::new(), &a.filter)?;
    if a.json {
        print_json(&serde_json::json!({ "vms": vms }))?;
    } else if vms.is_empty() {
        println!("no VM found (QEMU, Firecracker, Cloud Hypervisor)");
    } else {
        for vm in &vms {
            println!("{} pid {} {:?} accel {}", vm.name, vm.pid, vm.vmm, vm.accel.as_deref().unwrap_or("?"));
            for v in &vm.vcpus {
                println!("  vCPU {:2} tid {:7} {:12} ({:?})", v.index, v.tid, v.name, v.evidence);
            }
            if let Some(q) = &vm.qmp_socket {
                println!("  QMP {}", q.display());
            }
            for n in &vm.notes {
                println!("  note: {n}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
