//! Drives a set of guests: starts them, consumes their result-port events, and keeps per-guest
//! state (boot time, completed steps with their output and host-side CPU time) until a
//! condition holds or a deadline passes.

use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::command::Accel;
use crate::guest::{next_event, EventKind, Guest, GuestEvent, GuestSpec};
use crate::hostproc::{delta, ThreadCpu};
use crate::kernel::Kernel;
use crate::GuestError;

/// One finished step of a guest's job.
#[derive(Debug, Clone, Serialize)]
pub struct StepResult {
    pub guest: String,
    pub step: String,
    pub rc: i32,
    /// The step's stdout (guest-side output, e.g. a bench JSON document).
    pub stdout: String,
    /// Host-side window, seconds since the guest was started.
    pub begin_s: f64,
    pub end_s: f64,
    /// Scheduling counters of each QEMU thread during the step (host view).
    pub host_threads: Vec<ThreadCpu>,
    /// Files the job sent after the step, by kind (`events`: the agent's JSON lines).
    #[serde(default)]
    pub attachments: std::collections::BTreeMap<String, String>,
}

impl StepResult {
    pub fn host_cpu_ns(&self) -> u64 {
        self.host_threads.iter().map(|t| t.run_ns).sum()
    }
    pub fn vcpu_ns(&self) -> u64 {
        self.vcpu_threads().map(|t| t.run_ns).sum()
    }
    /// The vCPU threads' counters.
    pub fn vcpu_threads(&self) -> impl Iterator<Item = &ThreadCpu> {
        self.host_threads.iter().filter(|t| t.vcpu().is_some())
    }
}

#[derive(Debug, Default)]
pub struct GuestState {
    pub ready_at: Option<Instant>,
    pub done: Option<i32>,
    pub exited: bool,
    pub failed: Option<String>,
    current: Option<(String, Instant, Vec<ThreadCpu>, Vec<String>)>,
    /// An attachment being received: (step, kind, lines).
    attaching: Option<(String, String, Vec<String>)>,
    pub steps: Vec<(StepResult, Instant, Instant)>,
}

impl GuestState {
    pub fn current_step(&self) -> Option<&str> {
        self.current.as_ref().map(|c| c.0.as_str())
    }
}

#[derive(Debug)]
pub struct Session {
    kernel: Kernel,
    busybox: PathBuf,
    tx: Sender<GuestEvent>,
    rx: Receiver<GuestEvent>,
    pub guests: Vec<Guest>,
    pub states: Vec<GuestState>,
}

impl Session {
    pub fn new(kernel: Kernel, busybox: PathBuf) -> Self {
        let (tx, rx) = channel();
        Self { kernel, busybox, tx, rx, guests: Vec::new(), states: Vec::new() }
    }

    /// Starts a guest; returns its index.
    pub fn start(&mut self, spec: &GuestSpec) -> Result<usize, GuestError> {
        let id = self.guests.len();
        let g = Guest::start(id, spec, &self.kernel, &self.busybox, self.tx.clone())?;
        self.guests.push(g);
        self.states.push(GuestState::default());
        Ok(id)
    }

    pub fn boot_s(&self, id: usize) -> Option<f64> {
        self.states[id].ready_at.map(|r| (r - self.guests[id].started).as_secs_f64())
    }

