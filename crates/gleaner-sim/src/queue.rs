//! The event queue, ordered by `(time, seq)`: a tournament tree of the pCPUs' boundaries, a
//! sorted FIFO lane per fixed delay, and a binary min-heap for the rest.
//!
//! `seq` is a global insertion counter, so events at the same nanosecond pop in the order they
//! were scheduled (FIFO tie-breaking): the model is deterministic by construction. Payloads are
//! small `Copy` values; nothing is allocated per event once the heap has grown to its working
//! size. Cancellation is lazy: timers carry a generation number that the handler compares with
//! the owner's current one, so a stale event is dropped when it pops.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

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
    /// The host's periodic load balancing.
    HostBalance,
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
/// Per-pCPU boundaries live in a separate tournament tree (one slot per pCPU, updated in place),
/// because they are rescheduled on almost every event: lazy cancellation would fill the main
/// heap with stale entries. Events scheduled a fixed delay after the current time (an IPI's
/// flight, a sleep of a fixed length) go to a FIFO lane per delay instead of the heap: as the
/// clock never goes back, a lane is already sorted, so it is a queue (a heap pop's sift was
/// 6% of a run, mostly mispredicted branches). All of them order by `(time, seq)` with one
/// shared counter, so the merged order is the same total FIFO order.
#[derive(Debug, Default)]
pub struct EventQueue {
    heap: BinaryHeap<Entry>,
    lanes: Vec<Lane>,
    /// The earliest `(time, seq)` of the heap and the lanes and where it is (a lane's index or
    /// [`FROM_HEAP`]), kept up to date by pushes and pops, so that a pop that takes a pCPU's
    /// event (most of them) compares with one key instead of looking at every lane.
    head: Option<(Ns, u64, usize)>,
    seq: u64,
    slots: Tournament,
}

/// Events pushed `delay` after the clock, in push order, which is `(time, seq)` order.
#[derive(Debug)]
struct Lane {
    delay: Ns,
    q: VecDeque<Entry>,
}

/// Lanes at most: the delays a model uses are a few costs (IPI, IPI + yield wake, interrupt)
/// and fixed sleeps; further delays go to the heap.
const MAX_LANES: usize = 4;

/// Where the earliest heap or lane event is.
const FROM_HEAP: usize = usize::MAX;

/// A tournament (winner) tree over the pCPUs: at most one `(time, seq)` per key, updated in
/// place, the earliest on top.
///
/// Every pCPU event moves its own key (pop, then reschedule later), so the operation that
/// matters is "change one key"; an indexed binary heap did that with a sift of data-dependent,
/// badly predicted branches (a fifth of the run time at 64 pCPUs). Here an update walks the
/// fixed path from the leaf to the root, replaying one match per level against the sibling
/// subtree's winner: the siblings are off the path, so their loads do not wait for the walk,
/// and each match is comparisons and conditional moves (no mispredictions, no position index
/// to maintain). Measured alone at 64 keys: about 15 ns per update against 50 for the heap.
///
/// `(time, seq)` are kept as two `u64`s rather than one `u128`: the backend turns a selection
/// of `u128`s in a loop back into a branch, but keeps conditional moves of `u64`s. The key
/// rides in the low [`KEY_BITS`] of the second word (`seq << KEY_BITS | key`): seqs are unique,
/// so the order is still `(time, seq)`, and a match moves two words instead of three. The two
/// words live in two arrays, so that a node's index addresses both without a multiply.
/// [`ABSENT`] marks a key without an event.
#[derive(Debug)]
struct Tournament {
    /// Node `i` (1-based; children `2i`, `2i + 1`) holds the winner of its subtree, its time
    /// in `times[i]` and its tag in `tags[i]`; the leaves are node `n + key` with
    /// `n = times.len() / 2`, a power of two, and node 1 is the overall winner (node 0 is
    /// unused). Both arrays have the same length.
    times: Vec<Ns>,
    tags: Vec<u64>,
}

/// One match's winner: its time and `seq << KEY_BITS | key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Node {
    time: Ns,
    tag: u64,
}

impl Node {
    /// `(time, tag)` as one number, for a single comparison.
    #[inline]
    fn packed(self) -> u128 {
        (u128::from(self.time) << 64) | u128::from(self.tag)
    }
}

/// Bits of a tag that hold the key: pCPUs are at most 4096 (scenario validation).
const KEY_BITS: u32 = 16;

/// A key without an event: after every real event, even one at the same time (its tag is
/// the largest). Its time is `Ns::MAX - 1`, so that no match overflows; no real event is at
/// `Ns::MAX` (the engine cancels a pCPU's boundary instead).
const ABSENT: Node = Node { time: Ns::MAX - 1, tag: u64::MAX };

