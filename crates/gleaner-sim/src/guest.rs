//! The guest side: per-vCPU run queues, wake-up placement (an idle vCPU gets an IPI), newidle
//! stealing, idle handling (halt, guest haltpoll, idle=poll, Gleaner's yielder), and the
//! threads' programs with their synchronization objects.

use gleaner_policy::idle::TargetState;

use crate::engine::{Engine, Host, Idle, Ts, YState, GV_IDLE, GV_WORK, GV_YIELD, NONE};
use crate::queue::{Ev, Ns};
use crate::workload::Op;
use gleaner_policy::IdlePolicy;

/// When a blocked thread's timer fires.
#[derive(Debug, Clone, Copy)]
enum Wake {
    /// At this time.
    At(Ns),
    /// This long after now.
    After(Ns),
}

impl Engine {
    /// One step of the vCPU `v` running on pCPU `p` (settled, no overhead left). Returns true
    /// if something changed (the caller loops), false when the vCPU just keeps going.
    pub(crate) fn guest_step(&mut self, v: u32, p: u32) -> bool {
        match self.vcpus[v as usize].idle {
            Idle::Busy => self.busy_step(v, p),
            Idle::Yield => self.yield_step(v, p),
            Idle::Poll { until } => {
                if !self.vcpus[v as usize].rq.is_empty() || self.yielder_runnable(v) {
                    self.leave_idle(v);
                    self.guest_next(v, p);
                    return true;
                }
                if self.now >= until {
                    self.halt(v, p);
                    return true;
                }
                false
            }
            Idle::Halted => self.halted_step(v, p),
        }
    }

    /// A vCPU running a thread: the next thread where it has none, a pause-loop exit for a
    /// spinner past the PLE window, the thread's next ops once its computation is done, the
    /// next thread at the end of the guest's slice.
    fn busy_step(&mut self, v: u32, p: u32) -> bool {
        let now = self.now;
        let vi = v as usize;
        let t = self.vcpus[vi].cur;
        if t == NONE {
            self.guest_next(v, p);
            return true;
        }
        let (spinning, rem) = {
            let th = &self.threads[t as usize];
            (th.spinning, th.rem)
        };
        if spinning {
            if self.virt && now >= self.vcpus[vi].spin_since + self.ple_window_ns {
                let vc = &mut self.vcpus[vi];
                vc.c.exits_ple += 1;
                vc.overhead += self.costs.ple_exit;
                vc.spin_since = now;
                if !self.pcpus[p as usize].rq.is_empty() {
                    self.host_yield(p);
                }
                return true;
            }
        } else if rem == 0 {
            self.run_ops(t, v, p);
            return true;
        }
        if !self.vcpus[vi].rq.is_empty() && now >= self.vcpus[vi].gslice_end {
            self.rotate(v, p);
            return true;
        }
        false
    }

    /// A vCPU kept by its yielding thread: work ends it, a parked yielder lets it idle, and
    /// the yielder's window running out times it out.
    fn yield_step(&mut self, v: u32, p: u32) -> bool {
        let vi = v as usize;
        if !self.vcpus[vi].rq.is_empty() {
            self.leave_idle(v);
            self.guest_next(v, p);
            return true;
        }
        if !self.yielder_runnable(v) {
            self.yield_pause(v, false);
            self.enter_idle(v, p);
            return true;
        }
        let y = self.vcpus[vi].yielder.as_ref().expect("yield state without yielder");
        if y.run_ns >= y.target_ns {
            self.yield_timeout(v);
            if !self.yielder_runnable(v) {
                self.enter_idle(v, p);
            }
            return true;
        }
        false
    }

