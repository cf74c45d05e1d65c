//! Helpers of this crate's tests on the real machine.

/// A thread of this process that waits, doing nothing, until released: something to move
/// between cgroups or to read in /proc.
pub(crate) struct ParkedThread {
    pub(crate) tid: i32,
    release: std::sync::mpsc::Sender<()>,
    handle: std::thread::JoinHandle<()>,
}

impl ParkedThread {
    pub(crate) fn start() -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let handle = std::thread::spawn(move || {
            tx.send(crate::sched::gettid()).unwrap();
            let _ = wait.recv();
        });
        let tid = rx.recv().unwrap();
        Self { tid, release, handle }
    }

    /// Lets the thread end and waits for it.
    pub(crate) fn finish(self) {
        let _ = self.release.send(());
        self.handle.join().unwrap();
    }
}
