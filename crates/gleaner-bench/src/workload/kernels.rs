//! The kernels. Each returns `(items completed, checksum)` after verifying its results, or a
//! [`CheckFailed`] / [`SyncError`] error.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::compute::{jump, seed, spin};
use super::sync::{Barrier, BoundedQueue, Mailbox, SpinBarrier, SyncError};
use super::{CheckFailed, Fault, Workload, WorkloadParams};

type KResult = anyhow::Result<(u64, u64)>;

fn check(w: Workload, ok: bool, detail: impl FnOnce() -> String) -> anyhow::Result<()> {
    if ok {
        Ok(())
    } else {
        Err(CheckFailed { workload: w, detail: detail() }.into())
    }
}

/// Join the scoped threads' results: the first error wins (after `abort` woke the others).
fn first_error<T>(results: Vec<std::thread::Result<Result<T, SyncError>>>) -> anyhow::Result<Vec<T>> {
    let mut out = Vec::with_capacity(results.len());
    let mut err: Option<anyhow::Error> = None;
    for r in results {
        match r {
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) => {
                // Prefer the root cause over the "aborted" errors it caused.
                if err.is_none() || !matches!(e, SyncError::Aborted { .. }) {
                    err = Some(e.into());
                }
            }
            Err(p) => std::panic::resume_unwind(p),
        }
    }
    match err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Split `total` into `parts` near-equal shares.
fn share(total: u64, parts: usize, i: usize) -> u64 {
    let parts = parts as u64;
    let i = i as u64;
    total / parts + u64::from(i < total % parts)
}

pub(super) fn run(w: Workload, p: &WorkloadParams, iters: u64) -> KResult {
    match w {
        Workload::Pipeline => pipeline(p, iters),
        Workload::Barrier => barrier(p, iters),
        Workload::Condvar => condvar(p, iters),
        Workload::Mutex => mutex(p, iters),
        Workload::SpinBarrier => spin_barrier(p, iters),
        Workload::Matmul => matmul(p),
        Workload::Freqsleep => freqsleep(p),
    }
}

const SALT_B: u64 = 0x5bd1_e995_0000_0001;

/// source -> q1 -> stage A (threads) -> q2 -> stage B (threads) -> q3 -> sink.
fn pipeline(p: &WorkloadParams, iters: u64) -> KResult {
    let w = Workload::Pipeline;
    let t = p.threads;
    let (q1, q2, q3) = pipeline_queues(p);
    let abort = || {
        q1.abort();
        q2.abort();
        q3.abort();
    };
    let live_a = AtomicU64::new(t as u64);
    let live_b = AtomicU64::new(t as u64);
    let fault = p.fault;
    let (sink, results) = std::thread::scope(|s| {
        let mut hs = Vec::new();
        hs.push(s.spawn(|| {
            let r = (|| {
                for id in 0..p.items {
                    if fault == Some(Fault::DropOneItem) && id == p.items / 2 {
                        continue;
                    }
                    q1.push(id)?;
                }
                q1.close();
                Ok(())
            })();
            aborting_on_error(r, abort)
        }));
        for _ in 0..t {
            hs.push(s.spawn(|| {
                let r = (|| {
                    while let Some(id) = q1.pop()? {
                        q2.push((id, spin(seed(1, id), iters)))?;
                    }
                    Ok(())
                })();
                stage_done(r, abort, &live_a, || q2.close())
            }));
        }
        for _ in 0..t {
            hs.push(s.spawn(|| {
                let r = (|| {
                    while let Some((id, v)) = q2.pop()? {
                        let mut out = spin(v ^ SALT_B, iters);
                        if fault == Some(Fault::CorruptOneItem) && id == 0 {
                            out ^= 1;
                        }
                        q3.push((id, out))?;
                    }
                    Ok(())
                })();
                stage_done(r, abort, &live_b, || q3.close())
            }));
        }
        let sink = s.spawn(|| -> anyhow::Result<(u64, u64)> {
            let r = (|| -> anyhow::Result<(u64, u64)> {
                let (mut n, mut sum) = (0u64, 0u64);
                let mut seen = vec![false; usize::try_from(p.items)?];
                while let Some((id, v)) = q3.pop()? {
                    let expect = jump(jump(seed(1, id), iters) ^ SALT_B, iters);
                    check(w, v == expect, || format!("item {id}: got {v:#x}, expected {expect:#x}"))?;
                    let slot = seen.get_mut(usize::try_from(id)?).ok_or_else(|| anyhow::anyhow!("item id {id} out of range"))?;
                    check(w, !*slot, || format!("item {id} delivered twice"))?;
                    *slot = true;
                    n += 1;
                    sum = sum.wrapping_add(v);
                }
                check(w, n == p.items, || format!("{n} of {} items arrived", p.items))?;
                Ok((n, sum))
            })();
            aborting_on_error(r, abort)
        });
        let results: Vec<_> = hs.into_iter().map(|h| h.join()).collect();
        (sink.join(), results)
    });
    pipeline_outcome(sink, results)
}

