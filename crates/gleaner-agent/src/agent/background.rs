//! The agent's main thread in the workload's idle time: SCHED_IDLE while the guest loop says
//! the VM leaves idle time ([`GuestController::agent_in_background`]), the thread's own
//! scheduling attributes otherwise, and at the end of the run (the clean-up must not wait for
//! idle time).
//!
//! Only a thread started as SCHED_OTHER or SCHED_BATCH is moved: an agent started under a
//! real-time or deadline policy, or already SCHED_IDLE, was put there on purpose.
//!
//! [`GuestController::agent_in_background`]: gleaner_policy::guest::GuestController::agent_in_background

use gleaner_os::sched::{self, Policy, SchedAttr};

/// One thread's class, switched only when the wanted one changes.
#[derive(Debug)]
pub struct Background {
    tid: i32,
    /// The thread's attributes at start.
    original: SchedAttr,
    /// SCHED_IDLE now.
    now: bool,
}

impl Background {
    /// For the calling thread. `Err` says why it stays as it is (read once, at start).
    pub fn for_this_thread() -> Result<Self, String> {
        let tid = sched::gettid();
        let attr = sched::get_attr(tid).map_err(|e| format!("reading the agent's scheduling attributes: {e}"))?;
        let policy = Policy::from_raw(attr.sched_policy);
        if !matches!(policy, Policy::Other | Policy::Batch) {
            return Err(format!("the agent runs under {policy:?}, as it was started"));
        }
        // Leaving SCHED_IDLE needs CAP_SYS_NICE or an RLIMIT_NICE that allows the thread's
        // nice value: without either the thread could go in but never come back.
        if !nix::unistd::geteuid().is_root() {
            let allowed = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NICE).map_or(0, |(soft, _)| soft);
            let needs = u64::try_from(20 - attr.sched_nice).unwrap_or(u64::MAX);
            if needs > allowed {
                return Err(format!(
                    "the agent could not leave SCHED_IDLE again (RLIMIT_NICE {allowed}, nice {}, not root): it runs at its own priority",
                    attr.sched_nice
                ));
            }
        }
        Ok(Self { tid, original: attr, now: false })
    }

    /// SCHED_IDLE now or not.
    pub fn is_background(&self) -> bool {
        self.now
    }

    /// Moves the thread to SCHED_IDLE (`true`) or back to its own attributes. An error (a
    /// security module may refuse) puts it back as it started; the caller stops moving it.
    pub fn set(&mut self, background: bool) -> Result<(), String> {
        if background == self.now {
            return Ok(());
        }
        let r = if background { sched::set_idle(self.tid) } else { sched::set_attr(self.tid, &self.original) };
        match r {
            Ok(()) => {
                self.now = background;
                Ok(())
            }
            Err(e) => {
                if self.now {
                    let _ = sched::set_attr(self.tid, &self.original);
                    self.now = false;
                }
                Err(format!(
                    "moving the agent {} the workload's idle time failed ({e}); it runs at its own priority",
                    if background { "into" } else { "out of" }
                ))
            }
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.set(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a thread of its own (the class is per thread): into SCHED_IDLE and back to the
    /// attributes it had, nice value included; dropping it restores them too.
    #[test]
    fn a_thread_goes_into_the_idle_time_and_back_as_it_was() {
        std::thread::spawn(|| {
            // SAFETY: setpriority takes plain integers; who 0 is the calling thread.
            assert_eq!(unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 5) }, 0);
            let before = sched::get_attr(0).unwrap();
            let mut b = Background::for_this_thread().unwrap();
            assert!(!b.is_background());
            b.set(true).unwrap();
            assert_eq!(sched::policy(0).unwrap(), Policy::Idle);
            assert!(b.is_background());
            b.set(true).unwrap();
            b.set(false).unwrap();
            assert_eq!(sched::get_attr(0).unwrap(), before);
            b.set(true).unwrap();
            drop(b);
            assert_eq!(sched::get_attr(0).unwrap(), before, "dropped, the thread is back as it was");
            // An idle thread is not moved (it was put there on purpose).
            sched::set_idle(0).unwrap();
            assert!(Background::for_this_thread().is_err());
        })
        .join()
        .unwrap();
    }
}
