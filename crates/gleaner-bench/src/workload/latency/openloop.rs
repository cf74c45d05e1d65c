//! `openloop`: requests arrive on a fixed Poisson schedule whatever the server does. The
//! sender (client CPU) sleeps until each scheduled arrival and queues the request stamped with
//! its *scheduled* time; the server (server CPU) blocks until a request is queued, computes
//! `work_us` and queues the reply; the receiver (client CPU) blocks until a reply is queued
//! and records `reply seen - scheduled time`. Both queues are unbounded mutex + condvar queues,
//! so the sender never waits for the server.
//!
//! The check: replies arrive in request order (one server, FIFO queues), so reply `k` must
//! answer request `k` (none missing, none twice) with `spin(payload_k, iters)`, and every
//! scheduled request must be answered.

use std::time::{Duration, Instant};

use super::{check, collect, ns, pin, root_error, Abort, LatencyKernel, LatencyOutcome, OpenloopParams, TIMER_SLACK_NS};
use crate::workload::compute::{jump, seed, spin};
use crate::workload::sync::{Barrier, BoundedQueue};
use crate::workload::Fault;

const K: LatencyKernel = LatencyKernel::Openloop;
/// Stream of the payloads (`compute::seed`).
const STREAM: u64 = 600;

#[derive(Debug, Clone, Copy)]
struct Request {
    id: u64,
    scheduled: Instant,
    payload: u64,
}

#[derive(Debug, Clone, Copy)]
struct Reply {
    id: u64,
    scheduled: Instant,
    value: u64,
}

#[derive(Debug)]
struct Shared {
    requests: BoundedQueue<Request>,
    replies: BoundedQueue<Reply>,
    start: Barrier,
}

impl Abort for Shared {
    fn abort(&self) {
        self.requests.abort();
        self.replies.abort();
        self.start.abort();
    }
}

struct Received {
    samples: Vec<u64>,
    last_seen: Option<Instant>,
    checksum: u64,
}

pub(super) fn run(p: &OpenloopParams, schedule: &[u64], iters: u64, timeout: Duration) -> anyhow::Result<LatencyOutcome> {
    let sh = Shared {
        requests: BoundedQueue::unbounded_with_timeout(timeout),
        replies: BoundedQueue::unbounded_with_timeout(timeout),
        start: Barrier::with_timeout(3, timeout),
    };
    let n = u64::try_from(schedule.len())?;
    let (sent, served, received) = std::thread::scope(|s| {
        let sh = &sh;
        let server = s.spawn(move || sh.guard(serve(p, iters, n, sh)));
        let receiver = s.spawn(move || sh.guard(receive(p, iters, n, sh)));
        let sender = s.spawn(move || sh.guard(send(p, schedule, sh)));
        (sender.join(), server.join(), receiver.join())
    });
    let mut errors = Vec::new();
    let sent = collect(sent, &mut errors);
    collect(served, &mut errors);
    let received = collect(received, &mut errors);
    if let Some(e) = root_error(errors) {
        return Err(e);
    }
    let ((base, send_lag_ns), r) = sent.zip(received).ok_or_else(|| anyhow::anyhow!("openloop: a thread returned nothing"))?;
    // The window: from the schedule's start to the last reply, and at least the schedule's
    // length (a fast server does not make the arrival rate higher than it was).
    let duration_ns = p.duration_ms.saturating_mul(1_000_000);
    let window_ns = r.last_seen.map_or(0, |t| ns(t.saturating_duration_since(base))).max(duration_ns);
    Ok(LatencyOutcome {
        kernel: K,
        items: u64::try_from(r.samples.len())?,
        samples_ns: r.samples,
        send_lag_ns,
        window_ns,
        requested_per_s: Some(f64::from(p.rate_per_s)),
        checksum: r.checksum,
        iters_per_item: iters,
        iters_per_us: p.iters_per_us,
    })
}

/// The sender: every request at its scheduled time (never earlier), then close the queue.
/// Returns the schedule's start and each request's lateness.
fn send(p: &OpenloopParams, schedule: &[u64], sh: &Shared) -> anyhow::Result<(Instant, Vec<u64>)> {
    pin(p.client_cpu, "sender")?;
    gleaner_os::sched::set_own_timer_slack(TIMER_SLACK_NS)?;
    let mut lags = Vec::with_capacity(schedule.len());
    sh.start.wait()?;
    let base = Instant::now();
    for (id, &at) in (0u64..).zip(schedule) {
        let scheduled = base + Duration::from_nanos(at);
        let now = Instant::now();
        if scheduled > now {
            std::thread::sleep(scheduled - now);
        }
        lags.push(ns(Instant::now().saturating_duration_since(scheduled)));
        sh.requests.push(Request { id, scheduled, payload: seed(STREAM, id) })?;
    }
    sh.requests.close();
    Ok((base, lags))
}

/// The server: answer requests in arrival order until the sender is done.
fn serve(p: &OpenloopParams, iters: u64, n: u64, sh: &Shared) -> anyhow::Result<()> {
    pin(p.server_cpu, "server")?;
    sh.start.wait()?;
    let faulty = n / 2;
    while let Some(r) = sh.requests.pop()? {
        let mut value = spin(r.payload, iters);
        if r.id == faulty {
            match p.fault {
                Some(Fault::DropOneItem) => continue,
                Some(Fault::CorruptOneItem) => value ^= 1,
                None => {}
            }
        }
        sh.replies.push(Reply { id: r.id, scheduled: r.scheduled, value })?;
    }
    sh.replies.close();
    Ok(())
}

/// The receiver: time and check every reply.
fn receive(p: &OpenloopParams, iters: u64, n: u64, sh: &Shared) -> anyhow::Result<Received> {
    pin(p.client_cpu, "receiver")?;
    let mut samples = Vec::with_capacity(usize::try_from(n)?);
    let (mut next, mut checksum, mut last_seen) = (0u64, 0u64, None);
    sh.start.wait()?;
    while let Some(r) = sh.replies.pop()? {
        let seen = Instant::now();
        check(K, r.id == next, || {
            if r.id > next {
                format!("request {next} was not answered (the next reply answers request {})", r.id)
            } else {
                format!("request {} was answered twice", r.id)
            }
        })?;
        let want = jump(seed(STREAM, r.id), iters);
        check(K, r.value == want, || format!("request {}: reply {:#x}, expected {want:#x}", r.id, r.value))?;
        samples.push(ns(seen.saturating_duration_since(r.scheduled)));
        checksum = checksum.wrapping_add(r.value);
        last_seen = Some(seen);
        next += 1;
    }
    check(K, next == n, || format!("{next} of {n} requests were answered"))?;
    Ok(Received { samples, last_seen, checksum })
}
