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
///
/// Per-pCPU boundaries live in a separate indexed heap (one slot per pCPU, updated in place),
/// because they are rescheduled on almost every event: lazy cancellation would fill the main
/// heap with stale entries. Both heaps order by `(time, seq)` with one shared counter, so the
/// merged order is the same total FIFO order.
#[derive(Debug, Default)]
pub struct EventQueue {
    heap: BinaryHeap<Entry>,
    seq: u64,
    slots: IndexedHeap,
}

/// A binary min-heap of at most one `(time, seq)` per key, with in-place update and removal.
///
/// `(time, seq)` is packed into one `u128` (time in the high half) so an order test is one
/// comparison, and sifting moves a hole instead of swapping (one store per level).
#[derive(Debug, Default)]
struct IndexedHeap {
    /// (time << 64 | seq, key)
    heap: Vec<(u128, u32)>,
    /// Position of each key in `heap`, `u32::MAX` if absent.
    pos: Vec<u32>,
}

#[inline]
fn pack(time: Ns, seq: u64) -> u128 {
    (u128::from(time) << 64) | u128::from(seq)
}

impl IndexedHeap {
    /// Moves `item` up from the hole at `i` to its place.
    #[inline]
    fn up(&mut self, mut i: usize, item: (u128, u32)) {
        while i > 0 {
            let parent = (i - 1) / 2;
            let pe = self.heap[parent];
            if item.0 < pe.0 {
                self.heap[i] = pe;
                self.pos[pe.1 as usize] = i as u32;
                i = parent;
            } else {
                break;
            }
        }
        self.heap[i] = item;
        self.pos[item.1 as usize] = i as u32;
    }

    /// Moves `item` down from the hole at `i` to its place.
    #[inline]
    fn down(&mut self, mut i: usize, item: (u128, u32)) {
        let n = self.heap.len();
        loop {
            let l = 2 * i + 1;
            if l >= n {
                break;
            }
            let r = l + 1;
            let c = if r < n && self.heap[r].0 < self.heap[l].0 { r } else { l };
            let ce = self.heap[c];
            if ce.0 < item.0 {
                self.heap[i] = ce;
                self.pos[ce.1 as usize] = i as u32;
                i = c;
            } else {
                break;
            }
        }
        self.heap[i] = item;
        self.pos[item.1 as usize] = i as u32;
    }

    fn set(&mut self, key: u32, time: Ns, seq: u64) {
        let k = key as usize;
        if k >= self.pos.len() {
            self.pos.resize(k + 1, u32::MAX);
        }
        let item = (pack(time, seq), key);
        let p = self.pos[k];
        if p == u32::MAX {
            self.heap.push(item);
            let i = self.heap.len() - 1;
            self.up(i, item);
        } else {
            let i = p as usize;
            if self.heap[i].0 < item.0 {
                self.down(i, item);
            } else {
                self.up(i, item);
            }
        }
    }

    fn remove(&mut self, key: u32) {
        let k = key as usize;
        let Some(&p) = self.pos.get(k) else { return };
        if p == u32::MAX {
            return;
        }
        let i = p as usize;
        self.pos[k] = u32::MAX;
        let last = self.heap.pop().expect("a present key is in the heap");
        if i < self.heap.len() {
            // Put the former last element in the hole at i, sifting whichever way it must go.
            if i > 0 && last.0 < self.heap[(i - 1) / 2].0 {
                self.up(i, last);
            } else {
                self.down(i, last);
            }
        }
    }

    /// The earliest `(time, seq, key)`.
    #[inline]
    fn peek(&self) -> Option<(Ns, u64, u32)> {
        self.heap.first().map(|&(k, key)| ((k >> 64) as Ns, k as u64, key))
    }

    fn len(&self) -> usize {
        self.heap.len()
    }
}

impl EventQueue {
    pub fn with_capacity(n: usize) -> Self {
        Self { heap: BinaryHeap::with_capacity(n), seq: 0, slots: IndexedHeap::default() }
    }