    /// A halted vCPU on its pCPU: work wakes it; KVM's halt polling ends when another task
    /// wants the pCPU or at the window's end; resumed with nothing to do (another vCPU's
    /// newidle balance took the thread), it halts again, one more transition to idle.
    fn halted_step(&mut self, v: u32, p: u32) -> bool {
        let vi = v as usize;
        if !self.vcpus[vi].rq.is_empty() || self.yielder_runnable(v) {
            self.leave_idle(v);
            self.guest_next(v, p);
            return true;
        }
        if self.vcpus[vi].hpolling {
            if !self.pcpus[p as usize].rq.is_empty() || self.now >= self.vcpus[vi].poll_end {
                self.vcpus[vi].hpolling = false;
                self.take_off(v);
                return true;
            }
            return false;
        }
        self.vcpus[vi].c.idle_entries += 1;
        self.halt(v, p);
        true
    }

    pub(crate) fn yielder_runnable(&self, v: u32) -> bool {
        self.allowed[v as usize]
            && self.vcpus[v as usize].yielder.as_ref().is_some_and(|y| matches!(y.state, YState::Awake | YState::Woken { .. }))
    }

    /// Accounts the guest-visible time since the last change to the current category.
    pub(crate) fn gv_flush(&mut self, v: u32) {
        let now = self.now;
        let vc = &mut self.vcpus[v as usize];
        let e = now - vc.gv_since;
        vc.gv_since = now;
        let k = Self::gv_kind(vc);
        vc.c.gv[k] += e;
    }

    /// The guest view's category of `vc` now: [`GV_WORK`], [`GV_YIELD`] or [`GV_IDLE`]. Which
    /// of the three is data: an index picked by conditional moves, not branches.
    #[inline]
    pub(crate) fn gv_kind(vc: &crate::engine::Vcpu) -> usize {
        if vc.cur != NONE {
            GV_WORK
        } else if vc.idle == Idle::Yield {
            GV_YIELD
        } else {
            GV_IDLE
        }
    }

    /// Appends thread `t` to vCPU `v`'s run queue, counting it in the VM's queued threads and
    /// the compact `rqlen`.
    #[inline]
    pub(crate) fn rq_push(&mut self, v: u32, t: u32) {
        let vc = &mut self.vcpus[v as usize];
        vc.rq.push_back(t);
        self.vms[vc.vm as usize].queued += 1;
        self.rqlen[v as usize] += 1;
    }

    /// Takes the thread at position `pos` of vCPU `v`'s run queue (the counterpart of
    /// [`Self::rq_push`]).
    #[inline]
    fn rq_take(&mut self, v: u32, pos: usize) -> Option<u32> {
        let vc = &mut self.vcpus[v as usize];
        let t = if pos == 0 { vc.rq.pop_front() } else { vc.rq.remove(pos) }?;
        self.vms[vc.vm as usize].queued -= 1;
        self.rqlen[v as usize] -= 1;
        Some(t)
    }

    /// The vCPU has no current thread: run the next one, steal one, or go idle.
    pub(crate) fn guest_next(&mut self, v: u32, p: u32) {
        let vi = v as usize;
        if let Some(t) = self.rq_take(v, 0) {
            self.dispatch(v, t);
            return;
        }
        if self.allowed[vi] {
            if let Some(t) = self.steal(v) {
                self.dispatch(v, t);
                return;
            }
        }
        self.enter_idle(v, p);
    }

    fn dispatch(&mut self, v: u32, t: u32) {
        self.gv_flush(v);
        let now = self.now;
        let rt = self.costs.rt;
        let gs = self.guest_slice_ns;
        let vc = &mut self.vcpus[v as usize];
        vc.cur = t;
        vc.idle = Idle::Busy;
        vc.overhead += rt;
        vc.gslice_end = now + vc.overhead + gs;
        vc.spin_since = now;
        let oh = vc.overhead;
        let th = &mut self.threads[t as usize];
        th.state = Ts::Running;
        th.vcpu = v;
        if th.io_pending {
            th.io_pending = false;
            vc.c.io_events += 1;
        }
        let vm = th.vm as usize;
        if th.wake_at != Ns::MAX {
            let lat = now + oh - th.wake_at;
            th.wake_at = Ns::MAX;
            self.vms[vm].lat.record(lat);
            if let Some(tr) = self.vms[vm].trace.as_mut() {
                tr.latency.of_mut(th.wake_state).record(lat);
            }
        }
        self.vms[vm].s_work += 1;
    }

