//! Section 3.4: find each type's best quantum by measurement. Each type's representative
//! kernel runs on one pCPU together with `competitors` cache-thrashing CPU burners (the paper
//! colocates 2-4 vCPUs per pCPU), every thread with the same EEVDF slice, for each slice in
//! 1, 10, 30, 60, 90 ms. A slice replaces the default 30 ms only if its median performance
//! beats the default's by more than the noise of the repeats (and at least `agnostic_spread`);
//! see [`choose`].
//!
//! | type | kernel | performance |
//! |---|---|---|
//! | IOInt | a server thread woken every 2 ms by a "device" thread on another CPU, 500 us of work per request (the paper's heterogeneous web server: requests plus CGI computing) | 1 / median response latency |
//! | ConSpin | two threads sharing a spin lock (short critical sections), one on the measured pCPU and one on another pCPU, each among `competitors` burners (vCPUs of one VM spread over pCPUs) | lock acquisitions per second |
//! | LLCF | pointer chase over half the LLC | loads per second |
//! | LoLCF | pointer chase over 90% of L2 | loads per second |
//! | LLCO | pointer chase over twice the LLC | loads per second |
//!
//! A type whose performance varies less than `agnostic_spread` across slices is quantum
//! agnostic; LoLCF and LLCO are then written as agnostic (used for balancing).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gleaner_os::cpuset::CpuSet;
use gleaner_os::sched;
use gleaner_policy::aql::{Quanta, VcpuType};
use serde::{Deserialize, Serialize};

/// Calibration parameters.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CalibrationParams {
    pub cpu: u32,
    /// CPU for the IOInt "device" thread (not the measured one).
    pub device_cpu: u32,
    pub slices_ms: Vec<u64>,
    pub duration_ms: u64,
    pub repeats: u32,
    pub competitors: u32,
    pub llc_bytes: u64,
    pub l2_bytes: u64,
    pub agnostic_spread: f64,
}

/// One measurement point.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Point {
    #[serde(rename = "type")]
    pub ty: VcpuType,
    pub slice_ms: u64,
    /// Median over repeats, in `unit`.
    pub performance: f64,
    pub unit: String,
    /// All repeats.
    pub samples: Vec<f64>,
    /// performance / performance at 30 ms (or at the middle slice); higher is better.
    pub normalized: f64,
}

/// The best slice of a type.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Best {
    #[serde(rename = "type")]
    pub ty: VcpuType,
    pub slice_ms: u64,
    /// (max - min) / max of the medians across slices.
    pub spread: f64,
    /// What a slice had to beat the default by (the larger of `agnostic_spread` and the median
    /// noise of the repeats).
    pub threshold: f64,
    pub agnostic: bool,
}

/// Everything calibration measured.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Calibration {
    pub params: CalibrationParams,
    pub points: Vec<Point>,
    pub best: Vec<Best>,
    pub date_unix_s: u64,
}

impl Calibration {
    /// The quanta to write: measured best per type; LoLCF/LLCO agnostic when their spread is
    /// small; default 30 ms.
    pub fn quanta(&self) -> Quanta {
        let get = |t| self.best.iter().find(|b| b.ty == t);
        let ns = |t| get(t).map(|b| b.slice_ms * 1_000_000);
        let opt = |t| get(t).and_then(|b| (!b.agnostic).then_some(b.slice_ms * 1_000_000));
        let p = Quanta::paper();
        Quanta {
            io_int_ns: ns(VcpuType::IoInt).unwrap_or(p.io_int_ns),
            con_spin_ns: ns(VcpuType::ConSpin).unwrap_or(p.con_spin_ns),
            llcf_ns: ns(VcpuType::Llcf).unwrap_or(p.llcf_ns),
            lolcf_ns: opt(VcpuType::Lolcf),
            llco_ns: opt(VcpuType::Llco),
            default_ns: p.default_ns,
        }
    }
}

