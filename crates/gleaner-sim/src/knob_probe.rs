//! The simulator's adapter for the guest loop's kernel idle knobs on its own, for the parity
//! test that holds it to the agent's (`tests/guest_loop.rs`): one 2-pCPU host, one VM whose
//! guest offers kernel polling, and the engine's own `kernel_poll_apply`, which every
//! simulated Gleaner period calls with the step of `GuestController`.

use gleaner_policy::guest::WindowReset;
use gleaner_policy::idle::IdlePlan;

use crate::engine::{Engine, KernelPolling, Setup, SetupVm};

/// What the kernel's idle knobs are after an apply, as the agent's sysfs shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnobView {
    /// The haltpoll cap (`guest_halt_poll_ns`); 0: the machine's own (these VMs': 0).
    pub cap_ns: u64,
    /// The vCPUs polling until work (resume latency limit `n/a`).
    pub always: Vec<u32>,
    /// Shrinking to nothing on (`guest_halt_poll_allow_shrink` Y, `guest_halt_poll_shrink` 0).
    pub shrink: bool,
    /// Each vCPU's own window was reset by this apply.
    pub windows_reset: bool,
}

/// One background VM of `vcpus` always-runnable vCPUs (matmul) on two pCPUs, not started:
/// the probe's engine, and the engine's own tests'.
pub(crate) fn two_pcpu_engine(vcpus: u32) -> Engine {
    let w = crate::workload::builtin("matmul", vcpus, 1.0, true).expect("builtin").resolve("m", vcpus, vcpus).expect("resolves");
    let vm = SetupVm {
        name: "a".into(),
        workload: w,
        vcpus,
        pin_offset: None,
        background: true,
        guest: gleaner_policy::IdlePolicy::Stock,
        gleaner: crate::scenario::GleanerCfg::default(),
        haltpoll: crate::scenario::GuestHaltpollCfg::default(),
    };
    let costs = crate::scenario::Costs::from_table2(&crate::scenario::CostsCfg::default().vm, 1.0, 2.0, 1.0);
    Engine::new(Setup {
        pcpus: 2,
        host_slice_ns: 3_000_000,
        slice_jitter_pm: 0,
        scheduler: Default::default(),
        wakeup_preemption: true,
        wakeup_gran_ns: 0,
        guest_slice_ns: 3_000_000,
        halt_poll: None,
        ple_window_ns: 20_000,
        balance_ns: Some(32_000_000),
        guest_steal: true,
        virt: true,
        costs,
        vms: vec![vm],
        seed: 1,
        stop_at: Some(1),
        max_ns: 1,
        host_policy: Box::new(crate::policy::StockHost),
    })
}

/// The adapter under test (module documentation).
#[derive(Debug)]
pub struct KnobProbe {
    engine: Engine,
    vcpus: u32,
}

/// A window no apply writes: a vCPU's own window still at it was not reset.
const GROWN: u64 = 123_456;

impl KnobProbe {
    /// A VM of `vcpus` vCPUs whose guest offers kernel polling, at the machine's own settings.
    pub fn new(vcpus: u32) -> Self {
        let mut engine = two_pcpu_engine(vcpus);
        engine.vms[0].kpoll = Some(KernelPolling { cap_ns: 0, always: vec![false; vcpus as usize], reset_until: 0, shrink: false });
        engine.now = 1_000_000_000;
        Self { engine, vcpus }
    }

    /// Applies a step's plan, retention mode and window reset as a simulated Gleaner period
    /// does, and says what the knobs are then.
    pub fn apply(&mut self, plan: &IdlePlan, on: bool, reset: WindowReset) -> KnobView {
        for v in 0..self.vcpus as usize {
            self.engine.vcpus[v].guest_poll_limit = GROWN;
        }
        self.engine.kernel_poll_apply(0, on, plan, false, reset);
        self.engine.now += 200_000_000;
        let kp = self.engine.vms[0].kpoll.as_ref().expect("the VM polls in the kernel");
        KnobView {
            cap_ns: kp.cap_ns,
            always: kp.always.iter().enumerate().filter(|(_, a)| **a).map(|(i, _)| u32::try_from(i).unwrap_or(u32::MAX)).collect(),
            shrink: kp.shrink,
            windows_reset: self.engine.vcpus[..self.vcpus as usize].iter().all(|v| v.guest_poll_limit == 0),
        }
    }
}
