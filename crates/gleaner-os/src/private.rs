//! Files the agents keep for themselves in their run directory (`/run/gleaner`, root only):
//! read without following symbolic links, written atomically, and serialized between agents
//! with a lock on the directory.
//!
//! A file is used only if the directory and the file belong to the caller's effective user
//! and nobody else can write them; anything else (a symlink, a FIFO, a file of another user)
//! is [`OsError::NotPrivate`]: the caller ignores it and says so, and never follows it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{OsError, Result};

fn not_private(path: &Path, reason: impl Into<String>) -> OsError {
    OsError::NotPrivate { path: path.to_path_buf(), reason: reason.into() }
}

/// Checks owner and mode: ours, and not writable by group or others.
fn check_owner_mode(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(not_private(path, format!("owned by uid {}, not {me}", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(not_private(path, format!("writable by others (mode {:o})", meta.mode() & 0o7777)));
    }
    Ok(())
}

/// Creates `dir` (and its parents) with mode 0700, and refuses one that exists but is not
/// private: a symbolic link, another user's, or writable by others. What is in it is read and
/// acted on as root.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|source| OsError::Dir {
        op: "create",
        path: dir.to_path_buf(),
        source,
    })?;
    check_private_dir(dir)
}

/// `dir` is a real directory (not a symlink) of ours that nobody else can write.
pub fn check_private_dir(dir: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(dir).map_err(|source| OsError::Dir { op: "inspect", path: dir.to_path_buf(), source })?;
    if !meta.file_type().is_dir() {
        return Err(not_private(dir, "not a directory (symbolic links are not followed)"));
    }
    check_owner_mode(dir, &meta)
}

/// Reads `path` if it exists, without following a symbolic link and only if it is a regular
/// file of ours, not writable by others, of at most `max_len` bytes. `None` when missing.
pub fn read_private(path: &Path, max_len: u64) -> Result<Option<Vec<u8>>> {
    let opened = OpenOptions::new()
        .read(true)
        // O_NONBLOCK: a FIFO put in our place must not hang the read; it is refused below.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let mut file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(not_private(path, "a symbolic link (not followed)"));
        }
        Err(source) => return Err(OsError::Read { path: path.to_path_buf(), source }),
    };
    let meta = file.metadata().map_err(|source| OsError::Read { path: path.to_path_buf(), source })?;
    if !meta.file_type().is_file() {
        return Err(not_private(path, "not a regular file"));
    }
    check_owner_mode(path, &meta)?;
    if meta.len() > max_len {
        return Err(not_private(path, format!("{} bytes, more than the {max_len} allowed", meta.len())));
    }
    let mut buf = Vec::new();
    file.read_to_end(&mut buf).map_err(|source| OsError::Read { path: path.to_path_buf(), source })?;
    Ok(Some(buf))
}

/// Replaces `path` with `bytes` atomically: a new temp file (mode 0600, created exclusively,
/// never through a symlink) in the same directory, synced, then renamed over `path` (rename
/// replaces a symlink at `path` itself, never its target). Readers see the old or the new
/// content, never a part.
pub fn write_private_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    replace_private(path, bytes, true)
}

/// [`write_private_atomic`] without syncing the data to disk: for a record that must outlive
/// its writer's death, which the page cache already ensures, but not the machine's, since
/// what it records does not survive a reboot either (the agents' journals: cgroups and kernel
/// knobs). Each sync cost a journaled change 1-2 ms here, several of them before a managed
/// command could start.
pub fn write_private_atomic_unsynced(path: &Path, bytes: &[u8]) -> Result<()> {
    replace_private(path, bytes, false)
}

fn replace_private(path: &Path, bytes: &[u8], sync: bool) -> Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let write = |tmp: &PathBuf| -> std::io::Result<()> {
        let mut f =
            OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(tmp)?;
        f.write_all(bytes)?;
        if sync {
            f.sync_data()?;
        }
        Ok(())
    };
    if let Err(source) = write(&tmp) {
        let _ = std::fs::remove_file(&tmp);
        return Err(OsError::Write { path: tmp, value: format!("{} bytes", bytes.len()), source });
    }
    std::fs::rename(&tmp, path).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        OsError::Write { path: path.to_path_buf(), value: format!("rename from {}", tmp.display()), source }
    })
}

/// An exclusive `flock` on a directory, released when dropped (or when the process dies).
#[derive(Debug)]
pub struct DirLock {
    _dir: File,
}

/// Waits for an exclusive lock on `dir` (which must exist). A signal interrupting the wait
/// gives an error (`flock` failed, `EINTR`).
pub fn lock_dir(dir: &Path) -> Result<DirLock> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|source| OsError::Dir { op: "open", path: dir.to_path_buf(), source })?;
    // SAFETY: flock on a descriptor we own and keep open for the lifetime of the lock.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(OsError::Syscall { call: "flock", tid: 0, source: std::io::Error::last_os_error() });
    }
    Ok(DirLock { _dir: f })
}