    /// Processes events until `cond` holds, failing on the deadline, an interrupt, or a guest
    /// that fails or exits while `cond` still needs it (`needed` guests).
    pub fn drive(
        &mut self,
        deadline: Instant,
        what: &str,
        needed: &[usize],
        cond: &dyn Fn(&Session) -> bool,
        tick: &mut dyn FnMut(&Session),
    ) -> Result<(), GuestError> {
        let total = deadline.saturating_duration_since(Instant::now());
        while !cond(self) {
            for &n in needed {
                let st = &self.states[n];
                if let Some(f) = &st.failed {
                    return Err(GuestError::GuestFailed {
                        guest: self.guests[n].name.clone(),
                        what: format!("guest init failed: {f}"),
                        console: self.guests[n].console_tail(25),
                    });
                }
                // A guest that finished its job powers off: only an exit before DONE is a failure.
                if st.exited && st.done.is_none() {
                    return Err(GuestError::GuestFailed {
                        guest: self.guests[n].name.clone(),
                        what: format!("QEMU exited before {what}"),
                        console: self.guests[n].console_tail(25),
                    });
                }
            }
            let step_deadline = deadline.min(Instant::now() + Duration::from_millis(500));
            let ev = match next_event(&self.rx, step_deadline, &|| (String::new(), String::new(), String::new())) {
                Ok(ev) => ev,
                Err(GuestError::Timeout { .. }) if Instant::now() < deadline => {
                    tick(self);
                    continue;
                }
                Err(GuestError::Timeout { .. }) => {
                    let g = needed.first().copied().unwrap_or(0);
                    let (name, console) =
                        self.guests.get(g).map_or((String::new(), String::new()), |x| (x.name.clone(), x.console_tail(25)));
                    return Err(GuestError::Timeout { guest: name, waiting_for: what.to_string(), after_s: total.as_secs_f64(), console });
                }
                Err(e) => return Err(e),
            };
            self.apply(ev);
            tick(self);
        }
        Ok(())
    }

    fn apply(&mut self, ev: GuestEvent) {
        let started = self.guests[ev.guest].started;
        let name = self.guests[ev.guest].name.clone();
        let st = &mut self.states[ev.guest];
        match ev.kind {
            EventKind::Ready => st.ready_at = Some(ev.at),
            EventKind::Begin(step) => st.current = Some((step, ev.at, ev.cpu.unwrap_or_default(), Vec::new())),
            EventKind::Line(l) => {
                if let Some(a) = st.attaching.as_mut() {
                    a.2.push(l);
                } else if let Some(c) = st.current.as_mut() {
                    c.3.push(l);
                }
            }
            EventKind::Attach { step, kind } => st.attaching = Some((step, kind, Vec::new())),
            EventKind::AttachEnd => {
                if let Some((step, kind, lines)) = st.attaching.take() {
                    if let Some((r, _, _)) = st.steps.iter_mut().rev().find(|(r, _, _)| r.step == step) {
                        r.attachments.insert(kind, lines.join("\n"));
                    }
                }
            }
            EventKind::End { step, rc } => {
                if let Some((s, begin, cpu0, lines)) = st.current.take() {
                    let cpu1 = ev.cpu.unwrap_or_default();
                    let r = StepResult {
                        guest: name,
                        step: if s == step { s } else { format!("{s}?{step}") },
                        rc,
                        stdout: lines.join("\n"),
                        begin_s: (begin - started).as_secs_f64(),
                        end_s: (ev.at - started).as_secs_f64(),
                        host_threads: delta(&cpu0, &cpu1),
                        attachments: Default::default(),
                    };
                    st.steps.push((r, begin, ev.at));
                }
            }
            EventKind::Done { rc } => st.done = Some(rc),
            EventKind::Fail(f) => st.failed = Some(f),
            EventKind::Exited => st.exited = true,
        }
    }

    /// Kills every guest now (their temp dirs go when the session is dropped).
    pub fn kill_all(&mut self) {
        for g in &mut self.guests {
            g.kill();
        }
    }

    pub fn accel(&self, id: usize) -> Accel {
        self.guests[id].accel
    }
}

/// Boots one guest, runs its job to the end and returns its steps and boot time.
pub fn run_single(
    kernel: &Kernel,
    busybox: &std::path::Path,
    spec: &GuestSpec,
    timeout: Duration,
) -> Result<(f64, Vec<StepResult>, i32), GuestError> {
    let mut s = Session::new(kernel.clone(), busybox.to_path_buf());
    let deadline = Instant::now() + timeout;
    let id = s.start(spec)?;
    s.drive(deadline, "job completion", &[id], &|s| s.states[0].done.is_some(), &mut |_| {})?;
    let boot = s.boot_s(id).unwrap_or(f64::NAN);
    let rc = s.states[id].done.unwrap_or(-1);
    s.guests[id].wait_exit(Duration::from_secs(5));
    let steps = s.states[id].steps.iter().map(|x| x.0.clone()).collect();
    Ok((boot, steps, rc))
}
