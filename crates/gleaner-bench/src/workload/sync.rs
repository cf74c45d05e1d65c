//! Blocking primitives for the kernels, built on `std::sync::{Mutex, Condvar}` (futex-based,
//! like glibc's pthread mutex and condvar) with a deadline on every wait: a lost wakeup or a
//! dead peer ends the run with an error instead of hanging it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a single wait may last before the kernel gives up.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A wait that did not end in time, or a run aborted by another thread's failure.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{what}: no progress for {timeout_ms} ms (lost wakeup or stuck peer)")]
    Stalled { what: &'static str, timeout_ms: u128 },
    #[error("{what}: aborted because another thread failed")]
    Aborted { what: &'static str },
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in a kernel thread is re-raised by the scope; the data stays usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Wait on `cv` until `done(&state)` holds, at most `timeout`.
fn wait_until<'a, T>(
    what: &'static str,
    cv: &Condvar,
    mut g: MutexGuard<'a, T>,
    timeout: Duration,
    mut done: impl FnMut(&T) -> bool,
) -> Result<MutexGuard<'a, T>, SyncError> {
    let deadline = Instant::now() + timeout;
    while !done(&g) {
        let now = Instant::now();
        if now >= deadline {
            return Err(SyncError::Stalled { what, timeout_ms: timeout.as_millis() });
        }
        g = cv.wait_timeout(g, deadline - now).unwrap_or_else(std::sync::PoisonError::into_inner).0;
    }
    Ok(g)
}

#[derive(Debug)]
struct QueueState<T> {
    items: VecDeque<T>,
    closed: bool,
    aborted: bool,
}

/// A bounded multi-producer multi-consumer queue (mutex + two condvars), like the queues
/// between PARSEC dedup's stages.
#[derive(Debug)]
pub struct BoundedQueue<T> {
    state: Mutex<QueueState<T>>,
    not_empty: Condvar,
    not_full: Condvar,
    cap: usize,
    timeout: Duration,
}

impl<T> BoundedQueue<T> {
    pub fn new(cap: usize) -> Self {
        Self::with_timeout(cap, STALL_TIMEOUT)
    }

    /// A queue whose waits give up after `timeout`.
    pub fn with_timeout(cap: usize, timeout: Duration) -> Self {
        Self {
            state: Mutex::new(QueueState { items: VecDeque::with_capacity(cap), closed: false, aborted: false }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            cap: cap.max(1),
            timeout,
        }
    }

    /// A queue without a bound, whose `push` never blocks (an open-loop arrival process must
    /// not be slowed down by its server); its waits give up after `timeout`.
    pub fn unbounded_with_timeout(timeout: Duration) -> Self {
        Self {
            state: Mutex::new(QueueState { items: VecDeque::new(), closed: false, aborted: false }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            cap: usize::MAX,
            timeout,
        }
    }

    /// Append `item`, blocking while the queue is full.
    pub fn push(&self, item: T) -> Result<(), SyncError> {
        let cap = self.cap;
        let mut g = wait_until("queue push", &self.not_full, lock(&self.state), self.timeout, |s| s.items.len() < cap || s.aborted)?;
        if g.aborted {
            return Err(SyncError::Aborted { what: "queue push" });
        }
        g.items.push_back(item);
        drop(g);
        self.not_empty.notify_one();
        Ok(())
    }

    /// Take the oldest item, blocking while empty; `None` once closed and drained.
    pub fn pop(&self) -> Result<Option<T>, SyncError> {
        let mut g =
            wait_until("queue pop", &self.not_empty, lock(&self.state), self.timeout, |s| !s.items.is_empty() || s.closed || s.aborted)?;
        if g.aborted {
            return Err(SyncError::Aborted { what: "queue pop" });
        }
        let item = g.items.pop_front();
        drop(g);
        if item.is_some() {
            self.not_full.notify_one();
        }
        Ok(item)
    }

    /// No more pushes: consumers drain what is left and then get `None`.
    pub fn close(&self) {
        lock(&self.state).closed = true;
        self.not_empty.notify_all();
    }

    /// Wake every waiter with an error (another stage failed).
    pub fn abort(&self) {
        lock(&self.state).aborted = true;
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }
}

#[derive(Debug)]
struct BarrierState {
    count: usize,
    generation: u64,
    aborted: bool,
}

/// A blocking barrier (mutex + condvar generation counter), like `pthread_barrier_wait`.
#[derive(Debug)]
pub struct Barrier {
    state: Mutex<BarrierState>,
    cv: Condvar,
    n: usize,
    timeout: Duration,
}

impl Barrier {
    pub fn new(n: usize) -> Self {
        Self::with_timeout(n, STALL_TIMEOUT)
    }

    /// A barrier whose waits give up after `timeout`.
    pub fn with_timeout(n: usize, timeout: Duration) -> Self {
        Self { state: Mutex::new(BarrierState { count: 0, generation: 0, aborted: false }), cv: Condvar::new(), n, timeout }
    }

    /// Block until `n` threads have arrived; true for exactly one thread per phase.
    pub fn wait(&self) -> Result<bool, SyncError> {
        let mut g = lock(&self.state);
        if g.aborted {
            return Err(SyncError::Aborted { what: "barrier" });
        }
        g.count += 1;
        if g.count == self.n {
            g.count = 0;
            g.generation += 1;
            drop(g);
            self.cv.notify_all();
            return Ok(true);
        }
        let gen = g.generation;
        let g = wait_until("barrier", &self.cv, g, self.timeout, |s| s.generation != gen || s.aborted)?;
        if g.generation == gen {
            return Err(SyncError::Aborted { what: "barrier" });
        }
        Ok(false)
    }

    pub fn abort(&self) {
        lock(&self.state).aborted = true;
        self.cv.notify_all();
    }
}

/// A one-slot mailbox for producer/consumer hand-offs.
#[derive(Debug)]
pub struct Mailbox<T> {
    slot: Mutex<(Option<T>, bool)>,
    cv: Condvar,
    timeout: Duration,
}

impl<T> Mailbox<T> {
    pub fn new() -> Self {
        Self::with_timeout(STALL_TIMEOUT)
    }

    /// A mailbox whose waits give up after `timeout`.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self { slot: Mutex::new((None, false)), cv: Condvar::new(), timeout }
    }

    pub fn put(&self, v: T) -> Result<(), SyncError> {
        let mut g = wait_until("mailbox put", &self.cv, lock(&self.slot), self.timeout, |s| s.0.is_none() || s.1)?;
        if g.1 {
            return Err(SyncError::Aborted { what: "mailbox put" });
        }
        g.0 = Some(v);
        drop(g);
        self.cv.notify_all();
        Ok(())
    }

    pub fn take(&self) -> Result<T, SyncError> {
        let mut g = wait_until("mailbox take", &self.cv, lock(&self.slot), self.timeout, |s| s.0.is_some() || s.1)?;
        match g.0.take() {
            Some(v) => {
                drop(g);
                self.cv.notify_all();
                Ok(v)
            }
            None => Err(SyncError::Aborted { what: "mailbox take" }),
        }
    }

    pub fn abort(&self) {
        lock(&self.slot).1 = true;
        self.cv.notify_all();
    }
}

impl<T> Default for Mailbox<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// A user-level spinning barrier, volrend's (survey, listing 1):
/// `LOCK(CountLock); Counter--; UNLOCK(CountLock); while (Counter);` made reusable with a
/// generation number. Spinning checks the deadline every 4096 iterations.
#[derive(Debug)]
pub struct SpinBarrier {
    count_lock: Mutex<usize>,
    generation: std::sync::atomic::AtomicU64,
    aborted: AtomicBool,
    n: usize,
    timeout: Duration,
}

impl SpinBarrier {
    pub fn new(n: usize) -> Self {
        Self::with_timeout(n, STALL_TIMEOUT)
    }

