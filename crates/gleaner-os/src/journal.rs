//! The change journal of both agents: record a change in a private state file *before*
//! making it, undo from that file later (on exit, from the guardian after `kill -9`, or from
//! `restore` after a crash).
//!
//! ```text
//!   Journal<D>::create(path, doc)   dir 0700 and root's alone, file 0600, written atomically
//!   journal.record(|d| add change)  rewrite the file ...
//!   make the change                 ... then act: a crash in between leaves a record of a change
//!                                   not made, which undo (idempotent) skips
//!   undo_each(cx, changes, after)   every change undone, failures collected, never stopping early
//!   journal.discard()               the file goes once everything is undone
//!   Journal::<D>::load(path, max)   never through a symlink, only a file of ours nobody else can write
//! ```
//!
//! The document `D` is the caller's (the agent keeps an ordered list of changes, the host
//! agent a snapshot of what it changed, per thread and group); the mechanism is shared.

use std::fmt::{Debug, Display};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{OsError, Result};

/// A recorded change that can be undone.
pub trait Undo: Debug {
    /// What undoing needs (the cgroup tree, procfs, ...).
    type Context: ?Sized;
    /// Why an undo step failed.
    type Error: Display;
    /// Undoes the change. Must be idempotent: what is already undone (a group gone, a
    /// process already back, a value already original) is left alone without error, so an
    /// undo killed half-way can be run again from the same file.
    fn undo(&self, cx: &Self::Context) -> std::result::Result<(), Self::Error>;
}

/// Undoes `changes` in the order given (pass them newest first), calling `after(i)` once the
/// i-th was undone (a test seam for the agent). A failed step does not stop the others; the
/// result has one line per failure, `<change>: <error with its causes>` (empty: all undone).
pub fn undo_each<'a, C: Undo + 'a>(cx: &C::Context, changes: impl IntoIterator<Item = &'a C>, mut after: impl FnMut(usize)) -> Vec<String> {
    let mut errors = Vec::new();
    for (i, change) in changes.into_iter().enumerate() {
        if let Err(e) = change.undo(cx) {
            errors.push(format!("{change:?}: {e:#}"));
        }
        after(i);
    }
    errors
}

/// A document of changes kept in a private file, rewritten atomically on every change.
#[derive(Debug)]
pub struct Journal<D> {
    path: PathBuf,
    doc: D,
}

impl<D: Serialize + DeserializeOwned> Journal<D> {
    /// Creates the file's directory if needed (mode 0700; an existing one must be ours alone:
    /// not a symlink, nobody else can write it) and writes `doc` to `path`.
    pub fn create(path: impl Into<PathBuf>, doc: D) -> Result<Self> {
        let path = path.into();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            crate::private::create_private_dir(dir)?;
        }
        let me = Self { path, doc };
        me.write()?;
        Ok(me)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The document as last written.
    pub fn doc(&self) -> &D {
        &self.doc
    }

    /// Changes the document and writes it. Call before making the change it records.
    pub fn record(&mut self, change: impl FnOnce(&mut D)) -> Result<()> {
        change(&mut self.doc);
        self.write()
    }

    /// Replaces the file atomically, never through a symbolic link; a failed write (a full
    /// disk) names the file and leaves no partial file behind. Not synced to disk: the file
    /// must outlive the agent, not the machine, whose reboot undoes what it records.
    pub fn write(&self) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(&self.doc).map_err(|e| OsError::Parse {
            path: self.path.clone(),
            line: 0,
            reason: format!("cannot serialize: {e}"),
        })?;
        crate::private::write_private_atomic_unsynced(&self.path, &bytes)
    }

    /// Removes the file (everything it records was undone); a file already gone is fine.
    pub fn discard(self) -> Result<()> {
        remove_file(&self.path)
    }

    /// Everything recorded was undone but the journal stays in use: the document becomes
    /// `doc` (not written: nothing is left to undo) and the file is removed.
    pub fn clear(&mut self, doc: D) -> Result<()> {
        self.doc = doc;
        remove_file(&self.path)
    }

    /// Reads a journal: never through a symbolic link, only a regular file of ours that
    /// nobody else can write, of at most `max_bytes`. `None` when it is missing; a file that
    /// is not a `D` is [`OsError::Parse`] naming it.
    pub fn load(path: &Path, max_bytes: u64) -> Result<Option<D>> {
        let Some(bytes) = crate::private::read_private(path, max_bytes)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| OsError::Parse {
            path: path.to_path_buf(),
            line: e.line(),
            reason: e.to_string(),
        })
    }
}

/// Removes a journal file; one already gone is fine.
pub fn remove_file(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(OsError::Dir { op: "remove a file in", path: path.to_path_buf(), source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Step(u32);

    impl Undo for Step {
        type Context = RefCell<Vec<u32>>;
        type Error = String;
        fn undo(&self, undone: &Self::Context) -> std::result::Result<(), String> {
            if self.0 == 2 {
                return Err("step 2 cannot be undone".into());
            }
            undone.borrow_mut().push(self.0);
            Ok(())
        }
    }

    #[test]
    fn records_before_acting_and_reloads() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("run/journal.json");
        let mut j = Journal::create(&p, Vec::<Step>::new()).unwrap();
        assert_eq!(Journal::<Vec<Step>>::load(&p, 1 << 20).unwrap(), Some(vec![]));
        j.record(|d| d.push(Step(1))).unwrap();
        j.record(|d| d.push(Step(2))).unwrap();
        assert_eq!(Journal::<Vec<Step>>::load(&p, 1 << 20).unwrap(), Some(vec![Step(1), Step(2)]));
        j.clear(vec![Step(9)]).unwrap();
        assert_eq!((Journal::<Vec<Step>>::load(&p, 1 << 20).unwrap(), j.doc().clone()), (None, vec![Step(9)]));
        j.record(|d| d.push(Step(10))).unwrap();
        assert_eq!(Journal::<Vec<Step>>::load(&p, 1 << 20).unwrap(), Some(vec![Step(9), Step(10)]));
        j.discard().unwrap();
        assert_eq!(Journal::<Vec<Step>>::load(&p, 1 << 20).unwrap(), None);
        remove_file(&p).unwrap();
    }

    #[test]
    fn undo_continues_past_a_failure_and_reports_it() {
        let steps = [Step(1), Step(2), Step(3)];
        let undone = RefCell::new(Vec::new());
        let mut seen = Vec::new();
        let errors = undo_each(&undone, steps.iter().rev(), |i| seen.push(i));
        assert_eq!(*undone.borrow(), vec![3, 1]);
        assert_eq!(seen, vec![0, 1, 2]);
        assert_eq!(errors, vec!["Step(2): step 2 cannot be undone".to_string()]);
    }

    #[test]
    fn journal_valid_malformed_empty_and_symlink() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("j.json");
        std::fs::write(&p, "[1, 2]").unwrap();
        assert_eq!(Journal::<Vec<Step>>::load(&p, 1 << 20).unwrap(), Some(vec![Step(1), Step(2)]));
        std::fs::write(&p, "[1,").unwrap();
        let e = Journal::<Vec<Step>>::load(&p, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("j.json"), "{e}");
        std::fs::write(&p, "").unwrap();
        assert!(Journal::<Vec<Step>>::load(&p, 1 << 20).is_err());
        let link = d.path().join("link.json");
        std::fs::write(&p, "[]").unwrap();
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(Journal::<Vec<Step>>::load(&link, 1 << 20).is_err());
    }
}