impl Default for Tournament {
    fn default() -> Self {
        // One leaf, which is also the root.
        Self { times: vec![ABSENT.time; 2], tags: vec![ABSENT.tag; 2] }
    }
}

impl Tournament {
    /// Number of leaves.
    #[inline]
    fn leaves(&self) -> usize {
        self.times.len() / 2
    }

    #[inline]
    fn node(&self, i: usize) -> Node {
        Node { time: self.times[i], tag: self.tags[i] }
    }

    /// Makes room for key `k` (doubling the leaves and rebuilding; only while a run starts).
    #[cold]
    fn grow(&mut self, k: usize) {
        assert!(k < 1 << KEY_BITS, "tournament key {k} out of range");
        let old = self.leaves();
        let n = (k + 1).next_power_of_two();
        let mut tree = vec![ABSENT; 2 * n];
        for (i, slot) in tree[n..n + old].iter_mut().enumerate() {
            *slot = self.node(old + i);
        }
        for i in (1..n).rev() {
            let (l, r) = (tree[2 * i], tree[2 * i + 1]);
            tree[i] = if r.packed() < l.packed() { r } else { l };
        }
        self.times = tree.iter().map(|n| n.time).collect();
        self.tags = tree.iter().map(|n| n.tag).collect();
    }

    /// Sets key `k`'s leaf and replays the matches on its path to the root.
    /// Always inlined: out of line, the call and the spills around the unrolled walks cost 2.4%
    /// of the instructions on `scale`.
    #[inline(always)]
    fn update(&mut self, k: usize, best: Node) {
        if k >= self.leaves() {
            self.grow(k);
        }
        // The path's length is the tree's depth (log2 of the leaves), fixed once the run has
        // started: a walk of constant length per common depth unrolls (no loop counter, no
        // exit branch, +1.5% events/s at 64 pCPUs), the rest share a loop.
        let depth = self.leaves().trailing_zeros();
        let times = &mut self.times[..];
        let tags = &mut self.tags[..times.len()];
        let node = times.len() / 2 + k;
        match depth {
            1 => walk(times, tags, node, best, 1),
            2 => walk(times, tags, node, best, 2),
            3 => walk(times, tags, node, best, 3),
            4 => walk(times, tags, node, best, 4),
            5 => walk(times, tags, node, best, 5),
            6 => walk(times, tags, node, best, 6),
            d => walk(times, tags, node, best, d),
        }
    }

    #[inline]
    fn set(&mut self, key: u32, time: Ns, seq: u64) {
        // 2^48 events: a year of one run at ten million events per second.
        assert!(seq < 1 << (64 - KEY_BITS), "event sequence number overflow");
        debug_assert!(time != Ns::MAX, "an event at Ns::MAX would overflow a match");
        self.update(key as usize, Node { time, tag: seq << KEY_BITS | u64::from(key) });
    }

    fn remove(&mut self, key: u32) {
        let k = key as usize;
        if k < self.leaves() && self.node(self.leaves() + k) != ABSENT {
            self.update(k, ABSENT);
        }
    }

    /// The earliest `(time, seq, key)`.
    #[inline]
    fn peek(&self) -> Option<(Ns, u64, u32)> {
        let w = self.node(1);
        (w != ABSENT).then_some((w.time, w.tag >> KEY_BITS, (w.tag & ((1 << KEY_BITS) - 1)) as u32))
    }

    /// Keys that hold an event (a scan of the leaves: only tests ask).
    fn len(&self) -> usize {
        (self.leaves()..self.times.len()).filter(|&i| self.node(i) != ABSENT).count()
    }
}

/// One match of a path walk: the winner of `(time, tag)` and the sibling subtree's winner
/// at `sib`. `(st, sg) < (time, tag)` is computed as `st < time + [sg < tag]`: equal times
/// fall to the tags, and the carry is a compare's flag (an add-with-carry), fewer operations
/// than `st < time || st == time && sg < tag`. No overflow: every time is below `Ns::MAX`
/// ([`ABSENT`]'s is `Ns::MAX - 1`, and its tag the largest, so it loses every match to a real
/// event, even one at the same time). Which side wins is data, not a pattern: conditional
/// moves, not a branch that would mispredict.
#[inline(always)]
fn replay(times: &[Ns], tags: &[u64], sib: usize, (time, tag): (Ns, u64)) -> (Ns, u64) {
    let (st, sg) = (times[sib], tags[sib]);
    let lt = st < time + u64::from(sg < tag);
    (std::hint::select_unpredictable(lt, st, time), std::hint::select_unpredictable(lt, sg, tag))
}