    /// A barrier whose spinning gives up after `timeout`.
    pub fn with_timeout(n: usize, timeout: Duration) -> Self {
        Self { count_lock: Mutex::new(n), generation: std::sync::atomic::AtomicU64::new(0), aborted: AtomicBool::new(false), n, timeout }
    }

    pub fn wait(&self) -> Result<(), SyncError> {
        let gen = self.generation.load(Ordering::Acquire);
        {
            let mut c = lock(&self.count_lock);
            *c -= 1;
            if *c == 0 {
                *c = self.n;
                self.generation.store(gen + 1, Ordering::Release);
                return Ok(());
            }
        }
        let deadline = Instant::now() + self.timeout;
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == gen {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(4096) {
                if self.aborted.load(Ordering::Relaxed) {
                    return Err(SyncError::Aborted { what: "spin barrier" });
                }
                if Instant::now() >= deadline {
                    return Err(SyncError::Stalled { what: "spin barrier", timeout_ms: self.timeout.as_millis() });
                }
            }
        }
        Ok(())
    }

    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_passes_items_in_order_and_closes() {
        let q = BoundedQueue::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..100u32 {
                    q.push(i).unwrap();
                }
                q.close();
            });
            let mut got = Vec::new();
            while let Some(v) = q.pop().unwrap() {
                got.push(v);
            }
            assert_eq!(got, (0..100).collect::<Vec<_>>());
        });
    }

    #[test]
    fn an_unbounded_queue_takes_every_push_without_a_consumer() {
        let q = BoundedQueue::unbounded_with_timeout(Duration::from_millis(50));
        for i in 0..10_000u32 {
            q.push(i).unwrap();
        }
        q.close();
        assert_eq!(q.pop().unwrap(), Some(0));
        assert_eq!(std::iter::from_fn(|| q.pop().unwrap()).count(), 9_999);
    }

    #[test]
    fn aborted_queue_and_barrier_return_errors_instead_of_blocking() {
        let q: BoundedQueue<u32> = BoundedQueue::new(1);
        q.abort();
        assert!(matches!(q.pop(), Err(SyncError::Aborted { .. })));
        let b = Barrier::new(2);
        b.abort();
        assert!(b.wait().is_err());
    }

    #[test]
    fn barriers_release_all_threads_each_phase() {
        let b = Barrier::new(3);
        let sb = SpinBarrier::new(3);
        let leaders = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..50 {
                        if b.wait().unwrap() {
                            leaders.fetch_add(1, Ordering::Relaxed);
                        }
                        sb.wait().unwrap();
                    }
                });
            }
        });
        assert_eq!(leaders.load(Ordering::Relaxed), 50);
    }
}
