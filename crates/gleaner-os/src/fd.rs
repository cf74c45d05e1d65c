//! Waiting on file descriptors (pidfds, pipes) with a timeout.

use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

/// True once `fd` is readable (or at its end: a closed pipe, an exited process's pidfd),
/// false if `timeout` passed first or a signal interrupted the wait.
pub fn wait_readable(fd: impl AsFd, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd { fd: fd.as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd (the borrowed fd stays open for the call), count 1.
    let r = unsafe { libc::poll(&mut pfd, 1, ms) };
    r > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_pipe_is_readable_once_written_or_closed() {
        let (r, w) = std::io::pipe().unwrap();
        assert!(!wait_readable(&r, Duration::from_millis(10)), "empty pipe");
        let mut w = w;
        w.write_all(b"\n").unwrap();
        assert!(wait_readable(&r, Duration::from_millis(1000)), "written");
        let (r2, w2) = std::io::pipe().unwrap();
        drop(w2);
        assert!(wait_readable(&r2, Duration::ZERO), "writer closed: end of file is readable");
    }
}