/// A cyclic random permutation of cache lines (Sattolo), one `usize` per 64-byte line.
fn chase_buffer(bytes: u64, seed: u64) -> Vec<usize> {
    let lines = usize::try_from(bytes / 64).unwrap_or(usize::MAX).max(2);
    let mut order: Vec<usize> = (0..lines).collect();
    let mut x = seed | 1;
    for i in (1..lines).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = usize::try_from(x % (i as u64)).unwrap_or(0);
        order.swap(i, j);
    }
    let mut buf = vec![0usize; lines * 8];
    for w in 0..lines {
        buf[order[w] * 8] = order[(w + 1) % lines] * 8;
    }
    buf
}

fn pin_and_slice(cpu: u32, slice: Duration) -> Result<(), String> {
    let tid = sched::gettid();
    let set: CpuSet = [cpu].into_iter().collect();
    sched::set_affinity(tid, &set).map_err(|e| format!("affinity to CPU {cpu}: {e}"))?;
    sched::set_slice(tid, slice).map_err(|e| format!("slice {slice:?}: {e}"))
}

struct Run {
    stop: AtomicBool,
    measuring: AtomicBool,
    ops: AtomicU64,
    latencies: Mutex<Vec<u64>>,
    error: Mutex<Option<String>>,
}

impl Run {
    fn fail(&self, e: String) {
        if let Ok(mut g) = self.error.lock() {
            g.get_or_insert(e);
        }
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// One measurement: the type's kernel plus competitors at `slice` for `duration`, as named
/// steps: start the competitors and the kernel (each thread pinned, sliced, then waiting at a
/// common barrier), warm up, count, stop, and turn the counts into a performance figure.
fn measure(
    p: &CalibrationParams,
    ty: VcpuType,
    slice: Duration,
    thrash: &Arc<Vec<usize>>,
    chase: &Arc<Vec<usize>>,
) -> anyhow::Result<(f64, &'static str)> {
    let run = Arc::new(Run {
        stop: AtomicBool::new(false),
        measuring: AtomicBool::new(false),
        ops: AtomicU64::new(0),
        latencies: Mutex::new(Vec::new()),
        error: Mutex::new(None),
    });
    // ConSpin: the second spinner and its own competitors run on the other pCPU.
    let comp_cpus: Vec<u32> = if ty == VcpuType::ConSpin { vec![p.cpu, p.device_cpu] } else { vec![p.cpu] };
    let kernel_threads = match ty {
        VcpuType::ConSpin | VcpuType::IoInt => 2, // two spinners; server and device
        _ => 1,
    };
    let barrier = Arc::new(Barrier::new(kernel_threads + p.competitors as usize * comp_cpus.len() + 1));
    let start = Start { run: Arc::clone(&run), barrier: Arc::clone(&barrier), slice };
    let mut handles = spawn_competitors(&start, &comp_cpus, p.competitors, thrash);
    let unit = match ty {
        VcpuType::Llcf | VcpuType::Lolcf | VcpuType::Llco => {
            handles.push(spawn_chase(&start, p.cpu, chase));
            "loads/s"
        }
        VcpuType::ConSpin => {
            handles.extend(spawn_spinners(&start, [p.cpu, p.device_cpu]));
            "acquisitions/s"
        }
        VcpuType::IoInt => {
            handles.extend(spawn_server_and_device(&start, p.cpu, p.device_cpu));
            "1/s (inverse median response latency)"
        }
    };
    barrier.wait();
    let secs = warm_up_and_count(&run, Duration::from_millis(p.duration_ms));
    run.stop.store(true, Ordering::SeqCst);
    for h in handles {
        let _ = h.join();
    }
    if let Some(e) = run.error.lock().ok().and_then(|g| g.clone()) {
        anyhow::bail!("calibration thread setup failed: {e}");
    }
    Ok((performance(&run, ty, secs, p.duration_ms)?, unit))
}

/// What every measurement thread starts from: the shared run, the start barrier, the slice.
struct Start {
    run: Arc<Run>,
    barrier: Arc<Barrier>,
    slice: Duration,
}

impl Start {
    /// A thread pinned to `cpu` with the slice, running `body` once all threads are ready
    /// (or failing the run if it could not be pinned).
    fn spawn(&self, cpu: u32, body: impl FnOnce(&Run) + Send + 'static) -> JoinHandle<()> {
        let (run, barrier, slice) = (Arc::clone(&self.run), Arc::clone(&self.barrier), self.slice);
        std::thread::spawn(move || {
            let r = pin_and_slice(cpu, slice);
            barrier.wait();
            match r {
                Ok(()) => body(&run),
                Err(e) => run.fail(e),
            }
        })
    }
}

/// Competitors: cache-thrashing streams over a buffer twice the LLC, `n` per CPU.
fn spawn_competitors(start: &Start, cpus: &[u32], n: u32, thrash: &Arc<Vec<usize>>) -> Vec<JoinHandle<()>> {
    let mut handles = Vec::new();
    for (c, cpu) in cpus.iter().flat_map(|&cpu| (0..n).map(move |c| (c, cpu))) {
        let buf = Arc::clone(thrash);
        handles.push(start.spawn(cpu, move |run| {
            let n = buf.len();
            let mut i = (c as usize * n / 4) % n;
            let mut sink = 0usize;
            while !run.stop.load(Ordering::Relaxed) {
                for _ in 0..4096 {
                    sink = sink.wrapping_add(buf[i]);
                    i += 8;
                    if i >= n {
                        i = 0;
                    }
                }
            }
            std::hint::black_box(sink);
        }));
    }
    handles
}

/// LLCF, LoLCF, LLCO: a pointer chase over `chase`, counting loads.
fn spawn_chase(start: &Start, cpu: u32, chase: &Arc<Vec<usize>>) -> JoinHandle<()> {
    let buf = Arc::clone(chase);
    start.spawn(cpu, move |run| {
        let mut i = 0usize;
        while !run.stop.load(Ordering::Relaxed) {
            for _ in 0..1024 {
                i = buf[i];
            }
            if run.measuring.load(Ordering::Relaxed) {
                run.ops.fetch_add(1024, Ordering::Relaxed);
            }
        }
        std::hint::black_box(i);
    })
}

/// ConSpin: two threads sharing a spin lock with short critical sections, counting
/// acquisitions.
fn spawn_spinners(start: &Start, cpus: [u32; 2]) -> Vec<JoinHandle<()>> {
    let lock = Arc::new(AtomicBool::new(false));
    cpus.into_iter()
        .map(|spin_cpu| {
            let lock = Arc::clone(&lock);
            start.spawn(spin_cpu, move |run| {
                let mut x = 1u64;
                while !run.stop.load(Ordering::Relaxed) {
                    while lock.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
                        if run.stop.load(Ordering::Relaxed) {
                            return;
                        }
                        std::hint::spin_loop();
                    }
                    for _ in 0..200 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    }
                    lock.store(false, Ordering::Release);
                    if run.measuring.load(Ordering::Relaxed) {
                        run.ops.fetch_add(1, Ordering::Relaxed);
                    }
                    for _ in 0..200 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    }
                }
                std::hint::black_box(x);
            })
        })
        .collect()
}