    fn rotate(&mut self, v: u32, p: u32) {
        self.gv_flush(v);
        let vi = v as usize;
        let t = self.vcpus[vi].cur;
        self.threads[t as usize].state = Ts::Runnable;
        self.vcpus[vi].cur = NONE;
        self.rq_push(v, t);
        self.guest_next(v, p);
    }

    /// Newidle balancing: take a waiting thread from the busiest allowed vCPU of the VM.
    fn steal(&mut self, v: u32) -> Option<u32> {
        let vm = self.vcpus[v as usize].vm as usize;
        if self.vms[vm].queued == 0 {
            return None;
        }
        let (base, n) = (self.vms[vm].vcpu_base, self.vms[vm].nvcpus);
        // The first vCPU with the longest run queue. `v`'s own queue is empty (`guest_next`
        // found nothing), so it is never chosen; a vCPU with a queued thread has a load.
        debug_assert_eq!(self.rqlen[v as usize], 0);
        // Two passes, the longest length and then where it first is: the first has no
        // branch and is vectorized, where one pass with a running best was a compare and
        // branch per vCPU (1.5% of a 256-vCPU run).
        let lens = &self.rqlen[base as usize..(base + n) as usize];
        let longest = lens.iter().copied().fold(0, u32::max);
        if longest == 0 {
            return None;
        }
        let best = base + lens.iter().position(|&len| len == longest).expect("the longest is there") as u32;
        let rq = &self.vcpus[best as usize].rq;
        let pos = (0..rq.len()).rev().find(|&i| self.threads[rq[i] as usize].pin == NONE)?;
        let t = self.rq_take(best, pos).expect("index in range");
        self.vload[best as usize] -= 1;
        self.vload[v as usize] += 1;
        Some(t)
    }

    /// The vCPU has nothing to run: the yielder, guest polling, or halt.
    pub(crate) fn enter_idle(&mut self, v: u32, p: u32) {
        self.gv_flush(v);
        let now = self.now;
        let vi = v as usize;
        if self.vcpus[vi].idle == Idle::Busy {
            self.vcpus[vi].c.idle_entries += 1;
            self.vcpus[vi].idle_since = now;
        }
        if self.yielder_runnable(v) {
            self.vcpus[vi].idle = Idle::Yield;
            if self.yield_resume(v) {
                return;
            }
            self.gv_flush(v);
        }
        let vm = self.vcpus[vi].vm as usize;
        if let Some(kp) = &self.vms[vm].kpoll {
            // The agent's kernel polling: until work on a vCPU it polls always, else the
            // haltpoll governor's window (this vCPU's own, grown to the fixed cap), then HLT.
            let always = kp.always[(v - self.vms[vm].vcpu_base) as usize];
            // Mid-reset (the governor switched away) nothing polls but an always poller.
            let limit = if now < kp.reset_until { 0 } else { self.vcpus[vi].guest_poll_limit };
            if always || limit > 0 {
                self.trace_idle_start(v);
                self.vcpus[vi].idle = Idle::Poll { until: if always { Ns::MAX } else { now + limit } };
            } else {
                self.halt(v, p);
            }
            return;
        }
        let mode = if self.virt { self.vms[vm].guest } else { IdlePolicy::Stock };
        match mode {
            IdlePolicy::Poll => {
                self.trace_idle_start(v);
                self.vcpus[vi].idle = Idle::Poll { until: Ns::MAX };
            }
            IdlePolicy::Haltpoll { .. } => {
                let limit = self.vcpus[vi].guest_poll_limit;
                if limit > 0 {
                    self.trace_idle_start(v);
                    self.vcpus[vi].idle = Idle::Poll { until: now + limit };
                } else {
                    self.halt(v, p);
                }
            }
            _ => self.halt(v, p),
        }
    }

