//! `/proc/self/mountinfo`: its lines, parsed.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::Result;
use crate::util::parse_err;

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MountInfo {
    /// Root of the mount within its filesystem (field 4).
    pub root: String,
    /// Where it is mounted (field 5, octal escapes decoded).
    pub mount_point: PathBuf,
    /// Filesystem type (`cgroup`, `cgroup2`, `proc`, ...).
    pub fstype: String,
    /// Mount source (`cgroup`, `/dev/vda`, ...).
    pub source: String,
    /// Per-superblock options (for cgroup v1 these name the controllers: `rw,cpuset`).
    pub super_options: Vec<String>,
}

/// Decodes the octal escapes (`\040` for space) mountinfo uses in paths. A backslash not
/// followed by three octal digits of a byte value (`\000`..=`\377`) is kept as it is.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && (b'0'..=b'3').contains(&b[i + 1])
            && b[i + 2..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses `/proc/self/mountinfo`.
pub fn parse_mountinfo(path: &Path, text: &str) -> Result<Vec<MountInfo>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let (pre, post) = line.split_once(" - ").ok_or_else(|| parse_err(path, i + 1, "no ' - ' separator before the filesystem type"))?;
        let pre: Vec<&str> = pre.split_whitespace().collect();
        let post: Vec<&str> = post.split_whitespace().collect();
        if pre.len() < 6 {
            return Err(parse_err(path, i + 1, format!("{} fields before ' - ', need 6", pre.len())));
        }
        if post.len() < 2 {
            return Err(parse_err(path, i + 1, "need fstype and source after ' - '"));
        }
        out.push(MountInfo {
            root: unescape_mount(pre[3]),
            mount_point: PathBuf::from(unescape_mount(pre[4])),
            fstype: post[0].to_string(),
            source: unescape_mount(post[1]),
            super_options: post.get(2).map(|o| o.split(',').map(str::to_string).collect()).unwrap_or_default(),
        });
    }
    Ok(out)
}
