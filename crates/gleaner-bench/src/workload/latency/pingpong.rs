//! `pingpong`: a client and a server on two CPUs hand one token back and forth through two
//! one-slot mailboxes (mutex + condvar, futex-based: the waiter blocks in the kernel). Each
//! round trip is one sample, timed by the client from just before it hands the token over to
//! just after the answer is back; `think_us` of sleep between rounds lets the CPUs idle.

use std::time::{Duration, Instant};

use super::{check, collect, ns, pin, root_error, Abort, LatencyKernel, LatencyOutcome, PingpongParams, TIMER_SLACK_NS};
use crate::workload::compute::{jump, seed, spin};
use crate::workload::sync::{Barrier, Mailbox};
use crate::workload::Fault;

const K: LatencyKernel = LatencyKernel::Pingpong;
/// Stream of the payloads (`compute::seed`).
const STREAM: u64 = 500;
/// The round whose reply a fault drops or corrupts.
const FAULTY_ROUND: u64 = 1;

#[derive(Debug, Clone, Copy)]
struct Token {
    round: u64,
    value: u64,
}

/// The two mailboxes and the start line.
#[derive(Debug)]
struct Shared {
    /// Client to server; `None` tells the server to stop.
    ping: Mailbox<Option<Token>>,
    pong: Mailbox<Token>,
    start: Barrier,
}

impl Abort for Shared {
    fn abort(&self) {
        self.ping.abort();
        self.pong.abort();
        self.start.abort();
    }
}

struct ClientOut {
    samples: Vec<u64>,
    checksum: u64,
    window_ns: u64,
}

pub(super) fn run(p: &PingpongParams, timeout: Duration) -> anyhow::Result<LatencyOutcome> {
    let sh =
        Shared { ping: Mailbox::with_timeout(timeout), pong: Mailbox::with_timeout(timeout), start: Barrier::with_timeout(2, timeout) };
    let (client, server) = std::thread::scope(|s| {
        let sh = &sh;
        let server = s.spawn(move || sh.guard(serve(p, sh)));
        let client = s.spawn(move || sh.guard(drive(p, sh)));
        (client.join(), server.join())
    });
    let mut errors = Vec::new();
    let client = collect(client, &mut errors);
    collect(server, &mut errors);
    if let Some(e) = root_error(errors) {
        return Err(e);
    }
    let c = client.ok_or_else(|| anyhow::anyhow!("pingpong: the client returned nothing"))?;
    Ok(LatencyOutcome {
        kernel: K,
        items: u64::try_from(c.samples.len())?,
        samples_ns: c.samples,
        send_lag_ns: Vec::new(),
        window_ns: c.window_ns,
        requested_per_s: None,
        checksum: c.checksum,
        iters_per_item: 1,
        iters_per_us: None,
    })
}

/// The client: rounds until the duration is over or the rounds are done, then stop the server.
fn drive(p: &PingpongParams, sh: &Shared) -> anyhow::Result<ClientOut> {
    pin(p.client_cpu, "client")?;
    let think = Duration::from_micros(p.think_us);
    if !think.is_zero() {
        gleaner_os::sched::set_own_timer_slack(TIMER_SLACK_NS)?;
    }
    // Room for every sample of a round-count run, or for rounds of think time + 10 us.
    let hint = p.rounds.unwrap_or_else(|| p.duration_ms.unwrap_or(0).saturating_mul(1000) / (p.think_us + 10));
    let mut samples = Vec::with_capacity(usize::try_from(hint.min(super::MAX_ROUNDS)).unwrap_or(0));
    let mut checksum = 0u64;
    sh.start.wait()?;
    let began = Instant::now();
    let end = p.duration_ms.map(|ms| began + Duration::from_millis(ms));
    for round in 0u64.. {
        let done = match (p.rounds, end) {
            (Some(n), _) => round >= n,
            (None, Some(end)) => Instant::now() >= end,
            (None, None) => true,
        };
        if done {
            break;
        }
        let value = seed(STREAM, round);
        let t0 = Instant::now();
        sh.ping.put(Some(Token { round, value }))?;
        let reply = sh.pong.take()?;
        let t1 = Instant::now();
        let want = jump(value, 1);
        check(K, reply.round == round, || format!("round {round} was answered by the reply to round {}", reply.round))?;
        check(K, reply.value == want, || format!("round {round}: reply {:#x}, expected {want:#x}", reply.value))?;
        samples.push(ns(t1 - t0));
        checksum = checksum.wrapping_add(reply.value);
        if !think.is_zero() {
            std::thread::sleep(think);
        }
    }
    let window_ns = ns(began.elapsed());
    sh.ping.put(None)?;
    Ok(ClientOut { samples, checksum, window_ns })
}

/// The server: answer every token until told to stop.
fn serve(p: &PingpongParams, sh: &Shared) -> anyhow::Result<()> {
    pin(p.server_cpu, "server")?;
    sh.start.wait()?;
    while let Some(t) = sh.ping.take()? {
        let mut value = spin(t.value, 1);
        if t.round == FAULTY_ROUND {
            match p.fault {
                Some(Fault::DropOneItem) => continue,
                Some(Fault::CorruptOneItem) => value ^= 1,
                None => {}
            }
        }
        sh.pong.put(Token { round: t.round, value })?;
    }
    Ok(())
}
