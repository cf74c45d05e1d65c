//! The event queue: a binary min-heap keyed by `(time, seq)`.
//!
//! `seq` is a global insertion counter, so events at the same nanosecond pop in the order they
//! were scheduled (FIFO tie-breaking): the model is deterministic by construction. Payloads are
//! small `Copy` values; nothing is allocated per event once the heap has grown to its working
//! size. Cancellation is lazy: timers carry a generation number that the handler compares with
//! the owner's current one, so a stale event is dropped when it pops.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Simulated time in integer nanoseconds.
pub type Ns = u64;

/// What happens when an event pops. 12 bytes; the heap entry is 32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ev {
    /// The segment running on a pCPU reaches its next boundary (burst end, slice end, poll end...).
    Pcpu { p: u32, gen: u32 },
    /// An IPI (or a timer) reaches a vCPU.
    Kick { v: u32 },
    /// A thread's sleep or I/O completes.
    ThreadTimer { t: u32, gen: u32 },
    /// A Gleaner yielding thread's sleep ends.
    YielderTimer { v: u32, gen: u32 },
    /// A VM's Gleaner controller period ends.
    GleanerPeriod { vm: u32 },
    /// The host policy's monitoring period ends.
    HostPeriod,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    time: Ns,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        self.time == o.time && self.seq == o.seq
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    /// Reversed: `BinaryHeap` is a max-heap, we want the earliest `(time, seq)` on top.
    fn cmp(&self, o: &Self) -> Ordering {
        o.time.cmp(&self.time).then_with(|| o.seq.cmp(&self.seq))
    }
}

/// Min-heap of timed events with FIFO order among equal times.
#[derive(Debug, Default)]
pub struct EventQueue {
    heap: BinaryHeap<Entry>,
    seq: u64,
}

impl EventQueue {
    pub fn with_capacity(n: usize) -> Self {
        Self { heap: BinaryHeap::with_capacity(n), seq: 0 }
    }

    /// Schedules `ev` at `time`.
    #[inline]
    pub fn push(&mut self, time: Ns, ev: Ev) {
        let seq = self.seq;
        self.seq += 1;
        self.heap.push(Entry { time, seq, ev });
    }

    /// The earliest event, FIFO among equal times.
    #[inline]
    pub fn pop(&mut self) -> Option<(Ns, Ev)> {
        self.heap.pop().map(|e| (e.time, e.ev))
    }

    /// Time of the earliest event.
    pub fn peek_time(&self) -> Option<Ns> {
        self.heap.peek().map(|e| e.time)
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_time_order_fifo_among_ties() {
        let mut q = EventQueue::default();
        q.push(30, Ev::Kick { v: 3 });
        q.push(10, Ev::Kick { v: 1 });
        q.push(10, Ev::Kick { v: 2 });
        q.push(20, Ev::HostPeriod);
        q.push(10, Ev::Kick { v: 0 });
        let got: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            got,
            vec![
                (10, Ev::Kick { v: 1 }),
                (10, Ev::Kick { v: 2 }),
                (10, Ev::Kick { v: 0 }),
                (20, Ev::HostPeriod),
                (30, Ev::Kick { v: 3 }),
            ]
        );
        assert!(q.is_empty());
    }

    #[test]
    fn interleaved_push_pop_stays_ordered() {
        let mut q = EventQueue::default();
        let mut x: u64 = 12345;
        let mut last = 0;
        for i in 0..10_000u32 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            q.push(last + (x >> 40) % 1000, Ev::Kick { v: i });
            if i % 3 == 0 {
                let (t, _) = q.pop().expect("non-empty");
                assert!(t >= last);
                last = t;
            }
        }
        while let Some((t, _)) = q.pop() {
            assert!(t >= last);
            last = t;
        }
    }

    #[test]
    fn entry_is_small() {
        assert!(std::mem::size_of::<Ev>() <= 12);
        assert!(std::mem::size_of::<Entry>() <= 32);
    }
}