/// Takes an exclusive `flock` on `dir` if nobody holds one: `Ok(None)` when another process
/// (or another open of the directory) holds it. Unlike [`lock_dir`] this never waits. Works on
/// cgroupfs directories too: two agents asked to manage one cgroup are told apart this way.
pub fn try_lock_dir(dir: &Path) -> Result<Option<DirLock>> {
    let f = OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC).open(dir).map_err(|source| OsError::Dir {
        op: "open",
        path: dir.to_path_buf(),
        source,
    })?;
    // SAFETY: flock on a descriptor we own and keep open for the lifetime of the lock.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let source = std::io::Error::last_os_error();
        if source.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Ok(None);
        }
        return Err(OsError::Syscall { call: "flock", tid: 0, source });
    }
    Ok(Some(DirLock { _dir: f }))
}

/// Reads a file a privileged agent acts on (its configuration), refusing it when anyone but
/// its owner could have changed it, as sshd refuses a group- or world-writable
/// configuration: the file must belong to root or to the caller and be writable by nobody
/// else, and so must every directory above it (a sticky directory such as /tmp is fine: others
/// cannot replace a file they do not own there). The checks are made on the opened file
/// (`fstat`), so what is read is what was checked. Symbolic links are followed: the
/// directories checked are those of the file they lead to.
pub fn read_trusted(path: &Path, max_len: u64) -> Result<Vec<u8>> {
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| OsError::Read { path: path.to_path_buf(), source })?;
    let meta = file.metadata().map_err(|source| OsError::Read { path: path.to_path_buf(), source })?;
    if !meta.file_type().is_file() {
        return Err(not_private(path, "not a regular file"));
    }
    check_trusted_owner_mode(path, &meta)?;
    let real = std::fs::canonicalize(path).map_err(|source| OsError::Read { path: path.to_path_buf(), source })?;
    for dir in real.ancestors().skip(1) {
        let dmeta = std::fs::metadata(dir).map_err(|source| OsError::Dir { op: "inspect", path: dir.to_path_buf(), source })?;
        if dmeta.mode() & 0o1000 == 0 {
            check_trusted_owner_mode(dir, &dmeta).map_err(|e| match e {
                OsError::NotPrivate { path: d, reason } => not_private(path, format!("its directory {} is {reason}", d.display())),
                other => other,
            })?;
        }
    }
    if meta.len() > max_len {
        return Err(not_private(path, format!("{} bytes, more than the {max_len} allowed", meta.len())));
    }
    let mut buf = Vec::new();
    file.read_to_end(&mut buf).map_err(|source| OsError::Read { path: path.to_path_buf(), source })?;
    Ok(buf)
}

