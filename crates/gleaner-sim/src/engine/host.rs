//! The host scheduler: what each pCPU runs (settle, drive, replan, pick the next vCPU), the
//! fair-share run queues, periodic balancing, wakeups and placement, KVM's halt polling, and
//! the guest's kicks.

use super::*;

/// Xen credit's accounting tick (`sched_credit_tick_ms`, 10 ms): a BOOSTed vCPU that runs
/// through one is demoted (`csched_unit_acct`).
const CREDIT_TICK_NS: Ns = 10_000_000;
/// Xen's scheduling rate limit (`sched_ratelimit_us`, 1 ms): a running vCPU is not preempted
/// before it has run this long.
const CREDIT_RATELIMIT_NS: Ns = 1_000_000;

impl Engine {
    pub(crate) fn mark_dirty(&mut self, p: u32) {
        let pc = &mut self.pcpus[p as usize];
        if !pc.dirty {
            pc.dirty = true;
            self.dirty.push(p);
        }
    }

    pub(super) fn flush_dirty(&mut self) {
        while let Some(p) = self.dirty.pop() {
            self.pcpus[p as usize].dirty = false;
            self.drive(p);
        }
    }

    /// Accounts the time since the pCPU's last settle to whatever its vCPU was doing.
    pub(crate) fn settle(&mut self, p: u32) {
        let now = self.now;
        let pc = &mut self.pcpus[p as usize];
        let e = now - pc.seg_start;
        pc.seg_start = now;
        if e == 0 || pc.cur == NONE {
            return;
        }
        let vi = pc.cur as usize;
        let vc = &mut self.vcpus[vi];
        vc.vruntime += e;
        vc.c.run_ns += e;
        let x = e.min(vc.overhead);
        vc.overhead -= x;
        vc.c.overhead_ns += x;
        // No early return when the overhead took it all (`e` 0): whether it did is data,
        // half the time each way, and the adds below are then of 0.
        let e = e - x;
        match vc.idle {
            Idle::Busy if vc.cur == NONE => {}
            Idle::Busy => {
                let th = &mut self.threads[vc.cur as usize];
                if th.spinning {
                    vc.c.spin_ns += e;
                } else {
                    let w = e.min(th.rem);
                    th.rem -= w;
                    vc.c.work_ns += w;
                }
            }
            Idle::Yield => {
                if let Some(y) = vc.yielder.as_mut() {
                    y.run_ns += e;
                }
                vc.c.yield_ns += e;
            }
            Idle::Poll { .. } => vc.c.gpoll_ns += e,
            Idle::Halted => vc.c.hpoll_ns += e,
        }
    }

    /// Handles every boundary reached at `now` on pCPU `p`, then schedules the next one.
    pub(crate) fn drive(&mut self, p: u32) {
        self.settle(p);
        let mut guard = 0u32;
        loop {
            guard += 1;
            debug_assert!(guard < 100_000, "drive loop does not converge on pCPU {p}");
            if guard >= 100_000 {
                break;
            }
            let v = self.pcpus[p as usize].cur;
            if v == NONE {
                if !self.pick_next(p) {
                    break;
                }
                continue;
            }
            let now = self.now;
            let vi = v as usize;
            // `&`, not `&&`: one branch on the pair, which is nearly always false, instead of
            // one on a queue that is often not empty and one on the slice's end.
            if !self.pcpus[p as usize].rq.is_empty() & (now >= self.vcpus[vi].slice_end) {
                self.host_slice_expired(p);
                continue;
            }
            if self.vcpus[vi].overhead > 0 {
                break;
            }
            if !self.guest_step(v, p) {
                break;
            }
        }
        self.replan(p);
    }