    /// HLT: a VM exit; KVM polls if its window is open and nothing else wants the pCPU,
    /// otherwise the vCPU is descheduled.
    fn halt(&mut self, v: u32, p: u32) {
        self.gv_flush(v);
        self.trace_idle_start(v);
        let now = self.now;
        let vi = v as usize;
        let vc = &mut self.vcpus[vi];
        vc.idle = Idle::Halted;
        vc.halt_start = now;
        if self.virt {
            vc.c.exits_hlt += 1;
        }
        if self.halt_poll.is_some() && vc.kvm_poll_ns > 0 && self.pcpus[p as usize].rq.is_empty() {
            vc.hpolling = true;
            vc.poll_end = now + vc.kvm_poll_ns;
            vc.c.hpoll_attempts += 1;
        } else {
            vc.hpolling = false;
            self.take_off(v);
        }
    }

    /// The guest's idle task gets the vCPU (it halts or polls), unless it already has it.
    fn trace_idle_start(&mut self, v: u32) {
        let vi = v as usize;
        if self.vcpus[vi].trace_since == Ns::MAX && self.vms[self.vcpus[vi].vm as usize].trace.is_some() {
            self.vcpus[vi].trace_since = self.now;
        }
    }

    /// The idle task's period on `v` ends: recorded as the scheduler tracer records it, by
    /// what ended it: a thread woken from another vCPU (`woken`), by a timer, a device or
    /// this vCPU (`local`), or nothing of the workload's (the yielder: `other`).
    fn trace_idle_end(&mut self, v: u32) {
        let vi = v as usize;
        let since = std::mem::replace(&mut self.vcpus[vi].trace_since, Ns::MAX);
        if since == Ns::MAX {
            return;
        }
        let gap = self.now - since;
        let (vm, work, src) = (self.vcpus[vi].vm as usize, !self.vcpus[vi].rq.is_empty(), self.vcpus[vi].wake_src);
        let i = (v - self.vms[vm].vcpu_base) as usize;
        let Some(g) = self.vms[vm].trace.as_mut().and_then(|t| t.vcpus.get_mut(i)) else { return };
        match (work, src) {
            (false, _) => g.other.record(gap),
            (true, s) if s == NONE || s == v => g.local.record(gap),
            (true, _) => g.woken.record(gap),
        }
    }

    /// Leaves the idle state because work (or the yielder) arrived.
    fn leave_idle(&mut self, v: u32) {
        self.gv_flush(v);
        let now = self.now;
        let vi = v as usize;
        if matches!(self.vcpus[vi].idle, Idle::Poll { .. } | Idle::Halted) {
            self.trace_idle_end(v);
        }
        match self.vcpus[vi].idle {
            Idle::Yield => self.yield_pause(v, true),
            Idle::Poll { .. } => self.haltpoll_adjust(v),
            Idle::Halted => {
                if self.vcpus[vi].hpolling {
                    let halt_ns = now - self.vcpus[vi].halt_start;
                    let vc = &mut self.vcpus[vi];
                    vc.hpolling = false;
                    vc.c.hpoll_success += 1;
                    vc.overhead += self.costs.poll_wake;
                    self.kvm_adjust(v, halt_ns);
                }
                self.haltpoll_adjust(v);
            }
            Idle::Busy => {}
        }
        self.vcpus[vi].idle = Idle::Busy;
    }