/// Owner root or the caller, and not writable by group or others.
fn check_trusted_owner_mode(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != me {
        return Err(not_private(path, format!("owned by uid {}, neither root nor {me}", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(not_private(
            path,
            format!(
                "writable by others (mode {:o}): anyone who can write it could make this root agent act on it; run `chmod go-w {}`",
                meta.mode() & 0o7777,
                path.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn private_tempdir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    #[test]
    fn write_then_read_round_trips_with_mode_0600() {
        let d = private_tempdir();
        check_private_dir(d.path()).unwrap();
        let p = d.path().join("calibration.json");
        assert_eq!(read_private(&p, 1024).unwrap(), None, "missing is not an error");
        write_private_atomic(&p, b"{\"a\":1}").unwrap();
        write_private_atomic(&p, b"{\"a\":2}").unwrap();
        assert_eq!(read_private(&p, 1024).unwrap().as_deref(), Some(&b"{\"a\":2}"[..]));
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names.len(), 1, "no temp file left: {names:?}");
    }

    #[test]
    fn a_symlink_is_refused_not_followed_and_replaced_by_a_write() {
        let d = private_tempdir();
        let target = d.path().join("elsewhere");
        std::fs::write(&target, b"secret").unwrap();
        let p = d.path().join("calibration.json");
        std::os::unix::fs::symlink(&target, &p).unwrap();
        let e = read_private(&p, 1024).unwrap_err();
        assert!(matches!(e, OsError::NotPrivate { .. }) && e.to_string().contains("symbolic link"), "{e}");
        write_private_atomic(&p, b"new").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"secret", "the link's target is untouched");
        assert!(std::fs::symlink_metadata(&p).unwrap().file_type().is_file());
    }

    #[test]
    fn fifo_group_writable_and_oversized_files_are_refused() {
        let d = private_tempdir();
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(read_private(&fifo, 1024).unwrap_err().to_string().contains("not a regular file"));
        let p = d.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(read_private(&p, 1024).unwrap_err().to_string().contains("writable by others"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(read_private(&p, 4).unwrap_err().to_string().contains("10 bytes"));
    }

    #[test]
    fn a_shared_or_linked_directory_is_not_private() {
        let d = private_tempdir();
        let open = d.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(check_private_dir(&open).unwrap_err().to_string().contains("writable by others"));
        let link = d.path().join("link");
        std::os::unix::fs::symlink(d.path(), &link).unwrap();
        assert!(check_private_dir(&link).unwrap_err().to_string().contains("not a directory"));
        assert!(matches!(check_private_dir(&d.path().join("missing")).unwrap_err(), OsError::Dir { .. }));
    }

    #[test]
    fn try_lock_says_when_the_directory_is_held() {
        let d = private_tempdir();
        let first = try_lock_dir(d.path()).unwrap().expect("free directory");
        assert!(try_lock_dir(d.path()).unwrap().is_none(), "second lock taken while the first is held");
        drop(first);
        assert!(try_lock_dir(d.path()).unwrap().is_some(), "lock released on drop");
    }

    #[test]
    fn a_trusted_file_is_read_and_a_writable_one_is_refused_with_the_fix() {
        let d = private_tempdir();
        let p = d.path().join("gleaner.toml");
        std::fs::write(&p, b"period_ms = 100\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read_trusted(&p, 1024).unwrap(), b"period_ms = 100\n");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = read_trusted(&p, 1024).unwrap_err().to_string();
        assert!(e.contains("writable by others (mode 666)") && e.contains("chmod go-w"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o620)).unwrap();
        assert!(read_trusted(&p, 1024).unwrap_err().to_string().contains("mode 620"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(read_trusted(&p, 4).unwrap_err().to_string().contains("more than the 4 allowed"));
        assert!(matches!(read_trusted(&d.path().join("missing"), 1024).unwrap_err(), OsError::Read { .. }));
    }

    #[test]
    fn a_trusted_file_in_a_directory_others_can_write_is_refused_unless_sticky() {
        let d = private_tempdir();
        let open = d.path().join("open");
        std::fs::create_dir(&open).unwrap();
        let p = open.join("gleaner.toml");
        std::fs::write(&p, b"x").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = read_trusted(&p, 1024).unwrap_err().to_string();
        assert!(e.contains(&format!("its directory {} is writable by others", open.display())), "{e}");
        // Through a symlink from a private place, the file's real directory is what counts.
        let link = d.path().join("link.toml");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(read_trusted(&link, 1024).unwrap_err().to_string().contains("writable by others"));
        // A sticky directory (like /tmp) is fine: others cannot replace a file they do not own.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(read_trusted(&p, 1024).unwrap(), b"x");
        assert_eq!(read_trusted(&link, 1024).unwrap(), b"x");
    }

    /// Whether thread `tid` of this process is inside `flock(2)` now (`/proc/self/task/TID/syscall`
    /// starts with the number of the call a thread blocks in).
    fn in_flock(tid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))
            .is_ok_and(|s| s.split_whitespace().next() == Some(libc::SYS_flock.to_string().as_str()))
    }

    /// Held, the lock refuses every other holder (a non-blocking try fails at once, so a lock
    /// that does not exclude fails here however fast or slow it is), and a second `lock_dir`
    /// waits inside flock until the first is dropped, then gets it.
    #[test]
    fn the_directory_lock_excludes_a_second_holder() {
        let d = private_tempdir();
        let lock = lock_dir(d.path()).unwrap();
        assert!(try_lock_dir(d.path()).unwrap().is_none(), "a second holder while the first holds the lock");
        let path = d.path().to_path_buf();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            tid_tx.send(crate::sched::gettid()).unwrap();
            let l = lock_dir(&path).unwrap();
            tx.send(()).unwrap();
            l
        });
        let tid = tid_rx.recv().unwrap();
        // Only a hang (the thread never reaching flock) trips the deadline.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !in_flock(tid) {
            assert!(rx.try_recv().is_err(), "second lock taken while the first is held");
            assert!(std::time::Instant::now() < deadline, "the second locker never waited in flock");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(rx.try_recv().is_err(), "second lock taken while the first is held");
        drop(lock);
        rx.recv_timeout(std::time::Duration::from_secs(30)).expect("second lock after release");
        let second = t.join().unwrap();
        assert!(try_lock_dir(d.path()).unwrap().is_none(), "the second holder excludes others in turn");
        drop(second);
        assert!(try_lock_dir(d.path()).unwrap().is_some(), "free once both are dropped");
    }
}