    pub(super) fn replan(&mut self, p: u32) {
        let pc = &self.pcpus[p as usize];
        let v = pc.cur;
        if v == NONE {
            self.q.cancel_pcpu(p);
            return;
        }
        let now = self.now;
        let vc = &self.vcpus[v as usize];
        let mut t = Ns::MAX;
        if !pc.rq.is_empty() {
            t = t.min(vc.slice_end.max(now));
        }
        if vc.overhead > 0 {
            t = t.min(now + vc.overhead);
        } else {
            match vc.idle {
                Idle::Busy => {
                    let th = &self.threads[vc.cur as usize];
                    if th.spinning {
                        if self.virt {
                            t = t.min((vc.spin_since + self.ple_window_ns).max(now));
                        }
                    } else {
                        t = t.min(now + th.rem);
                    }
                    if !vc.rq.is_empty() {
                        t = t.min(vc.gslice_end.max(now));
                    }
                }
                Idle::Yield => {
                    if let Some(y) = vc.yielder.as_ref() {
                        t = t.min(now + y.target_ns.saturating_sub(y.run_ns));
                    }
                }
                Idle::Poll { until } => t = t.min(until),
                Idle::Halted => t = t.min(vc.poll_end.max(now)),
            }
        }
        if t == Ns::MAX {
            self.q.cancel_pcpu(p);
        } else {
            self.q.set_pcpu(p, t);
        }
    }

    // ---------------------------------------------------------------- host scheduler

    /// Picks the next vCPU for an empty pCPU: its own queue first, then steals. False if idle.
    pub(super) fn pick_next(&mut self, p: u32) -> bool {
        let pi = p as usize;
        if !self.pcpus[pi].rq.is_empty() {
            let rq = &self.pcpus[pi].rq;
            let now = self.now;
            // On a credit host BOOST comes before any credit; else the least virtual runtime.
            let key = |w: u32| (!(self.credit && self.vcpus[w as usize].boost_until > now), self.vcpus[w as usize].vruntime);
            let mut best = 0;
            for i in 1..rq.len() {
                if key(rq[i]) < key(rq[best]) {
                    best = i;
                }
            }
            let v = self.pcpus[pi].rq.remove(best);
            self.queued_vcpus -= 1;
            self.run_on(p, v);
            return true;
        }
        if self.queued_vcpus > 0 {
            let n = self.pcpus.len() as u32;
            for k in 1..n {
                let q = (p + k) % n;
                let rq = &self.pcpus[q as usize].rq;
                if let Some(pos) = rq.iter().position(|&w| self.affs[self.vcpus[w as usize].aff as usize].member[p as usize]) {
                    let v = self.pcpus[q as usize].rq.remove(pos);
                    self.queued_vcpus -= 1;
                    self.mark_dirty(q);
                    self.run_on(p, v);
                    return true;
                }
            }
        }
        false
    }

    /// Starts vCPU `v` on the (empty, settled) pCPU `p`, charging resume and switch costs.
    pub(crate) fn run_on(&mut self, p: u32, v: u32) {
        let now = self.now;
        let pi = p as usize;
        debug_assert_eq!(self.pcpus[pi].cur, NONE);
        let last = self.pcpus[pi].last;
        self.pcpus[pi].cur = v;
        self.pcpus[pi].last = v;
        self.pcpus[pi].seg_start = now;
        self.idle_pcpus -= 1;
        let pv = self.costs.pv;
        let slice = self.host_slice(self.vcpus[v as usize].slice_ns);
        let vc = &mut self.vcpus[v as usize];
        let mut oh = 0;
        if vc.pending_rv {
            oh += vc.rv_due;
            vc.pending_rv = false;
        }
        if last != v && last != NONE {
            oh += pv;
            let cache = &self.vms[vc.vm as usize].cache;
            oh += saturating_u64(cache.wss_kb * cache.refill_ns_per_kb);
            vc.c.refills += 1;
        }
        vc.overhead += oh;
        let queued = std::mem::replace(&mut vc.queued_since, Ns::MAX);
        if queued != Ns::MAX {
            let waited = now - queued;
            vc.steal_ns += waited;
            match Self::gv_kind(vc) {
                GV_IDLE => vc.steal_idle_ns += waited,
                GV_YIELD => vc.steal_yield_ns += waited,
                _ => {}
            }
        }
        vc.host = Host::Running(p);
        vc.last_p = p;
        vc.run_start = now;
        if vc.boost_until == Ns::MAX {
            // Demoted at the first accounting tick it runs through (ticks on one global grid).
            vc.boost_until = (now / CREDIT_TICK_NS + 1) * CREDIT_TICK_NS;
        }
        vc.slice_end = now + vc.overhead + slice;
        vc.spin_since = now;
        if vc.idle == Idle::Yield {
            self.yield_resume(v);
        }
    }

