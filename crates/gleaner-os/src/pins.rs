//! Threads that pinned themselves: what consolidation must not take from them.
//!
//! A cpuset limits every thread in its cgroup; a thread's own affinity (`sched_setaffinity`)
//! is the program's intent within it. [`PinWatch`] learns each managed thread's own mask while
//! it can be seen, that is while it is narrower than the cpuset (the kernel reports the
//! intersection, so a thread pinned to exactly the cpuset looks unpinned), and remembers it.
//! While any pin is remembered, consolidation keeps every vCPU (the program places its threads
//! itself: `gleaner_policy::gleaner::Params::keep_pinned`); [`PinWatch::reapply`] puts back a mask the
//! kernel reset (before Linux 6.2 every write of `cpuset.cpus` and every move between cpusets
//! set each thread's mask to the cpuset's; since 6.2 the kernel keeps the requested mask).
//!
//! What no watch can help: a thread that pins itself, while the cpuset is shrunk, to CPUs that
//! are all outside it is refused by the kernel (`EINVAL`, as under any cpuset).

use std::collections::BTreeMap;

use crate::cpuset::CpuSet;
use crate::sched;

/// The remembered pins of a workload's threads, by thread id.
#[derive(Debug, Clone, Default)]
pub struct PinWatch {
    /// Every CPU the workload is managed on.
    all: CpuSet,
    pins: BTreeMap<i32, CpuSet>,
}

impl PinWatch {
    /// A watch for a workload managed on `all`.
    pub fn new(all: CpuSet) -> Self {
        Self { all, pins: BTreeMap::new() }
    }

    /// Notes thread `tid` seen with affinity `seen` while the workload's cpuset is `active`.
    /// Narrower than `active`: its pin. As wide as every managed CPU: not pinned (any more).
    /// As wide as a shrunk cpuset: nothing learned, a remembered pin stays.
    pub fn note(&mut self, tid: i32, seen: &CpuSet, active: &CpuSet) {
        let seen = seen.intersection(&self.all);
        if seen.is_subset(active) && seen != *active && !seen.is_empty() {
            self.pins.insert(tid, seen);
        } else if seen == self.all {
            self.pins.remove(&tid);
        }
    }

    /// Reads the affinity of every thread of `tids` (the workload's, now) with the cpuset at
    /// `active`, and forgets threads that are gone.
    pub fn observe(&mut self, tids: &[i32], active: &CpuSet) {
        let live: std::collections::BTreeSet<i32> = tids.iter().copied().collect();
        self.pins.retain(|t, _| live.contains(t));
        self.observe_more(tids, active);
    }

    /// [`PinWatch::observe`] for some of the workload's threads: forgets none.
    pub fn observe_more(&mut self, tids: &[i32], active: &CpuSet) {
        for &tid in tids {
            // A thread that exited since it was listed has nothing to keep.
            if let Ok(seen) = sched::affinity(tid) {
                self.note(tid, &seen, active);
            }
        }
    }

    /// Every CPU a remembered pin holds.
    pub fn pinned(&self) -> CpuSet {
        self.pins.values().fold(CpuSet::new(), |acc, p| acc.union(p))
    }

    /// The remembered pins, by thread id.
    pub fn pins(&self) -> impl Iterator<Item = (i32, &CpuSet)> {
        self.pins.iter().map(|(t, p)| (*t, p))
    }

    /// Gives each live pinned thread its own mask back where the kernel changed it (a kernel
    /// before 6.2 after a cpuset write or move); returns how many it set. A pin the cpuset no
    /// longer holds, or a thread gone, is left alone.
    pub fn reapply(&self) -> usize {
        self.pins
            .iter()
            .filter(|(tid, pin)| sched::affinity(**tid).is_ok_and(|now| now.intersection(&self.all) != **pin))
            .filter(|(tid, pin)| sched::set_affinity(**tid, pin).is_ok())
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap()
    }

    #[test]
    fn a_mask_narrower_than_the_cpuset_is_a_pin() {
        let mut w = PinWatch::new(set("0-3"));
        w.note(10, &set("0-3"), &set("0-3"));
        w.note(11, &set("2"), &set("0-3"));
        w.note(12, &set("1,3"), &set("0-3"));
        assert_eq!(w.pinned(), set("1-3"));
        assert_eq!(w.pins().map(|(t, _)| t).collect::<Vec<_>>(), [11, 12]);
    }

    #[test]
    fn a_shrunk_cpuset_hides_a_pin_it_does_not_forget() {
        let mut w = PinWatch::new(set("0-1"));
        w.note(7, &set("1"), &set("0-1"));
        // Consolidated onto vCPU 1: the kernel reports {1}, as for an unpinned thread.
        w.note(7, &set("1"), &set("1"));
        w.note(8, &set("1"), &set("1"));
        assert_eq!(w.pins().collect::<Vec<_>>(), [(7, &set("1"))]);
        // Every CPU back and the thread widened its mask: no pin any more.
        w.note(7, &set("0-1"), &set("0-1"));
        assert!(w.pinned().is_empty());
    }

    #[test]
    fn cpus_outside_the_managed_set_do_not_count() {
        let mut w = PinWatch::new(set("0-1"));
        // The online CPUs beyond the managed ones (`--cpus 0-1` on a 4-vCPU VM).
        w.note(3, &set("0-3"), &set("0-1"));
        w.note(4, &set("1-3"), &set("0-1"));
        assert_eq!(w.pinned(), set("1"));
    }

    #[test]
    fn the_calling_thread_is_watched_and_forgotten_when_gone() {
        let me = sched::gettid();
        let mut w = PinWatch::new(sched::affinity(0).unwrap());
        w.observe(&[me, i32::MAX], &sched::affinity(0).unwrap());
        assert!(w.pinned().is_empty(), "the test thread is not pinned");
        w.note(me, &set("0"), &set("0-1"));
        w.observe(&[], &set("0-1"));
        assert!(w.pins().next().is_none());
    }
}