/// Sets leaf `node` to `best` and replays the `depth` matches above it. Inlined where it is
/// called with a constant depth, the loop unrolls. The length is a power of two: masking
/// keeps every index in range, which the compiler can see, so the walk has no bounds checks
/// (`node` never exceeds it anyway).
#[inline(always)]
fn walk(times: &mut [Ns], tags: &mut [u64], mut node: usize, best: Node, depth: u32) {
    let mask = times.len() - 1;
    let mut w = (best.time, best.tag);
    times[node & mask] = w.0;
    tags[node & mask] = w.1;
    for _ in 0..depth {
        w = replay(times, tags, (node ^ 1) & mask, w);
        node /= 2;
        times[node & mask] = w.0;
        tags[node & mask] = w.1;
    }
}

impl EventQueue {
    pub fn with_capacity(n: usize) -> Self {
        Self { heap: BinaryHeap::with_capacity(n), lanes: Vec::new(), head: None, seq: 0, slots: Tournament::default() }
    }

    #[inline]
    fn next_seq(&mut self) -> u64 {
        let seq = self.seq;
        self.seq += 1;
        seq
    }

    /// Schedules (or moves) pCPU `p`'s single boundary event to `time`.
    #[inline]
    pub fn set_pcpu(&mut self, p: u32, time: Ns) {
        let seq = self.next_seq();
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
        let seq = self.next_seq();
        self.heap.push(Entry { time, seq, ev });
        self.pushed(time, seq, FROM_HEAP);
    }

    /// Keeps `head` after a push of `(time, seq)` to `from`: the newest seq, so it comes
    /// first only at an earlier time.
    #[inline]
    fn pushed(&mut self, time: Ns, seq: u64, from: usize) {
        if self.head.is_none_or(|(t, _, _)| time < t) {
            self.head = Some((time, seq, from));
        }
    }

    /// Schedules `ev` at `now + delay`, `now` being the clock, which never goes back: the
    /// same order as `push(now + delay, ev)`, in the lane of that delay.
    #[inline]
    pub fn push_after(&mut self, now: Ns, delay: Ns, ev: Ev) {
        let time = now + delay;
        let seq = self.next_seq();
        let e = Entry { time, seq, ev };
        let lane = match self.lanes.iter().position(|l| l.delay == delay) {
            Some(i) => i,
            None if self.lanes.len() < MAX_LANES => {
                self.lanes.push(Lane { delay, q: VecDeque::new() });
                self.lanes.len() - 1
            }
            None => FROM_HEAP,
        };
        // A clock that went back (only a caller's mistake) would unsort the lane: the heap
        // keeps the order whatever the times.
        let from = match lane {
            FROM_HEAP => FROM_HEAP,
            i if self.lanes[i].q.back().is_some_and(|b| b.time > time) => FROM_HEAP,
            i => i,
        };
        if from == FROM_HEAP {
            self.heap.push(e);
        } else {
            self.lanes[from].q.push_back(e);
        }
        self.pushed(time, seq, from);
    }

    /// The earliest `(time, seq)` of the heap and the lanes, and where it is (a lane's index
    /// or [`FROM_HEAP`]).
    #[inline]
    fn first_queued(&self) -> Option<(Ns, u64, usize)> {
        let mut best = self.heap.peek().map(|e| (e.time, e.seq, FROM_HEAP));
        for (i, l) in self.lanes.iter().enumerate() {
            if let Some(e) = l.q.front() {
                if best.is_none_or(|(t, s, _)| (e.time, e.seq) < (t, s)) {
                    best = Some((e.time, e.seq, i));
                }
            }
        }
        best
    }

    /// The earliest event, FIFO among equal times. A returned `Ev::Pcpu` stays scheduled until
    /// the caller moves or cancels it: handling it must call `set_pcpu` or `cancel_pcpu`.
    #[inline]
    pub fn pop(&mut self) -> Option<(Ns, Ev)> {
        // No slot, or no queued event, sorts last; with neither, the heap pops `None`.
        let (st, ss, p) = self.slots.peek().unwrap_or((Ns::MAX, u64::MAX, 0));
        let (qt, qs, from) = self.head.unwrap_or((Ns::MAX, u64::MAX, FROM_HEAP));
        if st < qt || (st == qt && ss < qs) {
            // The slot stays: the handler of a pCPU event always moves or cancels it
            // (`set_pcpu`/`cancel_pcpu`), which saves a removal and a re-insertion.
            return Some((st, Ev::Pcpu { p, gen: 0 }));
        }
        let e = if from == FROM_HEAP { self.heap.pop() } else { self.lanes[from].q.pop_front() };
        self.head = self.first_queued();
        e.map(|e| (e.time, e.ev))
    }