    /// Takes vCPU `v` off its pCPU (already settled). The pCPU is left empty.
    pub(crate) fn take_off(&mut self, v: u32) -> u32 {
        let Host::Running(p) = self.vcpus[v as usize].host else { unreachable!("vCPU {v} is not running") };
        if self.vcpus[v as usize].idle == Idle::Yield {
            self.yield_pause(v, false);
        }
        self.pcpus[p as usize].cur = NONE;
        self.idle_pcpus += 1;
        let vc = &mut self.vcpus[v as usize];
        vc.host = Host::Off;
        vc.boost_until = 0;
        p
    }

    pub(super) fn enqueue_on(&mut self, p: u32, v: u32) {
        self.pcpus[p as usize].rq.push(v);
        self.queued_vcpus += 1;
        let vc = &mut self.vcpus[v as usize];
        vc.host = Host::Queued(p);
        if vc.queued_since == Ns::MAX {
            vc.queued_since = self.now;
        }
    }

    pub(super) fn host_slice_expired(&mut self, p: u32) {
        let pi = p as usize;
        let v = self.pcpus[pi].cur;
        let min_rq = self.pcpus[pi].rq.iter().map(|&w| self.vcpus[w as usize].vruntime).min().unwrap_or(u64::MAX);
        if self.boost_waits(p) || min_rq < self.vcpus[v as usize].vruntime {
            self.take_off(v);
            self.enqueue_on(p, v);
        } else {
            let slice = self.host_slice(self.vcpus[v as usize].slice_ns);
            self.vcpus[v as usize].slice_end = self.now + slice;
        }
    }

    /// On a credit host: whether a BOOSTed vCPU waits in `p`'s queue while `p` runs one that
    /// is not (it takes the pCPU once the rate limit allows).
    fn boost_waits(&self, p: u32) -> bool {
        let now = self.now;
        let pc = &self.pcpus[p as usize];
        self.credit
            && pc.cur != NONE
            && self.vcpus[pc.cur as usize].boost_until <= now
            && pc.rq.iter().any(|&w| self.vcpus[w as usize].boost_until > now)
    }

    /// One host slice of a vCPU whose slice is `slice_ns`: jittered by `slice_jitter_pm`
    /// (drawing nothing from the generator without it).
    fn host_slice(&mut self, slice_ns: Ns) -> Ns {
        let j = self.slice_jitter_pm;
        self.sample_compute(slice_ns, j)
    }

    /// Periodic load balancing (`Setup::balance_ns`): while the pCPU with the most vCPUs
    /// (running + queued) has two or more than the one with the fewest, move its oldest queued
    /// vCPU that may run there, placed as a waking vCPU is (at most half a slice behind).
    pub(super) fn on_host_balance(&mut self) {
        let Some(interval) = self.balance_ns else { return };
        let n = self.pcpus.len();
        for _ in 0..self.vcpus.len() {
            if self.queued_vcpus == 0 || n < 2 {
                break;
            }
            let load = |pc: &Pcpu| pc.rq.len() + usize::from(pc.cur != NONE);
            let (mut hi, mut lo) = (0, 0);
            for p in 1..n {
                if load(&self.pcpus[p]) > load(&self.pcpus[hi]) {
                    hi = p;
                }
                if load(&self.pcpus[p]) < load(&self.pcpus[lo]) {
                    lo = p;
                }
            }
            if load(&self.pcpus[hi]) < load(&self.pcpus[lo]) + 2 {
                break;
            }
            let Some(pos) = self.pcpus[hi].rq.iter().position(|&w| self.affs[self.vcpus[w as usize].aff as usize].member[lo]) else {
                break;
            };
            let v = self.pcpus[hi].rq.remove(pos);
            self.queued_vcpus -= 1;
            let (hi, lo) = (hi as u32, lo as u32);
            self.settle(lo);
            let pc = &self.pcpus[lo as usize];
            let minv = pc.rq.iter().chain(std::iter::once(&pc.cur).filter(|&&c| c != NONE)).map(|&w| self.vcpus[w as usize].vruntime).min();
            if let Some(minv) = minv {
                let vc = &mut self.vcpus[v as usize];
                vc.vruntime = vc.vruntime.max(minv.saturating_sub(self.host_slice_ns / 2));
            }
            self.enqueue_on(lo, v);
            self.mark_dirty(lo);
            self.mark_dirty(hi);
        }
        self.q.push(self.now + interval, Ev::HostBalance);
    }