/// IOInt: a server thread on `cpu` woken by a "device" thread on `device_cpu` every 2 ms,
/// 500 us of work per request, recording each response latency.
fn spawn_server_and_device(start: &Start, cpu: u32, device_cpu: u32) -> [JoinHandle<()>; 2] {
    let chan = Arc::new((Mutex::new(None::<Instant>), std::sync::Condvar::new()));
    let server_chan = Arc::clone(&chan);
    let server = start.spawn(cpu, move |run| {
        let (m, cv) = &*server_chan;
        let mut x = 1u64;
        loop {
            let sent = {
                let mut g = match m.lock() {
                    Ok(g) => g,
                    Err(_) => return,
                };
                while g.is_none() && !run.stop.load(Ordering::Relaxed) {
                    g = match cv.wait_timeout(g, Duration::from_millis(50)) {
                        Ok((g, _)) => g,
                        Err(_) => return,
                    };
                }
                match g.take() {
                    Some(t) => t,
                    None => return,
                }
            };
            // The request's work (a CGI script's worth of computing).
            let until = Instant::now() + Duration::from_micros(500);
            while Instant::now() < until {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            if run.measuring.load(Ordering::Relaxed) {
                let ns = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
                if let Ok(mut l) = run.latencies.lock() {
                    l.push(ns);
                }
            }
        }
    });
    // The device keeps the default slice: only its CPU is set.
    let (run, barrier, dev) = (Arc::clone(&start.run), Arc::clone(&start.barrier), device_cpu);
    let device = std::thread::spawn(move || {
        let set: CpuSet = [dev].into_iter().collect();
        let r = sched::set_affinity(sched::gettid(), &set);
        barrier.wait();
        if let Err(e) = r {
            return run.fail(format!("device thread affinity to CPU {dev}: {e}"));
        }
        let (m, cv) = &*chan;
        while !run.stop.load(Ordering::Relaxed) {
            if let Ok(mut g) = m.lock() {
                if g.is_none() {
                    *g = Some(Instant::now());
                    cv.notify_one();
                }
            }
            // The device's request rate: one every 2 ms.
            std::thread::sleep(Duration::from_millis(2));
        }
        cv.notify_all();
    });
    [server, device]
}

/// Warms up for a fifth of `duration`, then counts for `duration`; returns the seconds counted.
fn warm_up_and_count(run: &Run, duration: Duration) -> f64 {
    std::thread::sleep(duration / 5);
    let t0 = Instant::now();
    run.measuring.store(true, Ordering::SeqCst);
    std::thread::sleep(duration);
    run.measuring.store(false, Ordering::SeqCst);
    t0.elapsed().as_secs_f64()
}

/// The type's performance figure from what the threads counted (higher is better).
fn performance(run: &Run, ty: VcpuType, secs: f64, duration_ms: u64) -> anyhow::Result<f64> {
    if ty == VcpuType::IoInt {
        let mut l = run.latencies.lock().map(|l| l.clone()).unwrap_or_default();
        if l.is_empty() {
            anyhow::bail!("IOInt kernel completed no request in {duration_ms} ms");
        }
        l.sort_unstable();
        Ok(1e9 / l[l.len() / 2] as f64)
    } else {
        Ok(run.ops.load(Ordering::SeqCst) as f64 / secs)
    }
}

/// Relative range of repeated samples: `(max - min) / median`.
fn noise(samples: &[f64], median: f64) -> f64 {
    let max = samples.iter().copied().fold(f64::MIN, f64::max);
    let min = samples.iter().copied().fold(f64::MAX, f64::min);
    if median > 0.0 {
        (max - min) / median
    } else {
        0.0
    }
}

/// Picks a type's slice from `(slice_ms, median performance, noise)`: the default (30 ms, or
/// the middle slice) stays unless another slice beats it by more than the threshold
/// `max(agnostic_spread, median noise)`; then the best median wins. The type is agnostic when
/// all medians are within the threshold of the best.
pub fn choose(ty: VcpuType, meds: &[(u64, f64, f64)], agnostic_spread: f64) -> Best {
    let mut noises: Vec<f64> = meds.iter().map(|m| m.2).collect();
    noises.sort_by(f64::total_cmp);
    let threshold = agnostic_spread.max(noises.get(noises.len() / 2).copied().unwrap_or(0.0));
    let default = meds.iter().find(|m| m.0 == 30).copied().unwrap_or(meds[meds.len() / 2]);
    let top = meds.iter().copied().fold(default, |acc, m| if m.1 > acc.1 { m } else { acc });
    let chosen = if top.1 > default.1 * (1.0 + threshold) { top } else { default };
    let min = meds.iter().map(|m| m.1).fold(f64::MAX, f64::min);
    let spread = if top.1 > 0.0 { (top.1 - min) / top.1 } else { 0.0 };
    Best { ty, slice_ms: chosen.0, spread, threshold, agnostic: spread <= threshold }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Runs the whole calibration; `progress` gets one line per point.
pub fn calibrate(p: &CalibrationParams, types: &[VcpuType], mut progress: impl FnMut(&str)) -> anyhow::Result<Calibration> {
    for &s in &p.slices_ms {
        if !(1..=100).contains(&s) {
            return Err(gleaner_os::BadInput::new("--slices-ms", s, "1..=100 (the EEVDF slice range in whole ms)").into());
        }
    }
    let thrash = Arc::new(chase_buffer(p.llc_bytes * 2, 7));
    let mut points = Vec::new();
    let mut best = Vec::new();
    for &ty in types {
        let bytes = match ty {
            VcpuType::Llcf => p.llc_bytes / 2,
            VcpuType::Lolcf => p.l2_bytes * 9 / 10,
            VcpuType::Llco => p.llc_bytes * 2,
            _ => 4096,
        };
        let chase = Arc::new(chase_buffer(bytes, 11));
        let mut meds = Vec::new();
        for &ms in &p.slices_ms {
            let mut samples = Vec::new();
            let mut unit = "";
            for _ in 0..p.repeats.max(1) {
                let (v, u) = measure(p, ty, Duration::from_millis(ms), &thrash, &chase)?;
                samples.push(v);
                unit = u;
            }
            let m = median(&samples);
            progress(&format!("{:8} slice {ms:3} ms: {m:.4e} {unit}", ty.name()));
            meds.push((ms, m, unit.to_string(), samples));
        }
        let reference = meds.iter().find(|m| m.0 == 30).map(|m| m.1).unwrap_or(meds[meds.len() / 2].1);
        for (ms, m, unit, samples) in &meds {
            points.push(Point {
                ty,
                slice_ms: *ms,
                performance: *m,
                unit: unit.clone(),
                samples: samples.clone(),
                normalized: m / reference,
            });
        }
        let summary: Vec<(u64, f64, f64)> = meds.iter().map(|(ms, m, _, s)| (*ms, *m, noise(s, *m))).collect();
        best.push(choose(ty, &summary, p.agnostic_spread));
    }
    let date_unix_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    Ok(Calibration { params: p.clone(), points, best, date_unix_s })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chase_buffer_is_one_cycle() {
        let b = chase_buffer(64 * 1000, 3);
        let mut i = 0;
        let mut seen = 0;
        loop {
            i = b[i];
            seen += 1;
            if i == 0 {
                break;
            }
            assert!(seen <= 1000);
        }
        assert_eq!(seen, 1000);
    }

    #[test]
    fn choice_keeps_the_default_within_noise() {
        // Clearly better at 1 ms.
        let b = choose(VcpuType::IoInt, &[(1, 2.0, 0.01), (10, 1.1, 0.01), (30, 1.0, 0.01), (90, 0.9, 0.01)], 0.05);
        assert_eq!((b.slice_ms, b.agnostic), (1, false));
        // 3% better at 90 ms: within the 5% threshold, 30 ms stays; all within -> agnostic.
        let b = choose(VcpuType::Llco, &[(1, 0.98, 0.01), (30, 1.0, 0.01), (90, 1.03, 0.01)], 0.05);
        assert_eq!((b.slice_ms, b.agnostic), (30, true));
        // 20% better but the repeats vary by 50%: not convincing.
        let b = choose(VcpuType::Llcf, &[(1, 1.0, 0.5), (30, 1.0, 0.5), (90, 1.2, 0.5)], 0.05);
        assert_eq!((b.slice_ms, b.threshold), (30, 0.5));
        // One slice clearly worse: not agnostic, default kept.
        let b = choose(VcpuType::IoInt, &[(1, 0.5, 0.01), (30, 1.0, 0.01), (90, 1.0, 0.01)], 0.05);
        assert_eq!((b.slice_ms, b.agnostic), (30, false));
    }

    #[test]
    fn quanta_from_measurements() {
        let mk = |ty, slice_ms, agnostic| Best { ty, slice_ms, spread: 0.0, threshold: 0.05, agnostic };
        let c = Calibration {
            params: CalibrationParams {
                cpu: 0,
                device_cpu: 1,
                slices_ms: vec![1, 30, 90],
                duration_ms: 1,
                repeats: 1,
                competitors: 1,
                llc_bytes: 1,
                l2_bytes: 1,
                agnostic_spread: 0.05,
            },
            points: vec![],
            best: vec![
                mk(VcpuType::IoInt, 10, false),
                mk(VcpuType::ConSpin, 1, false),
                mk(VcpuType::Llcf, 60, false),
                mk(VcpuType::Lolcf, 90, true),
                mk(VcpuType::Llco, 1, false),
            ],
            date_unix_s: 0,
        };
        let q = c.quanta();
        assert_eq!((q.io_int_ns, q.con_spin_ns, q.llcf_ns), (10_000_000, 1_000_000, 60_000_000));
        assert_eq!((q.lolcf_ns, q.llco_ns, q.default_ns), (None, Some(1_000_000), 30_000_000));
    }
}