    /// Time of the earliest event.
    pub fn peek_time(&self) -> Option<Ns> {
        match (self.slots.peek(), self.head) {
            (Some(s), Some(e)) => Some(s.0.min(e.0)),
            (Some(s), None) => Some(s.0),
            (None, e) => e.map(|e| e.0),
        }
    }

    pub fn len(&self) -> usize {
        self.heap.len() + self.lanes.iter().map(|l| l.q.len()).sum::<usize>() + self.slots.len()
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
            vec![(10, Ev::Kick { v: 1 }), (10, Ev::Kick { v: 2 }), (10, Ev::Kick { v: 0 }), (20, Ev::HostPeriod), (30, Ev::Kick { v: 3 }),]
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
        // Randomized: the tournament tree agrees with a sort.
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

    /// Lanes (more delays than lanes, so some spill to the heap), the heap and the pCPU slots
    /// pop in the one `(time, seq)` order a sorted list of everything pushed gives.
    #[test]
    fn lanes_heap_and_slots_pop_in_one_fifo_order() {
        let mut q = EventQueue::default();
        let mut want = std::collections::BTreeMap::new();
        let mut slot_seq = std::collections::BTreeMap::new();
        let (mut now, mut seq, mut x) = (0u64, 0u64, 7u64);
        for i in 0..20_000u32 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            match (x >> 33) % 5 {
                0 | 1 => {
                    let delay = [11_000, 28_000, 0, 55_000, 3, 11_000, 7][(x >> 40) as usize % 7];
                    q.push_after(now, delay, Ev::Kick { v: i });
                    want.insert((now + delay, seq), Ev::Kick { v: i });
                }
                2 => {
                    let t = now + (x >> 44) % 50_000;
                    q.push(t, Ev::HostBalance);
                    want.insert((t, seq), Ev::HostBalance);
                }
                3 => {
                    let p = (x >> 50) as u32 % 8;
                    let t = now + (x >> 45) % 30_000;
                    q.set_pcpu(p, t);
                    if let Some(old) = slot_seq.insert(p, (t, seq)) {
                        want.remove(&old);
                    }
                    want.insert((t, seq), Ev::Pcpu { p, gen: 0 });
                }
                _ => {
                    let Some((t, ev)) = q.pop() else { continue };
                    let (&(wt, ws), &wev) = want.iter().next().expect("both empty together");
                    assert_eq!((t, ev), (wt, wev));
                    want.remove(&(wt, ws));
                    if let Ev::Pcpu { p, .. } = ev {
                        q.cancel_pcpu(p);
                        slot_seq.remove(&p);
                    }
                    now = t;
                    continue;
                }
            }
            seq += 1;
        }
        assert_eq!(q.len(), want.len());
    }

    /// Every tree depth, the unrolled ones (up to 64 keys) and the looped one beyond, keeps
    /// the earliest `(time, seq)` on top: many ties (times from a small range) and events at
    /// the last time an event may have (`Ns::MAX - 1`, the absent key's time), against a
    /// sorted map of every key's event.
    #[test]
    fn every_depth_keeps_the_earliest_on_top() {
        for keys in [1u32, 2, 3, 5, 64, 65, 200] {
            let mut t = Tournament::default();
            let mut want = std::collections::BTreeMap::new();
            let mut of_key = std::collections::BTreeMap::new();
            let mut x = 99u64 + u64::from(keys);
            for seq in 0..5_000u64 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let k = (x >> 40) as u32 % keys;
                if let Some(old) = of_key.remove(&k) {
                    want.remove(&old);
                }
                if (x >> 20).is_multiple_of(4) {
                    t.remove(k);
                } else {
                    let time = if (x >> 24).is_multiple_of(16) { Ns::MAX - 1 } else { (x >> 50) % 8 };
                    t.set(k, time, seq);
                    want.insert((time, seq), k);
                    of_key.insert(k, (time, seq));
                }
                assert_eq!(t.peek(), want.iter().next().map(|(&(time, seq), &k)| (time, seq, k)), "{keys} keys, step {seq}");
            }
            assert_eq!(t.len(), want.len());
        }
    }

    #[test]
    fn entry_is_small() {
        assert!(std::mem::size_of::<Ev>() <= 12);
        assert!(std::mem::size_of::<Entry>() <= 32);
    }
}