    /// Directed yield after a pause-loop exit: let a waiting vCPU run.
    pub(crate) fn host_yield(&mut self, p: u32) {
        let v = self.pcpus[p as usize].cur;
        let maxv = self.pcpus[p as usize].rq.iter().map(|&w| self.vcpus[w as usize].vruntime).max().unwrap_or(0);
        self.take_off(v);
        let vc = &mut self.vcpus[v as usize];
        vc.vruntime = vc.vruntime.max(maxv + 1);
        self.enqueue_on(p, v);
    }

    /// KVM's halt-polling window update after a halt of `halt_ns` (kvm_vcpu_halt).
    pub(crate) fn kvm_adjust(&mut self, v: u32, halt_ns: u64) {
        let Some(hp) = self.halt_poll else { return };
        let vc = &mut self.vcpus[v as usize];
        let cur = vc.kvm_poll_ns;
        if halt_ns <= cur {
            // woke up during the poll: keep the window
        } else if cur > 0 && halt_ns > hp.max_ns {
            vc.kvm_poll_ns = cur.checked_div(hp.shrink).unwrap_or(0);
        } else if cur < hp.max_ns && halt_ns < hp.max_ns {
            let mut val = cur.saturating_mul(hp.grow);
            if val < hp.grow_start {
                val = hp.grow_start;
            }
            vc.kvm_poll_ns = val.min(hp.max_ns);
        }
    }

    /// Makes a halted, descheduled vCPU runnable (an IPI or a timer reached it).
    pub(crate) fn host_wake(&mut self, v: u32) {
        let now = self.now;
        let halt_ns = now - self.vcpus[v as usize].halt_start;
        self.kvm_adjust(v, halt_ns);
        let rv = self.costs.rv_at(halt_ns);
        let credit = self.credit;
        let vc = &mut self.vcpus[v as usize];
        vc.rv_due = rv;
        vc.pending_rv = true;
        if credit {
            // csched_unit_wake: a vCPU that blocked wakes BOOSTed (counted from its first run).
            vc.boost_until = Ns::MAX;
        }
        self.host_place(v);
    }

    /// Puts an off-CPU vCPU on a pCPU of its affinity: an idle one if any, else a run queue
    /// (preempting the running vCPU if wakeup preemption allows).
    pub(crate) fn host_place(&mut self, v: u32) {
        let (ai, last) = {
            let vc = &self.vcpus[v as usize];
            (vc.aff as usize, vc.last_p)
        };
        let span = self.affs[ai].cpus.len() as u32;
        let last_ok = self.affs[ai].member[last as usize];
        if self.idle_pcpus > 0 {
            if last_ok && self.pcpus[last as usize].cur == NONE {
                self.settle(last);
                self.run_on(last, v);
                self.mark_dirty(last);
                return;
            }
            let start = v % span;
            for k in 0..span {
                let p = self.affs[ai].cpus[((start + k) % span) as usize];
                if self.pcpus[p as usize].cur == NONE {
                    self.settle(p);
                    self.run_on(p, v);
                    self.mark_dirty(p);
                    return;
                }
            }
        }
        let p = if last_ok { last } else { self.affs[ai].cpus[(v % span) as usize] };
        self.settle(p);
        let cur = self.pcpus[p as usize].cur;
        // Sleeper credit: a waking vCPU is placed at most half a slice behind the queue's minimum.
        let minv = self.pcpus[p as usize]
            .rq
            .iter()
            .chain(std::iter::once(&cur).filter(|&&c| c != NONE))
            .map(|&w| self.vcpus[w as usize].vruntime)
            .min()
            .unwrap_or(0);
        let half = self.host_slice_ns / 2;
        let vc = &mut self.vcpus[v as usize];
        vc.vruntime = vc.vruntime.max(minv.saturating_sub(half));
        let vr = vc.vruntime;
        let now = self.now;
        let preempt = if self.credit {
            // BOOST over any vCPU that is not, once that one ran the rate limit; before, the
            // running vCPU's slice is cut to end there (`host_slice_expired` then switches).
            let boosted = self.vcpus[v as usize].boost_until > now;
            let earliest = if cur == NONE { 0 } else { self.vcpus[cur as usize].run_start + CREDIT_RATELIMIT_NS };
            let over = boosted && cur != NONE && self.vcpus[cur as usize].boost_until <= now;
            if over && now < earliest {
                let c = &mut self.vcpus[cur as usize];
                c.slice_end = c.slice_end.min(earliest);
            }
            over && now >= earliest
        } else {
            cur != NONE && self.wakeup_preemption && vr + self.wakeup_gran_ns < self.vcpus[cur as usize].vruntime
        };
        if preempt {
            self.take_off(cur);
            self.enqueue_on(p, cur);
            self.run_on(p, v);
        } else {
            self.enqueue_on(p, v);
        }
        self.mark_dirty(p);
    }

