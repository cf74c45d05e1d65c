//! A minimal writer for the `newc` cpio format the kernel unpacks as an initramfs.
//!
//! Only what an initramfs needs: directories, regular files and symlinks, all owned by root.
//! The kernel accepts several archives concatenated, which is how a per-guest job archive is
//! appended to the cached base archive.

use std::io::{self, Write};

/// Builds one `newc` archive in memory.
#[derive(Debug, Default)]
pub struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

impl Cpio {
    pub fn new() -> Self {
        Self { buf: Vec::new(), ino: 1 }
    }

    /// A directory with mode `0o755`.
    pub fn dir(&mut self, path: &str) -> &mut Self {
        self.entry(path, 0o040_755, b"");
        self
    }

    /// A regular file with the given permission bits (`0o755`, `0o644`).
    pub fn file(&mut self, path: &str, perm: u32, data: &[u8]) -> &mut Self {
        self.entry(path, 0o100_000 | (perm & 0o7777), data);
        self
    }

    /// A symbolic link `path -> target`.
    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.entry(path, 0o120_777, target.as_bytes());
        self
    }

    fn entry(&mut self, path: &str, mode: u32, data: &[u8]) {
        let name = path.trim_start_matches('/');
        let ino = self.ino;
        self.ino += 1;
        let nlink = if mode & 0o170_000 == 0o040_000 { 2 } else { 1 };
        let namesize = name.len() + 1;
        // newc header: magic + 13 eight-digit hex fields.
        let fields: [u64; 13] = [u64::from(ino), u64::from(mode), 0, 0, nlink, 0, data.len() as u64, 0, 0, 0, 0, namesize as u64, 0];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad4();
        self.buf.extend_from_slice(data);
        self.pad4();
    }

    fn pad4(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    /// Appends the trailer and returns the archive bytes.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, b"");
        self.buf
    }

    /// Writes the finished archive.
    pub fn write_to(self, mut w: impl Write) -> io::Result<()> {
        w.write_all(&self.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_and_alignment() {
        let mut c = Cpio::new();
        c.dir("bin").file("/init", 0o755, b"#!/bin/sh\n").symlink("sh", "busybox");
        let bytes = c.finish();
        assert_eq!(&bytes[..6], b"070701");
        assert_eq!(bytes.len() % 4, 0);
        // Header is 110 bytes; "bin\0" is 4 bytes -> 114, padded to 116.
        assert_eq!(&bytes[110..113], b"bin");
        let s = String::from_utf8_lossy(&bytes);
        assert!(s.contains("TRAILER!!!"));
        assert!(s.contains("#!/bin/sh"));
        // file mode 0100755 in hex is 000081ed
        assert!(s.contains("000081ed"));
    }

    #[test]
    fn empty_archive_is_only_trailer() {
        let bytes = Cpio::new().finish();
        assert_eq!(&bytes[..6], b"070701");
        assert_eq!(bytes.len(), 124); // 110 + "TRAILER!!!\0" (11) padded to 124
    }
}