    /// cpuidle-haltpoll's adaptive window (adjust_poll_limit) after an idle period.
    pub(crate) fn haltpoll_adjust(&mut self, v: u32) {
        let vi = v as usize;
        let vm = self.vcpus[vi].vm as usize;
        if let Some(kp) = &self.vms[vm].kpoll {
            // The agent's fixed window: grow_start = the cap, so a block inside it grows the
            // vCPU's window straight to the cap; allow_shrink = N, so a longer one keeps it,
            // except while a shrink to nothing is on (then a halt past the cap zeroes it).
            let (cap, shrink) = (kp.cap_ns, kp.shrink);
            if self.now < kp.reset_until {
                return; // no governor installed to adjust the window
            }
            let vc = &mut self.vcpus[vi];
            let block = self.now - vc.idle_since;
            if block > vc.guest_poll_limit && block <= cap {
                vc.guest_poll_limit = cap;
            } else if shrink && block > vc.guest_poll_limit && block > cap {
                vc.guest_poll_limit = 0;
            }
            return;
        }
        if !matches!(self.vms[vm].guest, IdlePolicy::Haltpoll { .. }) || !self.virt {
            return;
        }
        let hp = self.vms[vm].haltpoll.clone();
        let vc = &mut self.vcpus[vi];
        let block = self.now - vc.idle_since;
        let limit = vc.guest_poll_limit;
        if block > limit && block <= hp.guest_halt_poll_ns {
            let mut val = limit.saturating_mul(hp.guest_halt_poll_grow);
            if val < hp.guest_halt_poll_grow_start {
                val = hp.guest_halt_poll_grow_start;
            }
            vc.guest_poll_limit = val.min(hp.guest_halt_poll_ns);
        } else if block > hp.guest_halt_poll_ns {
            vc.guest_poll_limit = limit.checked_div(hp.guest_halt_poll_shrink).unwrap_or(0);
        }
    }

    /// Wakes a blocked thread; `src` is the waking vCPU (NONE for a timer or device).
    pub(crate) fn wake_thread(&mut self, t: u32, src: u32) {
        let th = &mut self.threads[t as usize];
        debug_assert_eq!(th.state, Ts::Blocked);
        th.state = Ts::Runnable;
        th.wake_at = self.now;
        let v = self.select_vcpu(t);
        self.deliver(t, v, src);
    }

    /// select_task_rq: the previous vCPU if idle, else any idle allowed vCPU, else the previous.
    /// A pinned thread goes to its vCPU while that is in the workload's cpuset, else anywhere
    /// in it (Linux keeps the thread's own affinity and uses the cpuset when they do not meet).
    pub(crate) fn select_vcpu(&self, t: u32) -> u32 {
        let th = &self.threads[t as usize];
        if th.pin != NONE && self.allowed[th.pin as usize] {
            return th.pin;
        }
        let vm = &self.vms[th.vm as usize];
        let (base, n) = (vm.vcpu_base, vm.nvcpus);
        let prev = th.vcpu;
        if self.allowed[prev as usize] && self.vload[prev as usize] == 0 {
            return prev;
        }
        // The VM's vCPUs after `prev`, then those before it: two slices, not a `% n` (a
        // divide) per vCPU looked at.
        let idle_in = |lo: u32, hi: u32| {
            let (lo, hi) = (lo as usize, hi as usize);
            self.vload[lo..hi].iter().zip(&self.allowed[lo..hi]).position(|(&l, &a)| a & (l == 0)).map(|i| lo as u32 + i as u32)
        };
        if let Some(u) = idle_in(prev + 1, base + n).or_else(|| idle_in(base, prev)) {
            return u;
        }
        if self.allowed[prev as usize] {
            return prev;
        }
        let mut best = NONE;
        for u in base..base + n {
            if self.allowed[u as usize] && (best == NONE || self.vload[u as usize] < self.vload[best as usize]) {
                best = u;
            }
        }
        if best == NONE {
            prev
        } else {
            best
        }
    }