/// A pipeline queue after the source: (item id, value).
type ItemQueue = BoundedQueue<(u64, u64)>;

/// The pipeline's three queues (source to stage A, A to B, B to sink), each of twice the
/// threads per stage.
fn pipeline_queues(p: &WorkloadParams) -> (BoundedQueue<u64>, ItemQueue, ItemQueue) {
    let cap = 2 * p.threads;
    let q1: BoundedQueue<u64> = BoundedQueue::with_timeout(cap, p.stall_timeout());
    let q2: ItemQueue = BoundedQueue::with_timeout(cap, p.stall_timeout());
    let q3: ItemQueue = BoundedQueue::with_timeout(cap, p.stall_timeout());
    (q1, q2, q3)
}

/// A thread's result, after waking every other thread with `abort` if it is an error.
fn aborting_on_error<T, E>(r: Result<T, E>, abort: impl Fn()) -> Result<T, E> {
    if r.is_err() {
        abort();
    }
    r
}

/// A stage thread's result: on an error every other thread is woken with `abort`; the last
/// thread of the stage to finish (`live` counts them down) closes the stage's output with
/// `close`.
fn stage_done<E>(r: Result<(), E>, abort: impl Fn(), live: &AtomicU64, close: impl FnOnce()) -> Result<(), E> {
    if r.is_err() {
        abort();
    } else if live.fetch_sub(1, Ordering::AcqRel) == 1 {
        close();
    }
    r
}

/// The pipeline's result from the sink's and the other threads' (a sink that panicked panics
/// here). A stage error (stall) is the root cause; a sink check failure is reported as such.
fn pipeline_outcome(sink: std::thread::Result<KResult>, results: Vec<std::thread::Result<Result<(), SyncError>>>) -> KResult {
    let sink = match sink {
        Ok(r) => r,
        Err(p) => std::panic::resume_unwind(p),
    };
    match (first_error(results), sink) {
        (Ok(_), Ok(v)) => Ok(v),
        (_, Err(e)) if e.is::<CheckFailed>() => Err(e),
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(e),
    }
}