    /// Schedules (or moves) pCPU `p`'s single boundary event to `time`.
    #[inline]
    pub fn set_pcpu(&mut self, p: u32, time: Ns) {
        let seq = self.seq;
        self.seq += 1;
        self.slots.set(p, time, seq);
    }

    /// Cancels pCPU `p`'s boundary event.
    #[inline]
    pub fn cancel_pcpu(&mut self, p: u32) {
        self.slots.remove(p);
    }

    /// Schedules `ev` at `time`.
    #[inline]
    pub fn push(&mut self, time: Ns, ev: Ev) {
        let seq = self.seq;
        self.seq += 1;
        self.heap.push(Entry { time, seq, ev });
    }

    /// The earliest event, FIFO among equal times. A returned `Ev::Pcpu` stays scheduled until
    /// the caller moves or cancels it: handling it must call `set_pcpu` or `cancel_pcpu`.
    #[inline]
    pub fn pop(&mut self) -> Option<(Ns, Ev)> {
        let slot_first = match (self.slots.peek(), self.heap.peek()) {
            (Some(s), Some(e)) => (s.0, s.1) < (e.time, e.seq),
            (Some(_), None) => true,
            (None, _) => false,
        };
        if slot_first {
            // The slot stays: the handler of a pCPU event always moves or cancels it
            // (`set_pcpu`/`cancel_pcpu`), which saves a removal and a re-insertion.
            self.slots.peek().map(|(t, _, p)| (t, Ev::Pcpu { p, gen: 0 }))
        } else {
            self.heap.pop().map(|e| (e.time, e.ev))
        }
    }

    /// Time of the earliest event.
    pub fn peek_time(&self) -> Option<Ns> {
        match (self.slots.peek(), self.heap.peek()) {
            (Some(s), Some(e)) => Some(s.0.min(e.time)),
            (Some(s), None) => Some(s.0),
            (None, e) => e.map(|e| e.time),
        }
    }

    pub fn len(&self) -> usize {
        self.heap.len() + self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
    fn pcpu_slots_merge_in_fifo_order_and_move_in_place() {
        let mut q = EventQueue::default();
        q.set_pcpu(0, 50);
        q.push(10, Ev::Kick { v: 9 });
        q.set_pcpu(1, 10);
        q.set_pcpu(0, 5);
        q.set_pcpu(2, 7);
        q.cancel_pcpu(2);
        assert_eq!(q.len(), 3);
        assert_eq!(q.pop(), Some((5, Ev::Pcpu { p: 0, gen: 0 })));
        q.cancel_pcpu(0);
        assert_eq!(q.pop(), Some((10, Ev::Kick { v: 9 })), "pushed before pCPU 1's slot");
        assert_eq!(q.pop(), Some((10, Ev::Pcpu { p: 1, gen: 0 })));
        q.set_pcpu(1, 12);
        assert_eq!(q.pop(), Some((12, Ev::Pcpu { p: 1, gen: 0 })));
        q.cancel_pcpu(1);
        assert_eq!(q.pop(), None);
        // Randomized: the indexed heap agrees with a sort.
        let mut x: u64 = 99;
        let mut want = std::collections::BTreeMap::new();
        for i in 0..2000u32 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let p = (x >> 33) as u32 % 64;
            if i % 7 == 0 {
                q.cancel_pcpu(p);
                want.remove(&p);
            } else {
                let t = (x >> 40) % 1000;
                q.set_pcpu(p, t);
                want.insert(p, t);
            }
        }
        let mut got: Vec<Ns> = std::iter::from_fn(|| {
            let (t, ev) = q.pop()?;
            if let Ev::Pcpu { p, .. } = ev {
                q.cancel_pcpu(p);
            }
            Some(t)
        })
        .collect();
        let mut exp: Vec<Ns> = want.values().copied().collect();
        exp.sort_unstable();
        assert!(got.windows(2).all(|w| w[0] <= w[1]));
        got.sort_unstable();
        assert_eq!(got, exp);
    }

    #[test]
    fn entry_is_small() {
        assert!(std::mem::size_of::<Ev>() <= 12);
        assert!(std::mem::size_of::<Entry>() <= 32);
    }
}