    /// Puts a runnable thread on vCPU `v`: directly if `v` is busy or polling, through an IPI if
    /// it is halted or running the yielder.
    pub(crate) fn deliver(&mut self, t: u32, v: u32, src: u32) {
        let vi = v as usize;
        self.vload[vi] += 1;
        let polling = matches!(self.vcpus[vi].idle, Idle::Poll { .. });
        let th = &mut self.threads[t as usize];
        th.vcpu = v;
        th.wake_state = match self.vcpus[vi].idle {
            _ if self.vcpus[vi].cur != NONE => TargetState::Busy,
            Idle::Busy | Idle::Yield => TargetState::Busy,
            Idle::Poll { .. } => TargetState::Poll,
            Idle::Halted => TargetState::Halt,
        };
        self.vcpus[vi].wake_src = src;
        // A timer or device interrupt reaches the guest through the host (Costs::irq).
        let injected = src == NONE && self.virt && self.costs.irq > 0;
        if !injected && (src == v || self.vcpus[vi].cur != NONE || polling) {
            self.rq_push(v, t);
            if src != v {
                if let Host::Running(p) = self.vcpus[vi].host {
                    self.settle(p);
                    self.mark_dirty(p);
                }
            }
            return;
        }
        self.vcpus[vi].inbox.push(t);
        let delay = if src == NONE {
            // Without `injected` only a halted or yielding vCPU gets here, and `irq` is 0.
            if self.virt {
                self.costs.irq
            } else {
                0
            }
        } else {
            if self.virt {
                let sc = &mut self.vcpus[src as usize];
                sc.c.exits_ipi += 1;
                sc.overhead += self.costs.ipi_send;
            }
            // A yielding vCPU keeps yielding until the IPI gets through (Costs::yield_wake).
            let yielding = self.vcpus[vi].idle == Idle::Yield;
            self.costs.ipi + if yielding { self.costs.yield_wake } else { 0 }
        };
        self.kick(v, delay);
    }

    /// Blocks thread `t` until `at`: a timer (a TSC_DEADLINE exit in a VM) or, `io`, a
    /// device's completion (an I/O exit). `Wake::After(ns)` is `now + ns`, a fixed length
    /// (the event queue keeps those in a sorted lane).
    fn block_until(&mut self, t: u32, v: u32, p: u32, at: Wake, io: bool) {
        let th = &mut self.threads[t as usize];
        th.timer_gen = th.timer_gen.wrapping_add(1);
        let gen = th.timer_gen;
        th.io_pending |= io;
        if self.virt {
            let c = &mut self.vcpus[v as usize].c;
            if io {
                c.exits_io += 1;
            } else {
                c.exits_timer += 1;
            }
        }
        match at {
            Wake::At(at) => self.q.push(at, Ev::ThreadTimer { t, gen }),
            Wake::After(ns) => self.q.push_after(self.now, ns, Ev::ThreadTimer { t, gen }),
        }
        self.block_thread(t, v, p);
    }

    fn block_thread(&mut self, t: u32, v: u32, p: u32) {
        self.gv_flush(v);
        self.threads[t as usize].state = Ts::Blocked;
        self.vcpus[v as usize].cur = NONE;
        self.vload[v as usize] -= 1;
        self.guest_next(v, p);
    }

    fn thread_exit(&mut self, t: u32, v: u32, p: u32) {
        self.gv_flush(v);
        self.threads[t as usize].state = Ts::Done;
        self.vcpus[v as usize].cur = NONE;
        self.vload[v as usize] -= 1;
        let vm = self.threads[t as usize].vm as usize;
        let prog = self.threads[t as usize].prog as usize;
        for i in 0..self.progs[prog].pushes.len() {
            let q = self.progs[prog].pushes[i] as usize;
            self.queues[q].producers -= 1;
            if self.queues[q].producers == 0 {
                self.queues[q].closed = true;
                while let Some(w) = self.queues[q].pop_w.pop_front() {
                    // Re-run the pop: the queue is closed and empty, so the thread ends.
                    self.threads[w as usize].pc -= 1;
                    self.wake_thread(w, v);
                }
            }
        }
        self.vms[vm].alive -= 1;
        if self.vms[vm].alive == 0 {
            self.vms[vm].done_at = Some(self.now);
            if !self.vms[vm].background {
                self.fg_alive -= 1;
            }
        }
        self.guest_next(v, p);
    }