    /// Moves a vCPU onto its (new) affinity if it is outside it.
    pub(crate) fn host_migrate_if_needed(&mut self, v: u32) {
        let vc = &self.vcpus[v as usize];
        let member = &self.affs[vc.aff as usize].member;
        match vc.host {
            Host::Running(p) if !member[p as usize] => {
                self.settle(p);
                self.take_off(v);
                self.mark_dirty(p);
                self.host_place(v);
            }
            Host::Queued(p) if !member[p as usize] => {
                let rq = &mut self.pcpus[p as usize].rq;
                if let Some(pos) = rq.iter().position(|&w| w == v) {
                    rq.remove(pos);
                    self.queued_vcpus -= 1;
                }
                self.vcpus[v as usize].host = Host::Off;
                self.mark_dirty(p);
                self.host_place(v);
            }
            _ => {}
        }
    }

    /// An IPI (or a timer) reached vCPU `v`: deliver the threads in flight and wake it.
    pub(super) fn on_kick(&mut self, v: u32) {
        let vi = v as usize;
        self.vcpus[vi].kick_pending = false;
        if let Host::Running(p) = self.vcpus[vi].host {
            self.settle(p);
        }
        let inbox = std::mem::take(&mut self.vcpus[vi].inbox);
        for &t in &inbox {
            self.rq_push(v, t);
        }
        let mut inbox = inbox;
        inbox.clear();
        self.vcpus[vi].inbox = inbox;
        match self.vcpus[vi].host {
            Host::Running(p) => self.mark_dirty(p),
            Host::Queued(_) => {}
            Host::Off => self.host_wake(v),
        }
    }

    /// Sends a wake-up to vCPU `v` after `delay` (no-op if one is in flight).
    pub(crate) fn kick(&mut self, v: u32, delay: Ns) {
        let vc = &mut self.vcpus[v as usize];
        if !vc.kick_pending {
            vc.kick_pending = true;
            self.q.push_after(self.now, delay, Ev::Kick { v });
        }
    }

    /// An exponentially distributed gap with this mean (a Poisson process's), at least 1 ns.
    pub(crate) fn sample_exp(&mut self, mean: Ns) -> Ns {
        let u: f64 = self.rng.gen_range(f64::MIN_POSITIVE..1.0);
        round_at_least_1(-ns_f64(mean) * u.ln())
    }

    pub(crate) fn sample_compute(&mut self, mean: Ns, jitter_pm: u32) -> Ns {
        if jitter_pm == 0 || mean == 0 {
            return mean;
        }
        let d = ns_f64(mean) * f64::from(jitter_pm) / 1000.0;
        let x: f64 = self.rng.gen_range(-1.0..1.0);
        round_at_least_1(ns_f64(mean) + x * d)
    }
}