/// Phases of compute separated by a blocking barrier.
fn barrier(p: &WorkloadParams, iters: u64) -> KResult {
    let w = Workload::Barrier;
    let t = p.threads;
    let b = Barrier::with_timeout(t, p.stall_timeout());
    let results = std::thread::scope(|s| {
        let hs: Vec<_> = (0..t)
            .map(|tid| {
                let b = &b;
                s.spawn(move || {
                    let mut acc = 0u64;
                    for phase in 0..p.items {
                        let mut v = spin(seed(tid as u64 + 10, phase), iters);
                        if p.fault == Some(Fault::CorruptOneItem) && tid == 0 && phase == 0 {
                            v ^= 1;
                        }
                        acc = acc.wrapping_add(v);
                        if let Err(e) = b.wait() {
                            b.abort();
                            return Err(e);
                        }
                    }
                    Ok(acc)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join()).collect::<Vec<_>>()
    });
    let accs = first_error(results)?;
    verify_accumulators(w, p, iters, &accs, 10)
}

fn verify_accumulators(w: Workload, p: &WorkloadParams, iters: u64, accs: &[u64], stream: u64) -> KResult {
    let mut sum = 0u64;
    for (tid, &acc) in accs.iter().enumerate() {
        let expect = (0..p.items).fold(0u64, |a, ph| a.wrapping_add(jump(seed(tid as u64 + stream, ph), iters)));
        check(w, acc == expect, || format!("thread {tid}: accumulator {acc:#x}, expected {expect:#x}"))?;
        sum = sum.wrapping_add(acc);
    }
    Ok((p.items, sum))
}

/// Producer/consumer pairs handing values through one-slot mailboxes.
fn condvar(p: &WorkloadParams, iters: u64) -> KResult {
    let w = Workload::Condvar;
    let pairs = (p.threads / 2).max(1);
    let boxes: Vec<Mailbox<u64>> = (0..pairs).map(|_| Mailbox::with_timeout(p.stall_timeout())).collect();
    let abort_all = || boxes.iter().for_each(Mailbox::abort);
    let results = std::thread::scope(|s| {
        let mut hs = Vec::new();
        for (pair, mb) in boxes.iter().enumerate() {
            let n = share(p.items, pairs, pair);
            let abort_all = &abort_all;
            hs.push(s.spawn(move || {
                for i in 0..n {
                    let mut v = spin(seed(100 + pair as u64, i), iters);
                    if p.fault == Some(Fault::CorruptOneItem) && pair == 0 && i == 0 {
                        v ^= 1;
                    }
                    if p.fault == Some(Fault::DropOneItem) && pair == 0 && i == 0 {
                        continue;
                    }
                    if let Err(e) = mb.put(v) {
                        abort_all();
                        return Err(e);
                    }
                }
                Ok((pair, None))
            }));
            hs.push(s.spawn(move || {
                let mut acc = 0u64;
                for _ in 0..n {
                    match mb.take() {
                        Ok(v) => acc = acc.wrapping_add(spin(v, iters)),
                        Err(e) => {
                            abort_all();
                            return Err(e);
                        }
                    }
                }
                Ok((pair, Some(acc)))
            }));
        }
        hs.into_iter().map(|h| h.join()).collect::<Vec<_>>()
    });
    let outs = first_error(results)?;
    let mut sum = 0u64;
    for (pair, acc) in outs.into_iter().filter_map(|(pair, a)| a.map(|a| (pair, a))) {
        let n = share(p.items, pairs, pair);
        let expect = (0..n).fold(0u64, |a, i| a.wrapping_add(jump(jump(seed(100 + pair as u64, i), iters), iters)));
        check(w, acc == expect, || format!("pair {pair}: accumulator {acc:#x}, expected {expect:#x}"))?;
        sum = sum.wrapping_add(acc);
    }
    Ok((p.items, sum))
}

/// Contended short critical sections on one mutex.
fn mutex(p: &WorkloadParams, iters: u64) -> KResult {
    let w = Workload::Mutex;
    let cs_iters = (iters / 8).max(16);
    let state = Mutex::new((0u64, 0u64));
    std::thread::scope(|s| {
        for tid in 0..p.threads {
            let n = share(p.items, p.threads, tid);
            let state = &state;
            s.spawn(move || {
                for i in 0..n {
                    let v = spin(seed(200 + tid as u64, i), iters);
                    let mut g = state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    let mut inside = spin(v, cs_iters);
                    if p.fault == Some(Fault::CorruptOneItem) && tid == 0 && i == 0 {
                        inside ^= 1;
                    }
                    g.0 += 1;
                    g.1 = g.1.wrapping_add(inside);
                }
            });
        }
    });
    let (count, sum) = state.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    check(w, count == p.items, || format!("{count} of {} acquisitions counted", p.items))?;
    let mut expect = 0u64;
    for tid in 0..p.threads {
        for i in 0..share(p.items, p.threads, tid) {
            expect = expect.wrapping_add(jump(jump(seed(200 + tid as u64, i), iters), cs_iters));
        }
    }
    check(w, sum == expect, || format!("sum {sum:#x}, expected {expect:#x}"))?;
    Ok((count, sum))
}

/// Phases of compute separated by volrend's user-level spinning barrier.
fn spin_barrier(p: &WorkloadParams, iters: u64) -> KResult {
    let w = Workload::SpinBarrier;
    let t = p.threads;
    let b = SpinBarrier::with_timeout(t, p.stall_timeout());
    let results = std::thread::scope(|s| {
        let hs: Vec<_> = (0..t)
            .map(|tid| {
                let b = &b;
                s.spawn(move || {
                    let mut acc = 0u64;
                    for phase in 0..p.items {
                        let mut v = spin(seed(tid as u64 + 300, phase), iters);
                        if p.fault == Some(Fault::CorruptOneItem) && tid == 0 && phase == 0 {
                            v ^= 1;
                        }
                        acc = acc.wrapping_add(v);
                        if let Err(e) = b.wait() {
                            b.abort();
                            return Err(e);
                        }
                    }
                    Ok(acc)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join()).collect::<Vec<_>>()
    });
    let accs = first_error(results)?;
    verify_accumulators(w, p, iters, &accs, 300)
}

const MAT_N: usize = 64;

/// `items` integer multiplies `A x P` (P a permutation matrix) split across threads; each
/// product must equal `A` with its columns permuted.
fn matmul(p: &WorkloadParams) -> KResult {
    let w = Workload::Matmul;
    let results = std::thread::scope(|s| {
        let hs: Vec<_> = (0..p.threads)
            .map(|tid| {
                s.spawn(move || -> anyhow::Result<u64> {
                    let n = MAT_N;
                    let mut digest = 0u64;
                    let mut c = vec![0u32; n * n];
                    for m in 0..share(p.items, p.threads, tid) {
                        let base = seed(400 + tid as u64, m);
                        // Truncation to u32 is the point: matrix entries are 32-bit.
                        #[allow(clippy::cast_possible_truncation)]
                        let a: Vec<u32> = (0..n * n).map(|i| seed(base, i as u64) as u32).collect();
                        #[allow(clippy::cast_possible_truncation)]
                        let shift = (base % n as u64) as usize;
                        // perm[j] = (j + shift) % n; P[k][j] = 1 iff k == perm[j].
                        let mut pm = vec![0u32; n * n];
                        for j in 0..n {
                            pm[((j + shift) % n) * n + j] = 1;
                        }
                        for i in 0..n {
                            for j in 0..n {
                                let mut acc = 0u32;
                                for k in 0..n {
                                    acc = acc.wrapping_add(a[i * n + k].wrapping_mul(pm[k * n + j]));
                                }
                                c[i * n + j] = acc;
                            }
                        }
                        if p.fault == Some(Fault::CorruptOneItem) && tid == 0 && m == 0 {
                            c[0] ^= 1;
                        }
                        for i in 0..n {
                            for j in 0..n {
                                let (got, want) = (c[i * n + j], a[i * n + (j + shift) % n]);
                                check(w, got == want, || format!("multiply {m} of thread {tid}: C[{i}][{j}] = {got}, expected {want}"))?;
                            }
                        }
                        digest = digest.wrapping_add(u64::from(c[n + 1]));
                    }
                    Ok(digest)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join()).collect::<Vec<_>>()
    });
    let mut sum = 0u64;
    for r in results {
        match r {
            Ok(v) => sum = sum.wrapping_add(v?),
            Err(p) => std::panic::resume_unwind(p),
        }
    }
    Ok((p.items, sum))
}

/// Threads looping `nanosleep(1 ns)`; each thread is pinned to a CPU in turn when possible.
fn freqsleep(p: &WorkloadParams) -> KResult {
    let w = Workload::Freqsleep;
    let done = AtomicU64::new(0);
    let cpus = gleaner_measure::measure::allowed_cpus();
    std::thread::scope(|s| {
        for tid in 0..p.threads {
            let n = share(p.items, p.threads, tid);
            let done = &done;
            let cpu = cpus.get(tid % cpus.len().max(1)).copied();
            s.spawn(move || {
                if let Some(cpu) = cpu {
                    // Best effort: without pinning the kernel still spreads the sleepers.
                    let _ = gleaner_measure::measure::pin_current_thread(cpu);
                }
                let skip = u64::from(p.fault == Some(Fault::DropOneItem) && tid == 0);
                for _ in skip..n {
                    std::thread::sleep(std::time::Duration::from_nanos(1));
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    let n = done.load(Ordering::Relaxed);
    check(w, n == p.items, || format!("{n} of {} sleeps completed", p.items))?;
    Ok((n, n))
}