    /// Runs thread `t` (current on `v`, on pCPU `p`) from its program counter until it computes,
    /// spins, blocks or ends.
    fn run_ops(&mut self, t: u32, v: u32, p: u32) {
        let prog = self.threads[t as usize].prog as usize;
        let nops = self.progs[prog].ops.len() as u32;
        loop {
            let th = &mut self.threads[t as usize];
            if th.pc == nops {
                th.iter += 1;
                if self.progs[prog].iterations.is_some_and(|n| th.iter >= n) {
                    self.thread_exit(t, v, p);
                    return;
                }
                th.pc = 0;
            }
            let op = self.progs[prog].ops[th.pc as usize];
            th.pc += 1;
            if !self.run_op(op, t, v, p) {
                return;
            }
        }
    }

    /// One op of thread `t`: true where the thread goes on to its next op, false where it
    /// computes, spins, blocks or ended.
    fn run_op(&mut self, op: Op, t: u32, v: u32, p: u32) -> bool {
        match op {
            Op::Compute { mean_ns, jitter_pm } => {
                let rem = self.sample_compute(mean_ns, jitter_pm);
                if rem > 0 {
                    self.threads[t as usize].rem = rem;
                    return false;
                }
                true
            }
            Op::Lock(m) => self.op_lock(m, t, v, p),
            Op::Unlock(m) => {
                self.op_unlock(m, v);
                true
            }
            Op::Push(q) => self.op_push(q, t, v, p),
            Op::Pop(q) => self.op_pop(q, t, v, p),
            Op::Signal(c) => {
                let cv = &mut self.conds[c as usize];
                if let Some(w) = cv.waiters.pop_front() {
                    self.wake_thread(w, v);
                } else {
                    cv.tokens += 1;
                }
                true
            }
            Op::Wait(c) => {
                let cv = &mut self.conds[c as usize];
                if cv.tokens > 0 {
                    cv.tokens -= 1;
                    return true;
                }
                cv.waiters.push_back(t);
                self.block_thread(t, v, p);
                false
            }
            Op::Barrier(b) => self.op_barrier(b, t, v, p),
            Op::SpinBarrier(b) => self.op_spin_barrier(b, t, v),
            Op::Stamp => {
                self.stamps[t as usize] = self.now;
                true
            }
            Op::Record => {
                let stamp = self.stamps[t as usize];
                if stamp != Ns::MAX {
                    let vm = self.threads[t as usize].vm as usize;
                    self.vms[vm].req.record(self.now.saturating_sub(stamp));
                }
                true
            }
            Op::Arrive { mean_gap_ns } => self.op_arrive(mean_gap_ns, t, v, p),
            Op::Sleep(ns) => {
                self.block_until(t, v, p, Wake::After(ns), false);
                false
            }
            Op::Io(ns) => {
                self.block_until(t, v, p, Wake::After(ns), true);
                false
            }
        }
    }

    /// Takes mutex `m`, or queues thread `t` on it and blocks.
    fn op_lock(&mut self, m: u32, t: u32, v: u32, p: u32) -> bool {
        let mx = &mut self.mutexes[m as usize];
        if mx.owner == NONE {
            mx.owner = t;
            return true;
        }
        mx.waiters.push_back(t);
        self.block_thread(t, v, p);
        false
    }

    /// Releases mutex `m` to its first waiter (woken from `v`), if any.
    fn op_unlock(&mut self, m: u32, v: u32) {
        let mx = &mut self.mutexes[m as usize];
        if let Some(w) = mx.waiters.pop_front() {
            mx.owner = w;
            self.wake_thread(w, v);
        } else {
            mx.owner = NONE;
        }
    }

