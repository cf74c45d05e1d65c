//! The one error type of `gleaner-os`: every variant names the file, pid/tid or syscall.

use std::io;
use std::path::PathBuf;

use crate::input::BadInput;

/// What went wrong while reading or changing the OS, with the path / pid / tid involved.
#[derive(Debug, thiserror::Error)]
pub enum OsError {
    /// A file could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A value could not be written to a file.
    #[error("cannot write '{value}' to {}", path.display())]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    /// A file's content is not in the expected format. `line` is 1-based (0: whole file).
    #[error("cannot parse {} line {line}: {reason}", path.display())]
    Parse { path: PathBuf, line: usize, reason: String },
    /// A directory could not be listed, created or removed.
    #[error("cannot {op} directory {}", path.display())]
    Dir {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A system call failed for thread `tid` (0 when not about a thread).
    #[error("{call} failed for tid {tid}")]
    Syscall {
        call: &'static str,
        tid: i32,
        #[source]
        source: io::Error,
    },
    /// The process or thread exited (ENOENT/ESRCH): callers sampling threads usually skip it.
    #[error("process {pid}{} vanished", tid.map(|t| format!(" thread {t}")).unwrap_or_default())]
    Vanished { pid: i32, tid: Option<i32> },
    /// gleaner only creates, changes and removes cgroups whose name starts with `gleaner`.
    #[error("refusing to touch {}: not a gleaner cgroup (name must start with 'gleaner')", path.display())]
    NotGleanerCgroup { path: PathBuf },
    /// A file or directory the agents keep for themselves is not theirs alone (a symlink, a
    /// FIFO, another user's file, writable by others): it is neither followed nor used.
    #[error("refusing {}: {reason}", path.display())]
    NotPrivate { path: PathBuf, reason: String },
    /// No usable cpuset controller was found.
    #[error("no cpuset cgroup controller: {reason}")]
    NoCpuset { reason: String },
    /// An argument is outside what the kernel interface accepts.
    #[error("argument rejected")]
    BadInput(#[from] BadInput),
}

impl OsError {
    /// True when the error says the process or thread has exited.
    pub fn is_vanished(&self) -> bool {
        matches!(self, OsError::Vanished { .. })
    }
}

/// `Result` with [`OsError`].
pub type Result<T> = std::result::Result<T, OsError>;

/// True for the errno values that mean "that process/thread is gone".
pub(crate) fn is_gone(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH)) || e.kind() == io::ErrorKind::NotFound
}
