//! File helpers that attach the path (and pid/tid) to every error.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{is_gone, OsError, Result};

/// Reads a whole file to a string.
pub(crate) fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|source| OsError::Read { path: path.to_path_buf(), source })
}

/// Reads a file, `None` when it does not exist.
pub(crate) fn read_opt(path: &Path) -> Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(OsError::Read { path: path.to_path_buf(), source }),
    }
}

/// Reads a per-process file; ENOENT/ESRCH become [`OsError::Vanished`].
pub(crate) fn read_proc(path: &Path, pid: i32, tid: Option<i32>) -> Result<String> {
    match fs::read(path) {
        Ok(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        Err(e) if is_gone(&e) => Err(OsError::Vanished { pid, tid }),
        Err(source) => Err(OsError::Read { path: path.to_path_buf(), source }),
    }
}

/// Writes `value` to a file (no create, no truncate semantics beyond what sysfs does).
pub(crate) fn write(path: &Path, value: &str) -> Result<()> {
    use std::io::Write;
    let r = fs::OpenOptions::new().write(true).truncate(true).open(path).and_then(|mut f| f.write_all(value.as_bytes()));
    r.map_err(|source| OsError::Write { path: path.to_path_buf(), value: value.to_string(), source })
}

/// Lists directory entry names.
pub(crate) fn list_dir(path: &Path) -> Result<Vec<String>> {
    let rd = fs::read_dir(path).map_err(|source| OsError::Dir { op: "list", path: path.to_path_buf(), source })?;
    let mut out = Vec::new();
    for e in rd {
        let e = e.map_err(|source| OsError::Dir { op: "list", path: path.to_path_buf(), source })?;
        out.push(e.file_name().to_string_lossy().into_owned());
    }
    out.sort();
    Ok(out)
}

/// A parse error for `path` at 1-based `line`.
pub(crate) fn parse_err(path: &Path, line: usize, reason: impl Into<String>) -> OsError {
    OsError::Parse { path: path.to_path_buf(), line, reason: reason.into() }
}

/// Parses an unsigned integer field, naming it in the error.
pub(crate) fn parse_u64(path: &Path, line: usize, what: &str, s: &str) -> Result<u64> {
    s.trim().parse::<u64>().map_err(|_| parse_err(path, line, format!("{what}: '{s}' is not an unsigned integer")))
}

/// A procfs or sysfs file kept open and re-read from offset 0 with one `pread` (the kernel regenerates
/// the text at each read), no allocation: cheap enough for a hot loop.
#[derive(Debug)]
pub(crate) struct Reread {
    pub(crate) path: PathBuf,
    file: std::fs::File,
}

impl Reread {
    pub(crate) fn open(path: PathBuf) -> Result<Self> {
        let file = std::fs::File::open(&path).map_err(|source| OsError::Read { path: path.clone(), source })?;
        Ok(Self { path, file })
    }

    /// The file's current text, in `buf`.
    pub(crate) fn read<'b>(&self, buf: &'b mut [u8]) -> Result<&'b [u8]> {
        use std::os::unix::fs::FileExt;
        let n = self.file.read_at(buf, 0).map_err(|source| OsError::Read { path: self.path.clone(), source })?;
        Ok(&buf[..n])
    }

    /// The file's current text, which must be shorter than `buf` (a text that fills it may be
    /// cut short, and a prefix could parse as a wrong value): `what` names the file in the error.
    pub(crate) fn read_short<'b>(&self, buf: &'b mut [u8], what: &str) -> Result<&'b [u8]> {
        let len = buf.len();
        let text = self.read(buf)?;
        if text.len() == len {
            return Err(parse_err(&self.path, 1, format!("{len} bytes or more: longer than any {what}")));
        }
        Ok(text)
    }

    /// [`Self::read_short`] as UTF-8 text.
    pub(crate) fn read_short_str<'b>(&self, buf: &'b mut [u8], what: &str) -> Result<&'b str> {
        let text = self.read_short(buf, what)?;
        std::str::from_utf8(text).map_err(|_| parse_err(&self.path, 1, "not UTF-8"))
    }

    /// The file's whole current text, read with one `pread` into `buf` (kept between reads),
    /// which grows and reads again while the text fills it.
    pub(crate) fn read_text<'b>(&self, buf: &'b mut Vec<u8>) -> Result<&'b str> {
        if buf.len() < 512 {
            buf.resize(4096, 0);
        }
        let n = loop {
            let n = self.read(buf)?.len();
            if n < buf.len() {
                break n;
            }
            let grown = buf.len() * 2;
            buf.resize(grown, 0);
        };
        std::str::from_utf8(&buf[..n]).map_err(|_| parse_err(&self.path, 1, "not UTF-8"))
    }
}