    /// Hands thread `t`'s item (and its stamp) to a waiting popper, or queues it, or blocks
    /// `t` on a full queue.
    fn op_push(&mut self, q: u32, t: u32, v: u32, p: u32) -> bool {
        let qu = &mut self.queues[q as usize];
        if let Some(w) = qu.pop_w.pop_front() {
            if qu.stamped {
                self.stamps[w as usize] = self.stamps[t as usize];
            }
            self.wake_thread(w, v);
        } else if qu.len < qu.cap {
            qu.len += 1;
            if qu.stamped {
                qu.stamps.push_back(self.stamps[t as usize]);
            }
        } else {
            qu.push_w.push_back(t);
            self.block_thread(t, v, p);
            return false;
        }
        true
    }

    /// Takes an item (and its stamp) and lets a blocked pusher's in; on an empty queue the
    /// thread ends if the queue is closed, else blocks.
    fn op_pop(&mut self, q: u32, t: u32, v: u32, p: u32) -> bool {
        let qu = &mut self.queues[q as usize];
        if qu.len > 0 {
            qu.len -= 1;
            if qu.stamped {
                self.stamps[t as usize] = qu.stamps.pop_front().unwrap_or(Ns::MAX);
            }
            if let Some(w) = qu.push_w.pop_front() {
                // The blocked pusher's item goes in now, with its stamp.
                qu.len += 1;
                if qu.stamped {
                    qu.stamps.push_back(self.stamps[w as usize]);
                }
                self.wake_thread(w, v);
            }
            true
        } else if qu.closed {
            self.thread_exit(t, v, p);
            false
        } else {
            qu.pop_w.push_back(t);
            self.block_thread(t, v, p);
            false
        }
    }

    /// Arrives at barrier `b`: the last to arrive wakes the others, the rest block.
    fn op_barrier(&mut self, b: u32, t: u32, v: u32, p: u32) -> bool {
        let br = &mut self.barriers[b as usize];
        br.arrived += 1;
        if br.arrived < br.n {
            br.waiters.push(t);
            self.block_thread(t, v, p);
            return false;
        }
        br.arrived = 0;
        let ws = std::mem::take(&mut br.waiters);
        for &w in &ws {
            self.wake_thread(w, v);
        }
        let mut ws = ws;
        ws.clear();
        self.barriers[b as usize].waiters = ws;
        true
    }

    /// Arrives at spin barrier `b`: the last to arrive releases the spinners (a running one's
    /// pCPU is settled and driven again), the rest spin on their vCPU.
    fn op_spin_barrier(&mut self, b: u32, t: u32, v: u32) -> bool {
        let br = &mut self.spins[b as usize];
        br.arrived += 1;
        if br.arrived < br.n {
            br.waiters.push(t);
            self.threads[t as usize].spinning = true;
            self.vcpus[v as usize].spin_since = self.now;
            return false;
        }
        br.arrived = 0;
        let ws = std::mem::take(&mut br.waiters);
        for &w in &ws {
            let wv = self.threads[w as usize].vcpu;
            if self.vcpus[wv as usize].cur == w {
                if let Host::Running(wp) = self.vcpus[wv as usize].host {
                    self.settle(wp);
                    self.mark_dirty(wp);
                }
            }
            self.threads[w as usize].spinning = false;
        }
        let mut ws = ws;
        ws.clear();
        self.spins[b as usize].waiters = ws;
        true
    }

    /// The open loop's next request. The arrivals are a fixed schedule: a sender that wakes
    /// late does not push the next arrival back, and its request keeps the scheduled time, so
    /// the lateness shows in the latency.
    fn op_arrive(&mut self, mean_gap_ns: Ns, t: u32, v: u32, p: u32) -> bool {
        let next = match self.arrivals[t as usize] {
            Ns::MAX => self.now + self.sample_exp(mean_gap_ns),
            a => a,
        };
        self.arrivals[t as usize] = next + self.sample_exp(mean_gap_ns);
        self.stamps[t as usize] = next;
        if next > self.now {
            self.block_until(t, v, p, Wake::At(next), false);
            return false;
        }
        true
    }
}
