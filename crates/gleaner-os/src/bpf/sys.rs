//! The `bpf(2)` commands the tracer needs, one safe wrapper each, and the `/proc/self/fdinfo`
//! reader (the ids of a program's maps; its run statistics come from `BPF_OBJ_GET_INFO_BY_FD`).
//!
//! `libc` has the syscall number (`SYS_bpf`) but not `union bpf_attr`; each command's member of
//! the union is defined here as its own `#[repr(C)]` struct, copied from
//! `include/uapi/linux/bpf.h` (the `__aligned_u64` fields are `u64` in an 8-aligned struct, with
//! explicit padding). The kernel takes a prefix of the union: it zero-fills whatever a shorter
//! struct leaves out, which is how libbpf calls it too.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use super::insn::Insn;

/// `enum bpf_cmd`.
mod cmd {
    pub const MAP_CREATE: libc::c_long = 0;
    pub const MAP_LOOKUP_ELEM: libc::c_long = 1;
    pub const MAP_UPDATE_ELEM: libc::c_long = 2;
    pub const MAP_DELETE_ELEM: libc::c_long = 3;
    pub const MAP_GET_NEXT_KEY: libc::c_long = 4;
    pub const PROG_LOAD: libc::c_long = 5;
    pub const PROG_TEST_RUN: libc::c_long = 10;
    pub const PROG_GET_FD_BY_ID: libc::c_long = 13;
    pub const MAP_GET_FD_BY_ID: libc::c_long = 14;
    pub const OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    pub const RAW_TRACEPOINT_OPEN: libc::c_long = 17;
    pub const MAP_LOOKUP_BATCH: libc::c_long = 24;
    pub const ENABLE_STATS: libc::c_long = 32;
}

/// `enum bpf_map_type` values used here.
pub mod map_type {
    pub const HASH: u32 = 1;
    pub const ARRAY: u32 = 2;
    pub const PERCPU_ARRAY: u32 = 6;
    pub const LRU_HASH: u32 = 9;
}

/// `BPF_PROG_TYPE_RAW_TRACEPOINT`: the context is `u64 args[]`, the tracepoint's arguments.
pub const PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
/// `BPF_STATS_RUN_TIME` (`enum bpf_stats_type`).
const STATS_RUN_TIME: u32 = 0;
/// `BPF_OBJ_NAME_LEN`.
const OBJ_NAME_LEN: usize = 16;
/// `BPF_ANY`: create or replace.
pub const UPDATE_ANY: u64 = 0;

/// `bpf_attr` for `BPF_MAP_CREATE` (up to `btf_vmlinux_value_type_id`).
#[repr(C, align(8))]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; OBJ_NAME_LEN],
    map_ifindex: u32,
    btf_fd: u32,
    btf_key_type_id: u32,
    btf_value_type_id: u32,
    btf_vmlinux_value_type_id: u32,
}

/// `bpf_attr` for `BPF_MAP_*_ELEM` and `BPF_MAP_GET_NEXT_KEY` (`value` is `next_key` there).
#[repr(C, align(8))]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `bpf_attr` for `BPF_MAP_*_BATCH`.
#[repr(C, align(8))]
struct MapBatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// `bpf_attr` for `BPF_PROG_LOAD` (up to `expected_attach_type`).
#[repr(C, align(8))]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; OBJ_NAME_LEN],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `bpf_attr` for `BPF_PROG_TEST_RUN` (`test`).
#[repr(C, align(8))]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// `bpf_attr` for `BPF_RAW_TRACEPOINT_OPEN` (`raw_tracepoint`).
#[repr(C, align(8))]
struct RawTracepointAttr {
    name: u64,
    prog_fd: u32,
    _pad: u32,
    cookie: u64,
}

/// `bpf_attr` for `BPF_*_GET_FD_BY_ID`.
#[repr(C, align(8))]
struct GetFdByIdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
    token_fd: i32,
}

/// `bpf_attr` for `BPF_ENABLE_STATS` (`enable_stats`). The explicit padding is zeroed: the
/// kernel refuses (EINVAL) an attr whose bytes past the last field are not zero, and implicit
/// padding holds whatever was on the stack (the call failed now and then).
#[repr(C, align(8))]
struct EnableStatsAttr {
    stats_type: u32,
    _pad: u32,
}

/// The `bpf(2)` system call.
///
/// # Safety
///
/// `attr` must point to a live, initialized `T` that is the member of `union bpf_attr` that
/// `cmd` reads, and every pointer inside it must be valid for what `cmd` does with it (reads
/// or writes of the sizes given in, or implied by, the struct).
unsafe fn sys_bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    let size = libc::c_uint::try_from(std::mem::size_of::<T>()).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
    // SAFETY: the caller upholds the contract above; `size` is the size of `*attr`.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Takes ownership of a new file descriptor returned by `bpf(2)`.
fn owned_fd(r: libc::c_long) -> io::Result<OwnedFd> {
    let fd = RawFd::try_from(r).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned `fd` as a new descriptor of this process, owned by no
    // one else yet.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fd_u32(fd: BorrowedFd<'_>) -> u32 {
    // A live descriptor is never negative.
    u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX)
}

fn name_bytes(name: &str) -> [u8; OBJ_NAME_LEN] {
    let mut out = [0u8; OBJ_NAME_LEN];
    for (o, b) in out.iter_mut().zip(name.bytes().take(OBJ_NAME_LEN - 1)) {
        *o = b;
    }
    out
}

/// What a map is made of.
#[derive(Debug, Clone, Copy)]
pub struct MapSpec {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    /// Shown by `bpftool map` (15 bytes at most: `[A-Za-z0-9_.]`).
    pub name: &'static str,
}

/// A map: its fd and the sizes every access is checked against.
#[derive(Debug)]
pub struct Map {
    fd: OwnedFd,
    spec: MapSpec,
    /// Bytes of one element's value as user space sees it: `value_size`, or for a per-CPU
    /// map `round_up(value_size, 8)` per possible CPU.
    value_len: usize,
}

fn usize_of(v: u32) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

impl Map {
    /// `BPF_MAP_CREATE`. `possible_cpus` is the number of possible CPUs (the kernel's
    /// `num_possible_cpus()`), which sizes the values of per-CPU maps.
    pub fn create(spec: MapSpec, possible_cpus: usize) -> io::Result<Map> {
        let mut attr = MapCreateAttr {
            map_type: spec.map_type,
            key_size: spec.key_size,
            value_size: spec.value_size,
            max_entries: spec.max_entries,
            map_name: name_bytes(spec.name),
            ..MapCreateAttr::default()
        };
        // SAFETY: `attr` is the BPF_MAP_CREATE member and holds no pointers.
        let fd = owned_fd(unsafe { sys_bpf(cmd::MAP_CREATE, &mut attr) }?)?;
        let value_len = if spec.map_type == map_type::PERCPU_ARRAY {
            usize_of(spec.value_size).next_multiple_of(8) * possible_cpus.max(1)
        } else {
            usize_of(spec.value_size)
        };
        Ok(Map { fd, spec, value_len })
    }

    /// The map's fd (for `ld_map_fd`).
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    pub fn spec(&self) -> &MapSpec {
        &self.spec
    }

    /// Bytes of one value as `lookup` fills it (all CPUs' copies for a per-CPU map).
    pub fn value_len(&self) -> usize {
        self.value_len
    }

    fn check(&self, key: &[u8], value_len: Option<usize>) -> io::Result<()> {
        let key_ok = key.len() == usize_of(self.spec.key_size);
        let value_ok = value_len.is_none_or(|v| v == self.value_len);
        if key_ok && value_ok {
            Ok(())
        } else {
            Err(einval())
        }
    }

    fn elem(&self, cmd: libc::c_long, key: &[u8], value: u64, flags: u64) -> io::Result<()> {
        let mut attr = MapElemAttr { map_fd: fd_u32(self.fd()), _pad: 0, key: key.as_ptr() as u64, value, flags };
        // SAFETY: `attr` is the BPF_MAP_*_ELEM member; the callers checked that `key` holds
        // `key_size` bytes and that `value` (0 for delete) points to `value_len` bytes, which
        // is what the kernel copies for this map type.
        unsafe { sys_bpf(cmd, &mut attr) }.map(|_| ())
    }

    /// `BPF_MAP_LOOKUP_ELEM` into `value` (`value_len()` bytes); false when there is no such
    /// key.
    pub fn lookup(&self, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
        self.check(key, Some(value.len()))?;
        match self.elem(cmd::MAP_LOOKUP_ELEM, key, value.as_mut_ptr() as u64, 0) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `BPF_MAP_UPDATE_ELEM` (`value` is `value_len()` bytes).
    pub fn update(&self, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
        self.check(key, Some(value.len()))?;
        self.elem(cmd::MAP_UPDATE_ELEM, key, value.as_ptr() as u64, flags)
    }

    /// `BPF_MAP_DELETE_ELEM`; false when there was no such key.
    pub fn delete(&self, key: &[u8]) -> io::Result<bool> {
        self.check(key, None)?;
        match self.elem(cmd::MAP_DELETE_ELEM, key, 0, 0) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Every key (`BPF_MAP_GET_NEXT_KEY` from the start), `key_size` bytes each.
    pub fn keys(&self) -> io::Result<Vec<Vec<u8>>> {
        let ks = usize_of(self.spec.key_size);
        let mut out: Vec<Vec<u8>> = Vec::new();
        loop {
            let mut next = vec![0u8; ks];
            let prev = out.last().map_or(0, |k| k.as_ptr() as u64);
            let mut attr = MapElemAttr { map_fd: fd_u32(self.fd()), _pad: 0, key: prev, value: next.as_mut_ptr() as u64, flags: 0 };
            // SAFETY: `attr` is the BPF_MAP_GET_NEXT_KEY member: `key` is 0 (start) or a
            // `key_size`-byte key we own, `next_key` points to `key_size` writable bytes.
            match unsafe { sys_bpf(cmd::MAP_GET_NEXT_KEY, &mut attr) } {
                Ok(_) => out.push(next),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
                Err(e) => return Err(e),
            }
            if out.len() > usize_of(self.spec.max_entries) {
                // Keys deleted and re-added under us could loop: give up rather than spin.
                return Ok(out);
            }
        }
    }

    /// Values of keys `0..n` of an array map in one call (`BPF_MAP_LOOKUP_BATCH`), `value_len()`
    /// bytes each, in key order.
    pub fn lookup_array(&self, n: u32) -> io::Result<Vec<u8>> {
        if self.spec.map_type != map_type::ARRAY || self.spec.key_size != 4 || n > self.spec.max_entries {
            return Err(einval());
        }
        let n_us = usize_of(n);
        let mut keys = vec![0u8; n_us * 4];
        let mut values = vec![0u8; n_us * self.value_len];
        let mut out_batch = 0u32;
        let mut attr = MapBatchAttr {
            in_batch: 0,
            out_batch: std::ptr::from_mut(&mut out_batch) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: n,
            map_fd: fd_u32(self.fd()),
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: `attr` is the BPF_MAP_LOOKUP_BATCH member: at most `count` keys (4 bytes
        // each) and values (`value_size` each, not per-CPU: checked above) are written into
        // buffers of that size, and `out_batch` is a 4-byte key.
        let r = unsafe { sys_bpf(cmd::MAP_LOOKUP_BATCH, &mut attr) };
        match r {
            Ok(_) => {}
            // ENOENT: the end of the map was reached (count says how many were copied).
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        if attr.count != n {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("batch lookup returned {} of {n} elements", attr.count)));
        }
        Ok(values)
    }
}

/// `BPF_PROG_LOAD` of a GPL program. With `log`, the verifier writes its log there (level 1);
/// without, it runs silently (faster: callers load once without a log, and again with one
/// to explain a refusal).
pub fn prog_load(prog_type: u32, insns: &[Insn], name: &str, log: Option<&mut [u8]>) -> io::Result<OwnedFd> {
    const LICENSE: &CStr = c"GPL";
    let insn_cnt = u32::try_from(insns.len()).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
    let (log_level, log_size, log_buf) = match log {
        Some(buf) => (1, u32::try_from(buf.len()).unwrap_or(u32::MAX), buf.as_mut_ptr() as u64),
        None => (0, 0, 0),
    };
    let mut attr = ProgLoadAttr {
        prog_type,
        insn_cnt,
        insns: insns.as_ptr() as u64,
        license: LICENSE.as_ptr() as u64,
        log_level,
        log_size,
        log_buf,
        prog_name: name_bytes(name),
        ..ProgLoadAttr::default()
    };
    // SAFETY: `attr` is the BPF_PROG_LOAD member: `insns` points to `insn_cnt` 8-byte
    // instructions, `license` to a NUL-terminated string, `log_buf` (if any) to `log_size`
    // writable bytes; all outlive the call.
    owned_fd(unsafe { sys_bpf(cmd::PROG_LOAD, &mut attr) }?)
}

/// `BPF_RAW_TRACEPOINT_OPEN`: attaches `prog` to the raw tracepoint `name` until the returned
/// fd is closed.
pub fn raw_tracepoint_open(name: &CStr, prog: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut attr = RawTracepointAttr { name: name.as_ptr() as u64, prog_fd: fd_u32(prog), _pad: 0, cookie: 0 };
    // SAFETY: `attr` is the BPF_RAW_TRACEPOINT_OPEN member; `name` is NUL-terminated and
    // outlives the call.
    owned_fd(unsafe { sys_bpf(cmd::RAW_TRACEPOINT_OPEN, &mut attr) }?)
}

/// `BPF_PROG_TEST_RUN` of a raw tracepoint program with `args` as its context, on the calling
/// CPU; returns the program's return value (`R0`, truncated to 32 bits by the kernel).
pub fn prog_test_run_raw_tp(prog: BorrowedFd<'_>, args: &[u64]) -> io::Result<u32> {
    let ctx_size_in = u32::try_from(std::mem::size_of_val(args)).map_err(|_| einval())?;
    let mut attr = TestRunAttr { prog_fd: fd_u32(prog), ctx_size_in, ctx_in: args.as_ptr() as u64, ..TestRunAttr::default() };
    // SAFETY: `attr` is the BPF_PROG_TEST_RUN member; `ctx_in` points to `ctx_size_in`
    // readable bytes; no output buffer is given.
    unsafe { sys_bpf(cmd::PROG_TEST_RUN, &mut attr) }?;
    Ok(attr.retval)
}

/// `bpf_attr` for `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C, align(8))]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// `struct bpf_prog_info` up to `recursion_misses` (Linux 5.12). With every count and pointer
/// 0 the kernel copies no arrays: it fills the prefix it knows and says how long that is.
#[repr(C, align(8))]
#[derive(Default)]
struct ProgInfo {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; OBJ_NAME_LEN],
    ifindex: u32,
    gpl_compatible: u32,
    netns_dev: u64,
    netns_ino: u64,
    nr_jited_ksyms: u32,
    nr_jited_func_lens: u32,
    jited_ksyms: u64,
    jited_func_lens: u64,
    btf_id: u32,
    func_info_rec_size: u32,
    func_info: u64,
    nr_func_info: u32,
    nr_line_info: u32,
    line_info: u64,
    jited_line_info: u64,
    nr_jited_line_info: u32,
    line_info_rec_size: u32,
    jited_line_info_rec_size: u32,
    nr_prog_tags: u32,
    prog_tags: u64,
    run_time_ns: u64,
    run_cnt: u64,
    recursion_misses: u64,
}

// The offsets of include/uapi/linux/bpf.h.
const _: () = assert!(std::mem::offset_of!(ProgInfo, name) == 64);
const _: () = assert!(std::mem::offset_of!(ProgInfo, run_time_ns) == 192);
const _: () = assert!(std::mem::size_of::<ProgInfo>() == 216);

/// A program's run-time statistics (`BPF_OBJ_GET_INFO_BY_FD`): (`run_time_ns`, `run_cnt`,
/// `recursion_misses`), the last 0 before Linux 5.12. `Ok(None)` on a kernel whose
/// `bpf_prog_info` has no statistics (before 5.1). One system call, where the same numbers from
/// `/proc/self/fdinfo` take an open, a read and a close and a parse.
pub fn prog_run_stats(prog: BorrowedFd<'_>) -> io::Result<Option<(u64, u64, u64)>> {
    let mut info = ProgInfo::default();
    let len = u32::try_from(std::mem::size_of::<ProgInfo>()).map_err(|_| einval())?;
    let mut attr = InfoAttr { bpf_fd: fd_u32(prog), info_len: len, info: std::ptr::from_mut(&mut info) as u64 };
    // SAFETY: `attr` is the BPF_OBJ_GET_INFO_BY_FD member; `info` points to `info_len`
    // writable bytes of a live `ProgInfo`, whose array pointers are all 0 (nothing else is
    // written).
    unsafe { sys_bpf(cmd::OBJ_GET_INFO_BY_FD, &mut attr) }?;
    let covers = |end: usize| attr.info_len as usize >= end;
    if !covers(std::mem::offset_of!(ProgInfo, run_cnt) + 8) {
        return Ok(None);
    }
    let misses = if covers(std::mem::size_of::<ProgInfo>()) { info.recursion_misses } else { 0 };
    Ok(Some((info.run_time_ns, info.run_cnt, misses)))
}

fn get_fd_by_id(cmd: libc::c_long, id: u32) -> io::Result<OwnedFd> {
    let mut attr = GetFdByIdAttr { id, next_id: 0, open_flags: 0, token_fd: 0 };
    // SAFETY: `attr` is the BPF_*_GET_FD_BY_ID member and holds no pointers.
    owned_fd(unsafe { sys_bpf(cmd, &mut attr) }?)
}

/// `BPF_PROG_GET_FD_BY_ID`: ENOENT once the program is freed.
pub fn prog_get_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    get_fd_by_id(cmd::PROG_GET_FD_BY_ID, id)
}

/// `BPF_MAP_GET_FD_BY_ID`: ENOENT once the map is freed.
pub fn map_get_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    get_fd_by_id(cmd::MAP_GET_FD_BY_ID, id)
}

/// `BPF_ENABLE_STATS(BPF_STATS_RUN_TIME)`: programs' run time and count are kept while the
/// returned fd is open (the kernel counts the holders; `kernel.bpf_stats_enabled` is not
/// touched).
pub fn enable_stats() -> io::Result<OwnedFd> {
    let mut attr = EnableStatsAttr { stats_type: STATS_RUN_TIME, _pad: 0 };
    // SAFETY: `attr` is the BPF_ENABLE_STATS member and holds no pointers.
    owned_fd(unsafe { sys_bpf(cmd::ENABLE_STATS, &mut attr) }?)
}

/// `/proc/self/fdinfo/<fd>` as `key: value` pairs (`prog_id`, `run_time_ns`, `run_cnt`,
/// `recursion_misses`, `map_id`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FdInfo(BTreeMap<String, String>);

impl FdInfo {
    /// Reads the fdinfo of one of this process's descriptors.
    pub fn of(fd: BorrowedFd<'_>) -> io::Result<FdInfo> {
        let path = format!("/proc/self/fdinfo/{}", fd.as_raw_fd());
        let text = std::fs::read_to_string(&path)?;
        parse_fdinfo(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{path}: {e}")))
    }

    /// A numeric field.
    #[must_use]
    pub fn u64(&self, key: &str) -> Option<u64> {
        self.0.get(key).and_then(|v| v.parse().ok())
    }

    /// A field as written.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
}

/// Parses fdinfo text: one `key:\tvalue` per line. A line without `:` is an error naming it.
pub fn parse_fdinfo(text: &str) -> Result<FdInfo, String> {
    let mut m = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let (k, v) = line.split_once(':').ok_or_else(|| format!("line {}: '{line}' is not 'key: value'", i + 1))?;
        m.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(FdInfo(m))
}

/// Capability bits (`include/uapi/linux/capability.h`).
pub mod cap {
    pub const SYS_ADMIN: u32 = 21;
    pub const PERFMON: u32 = 38;
    pub const BPF: u32 = 39;
}

/// The effective capability set from `/proc/self/status` text (`CapEff:` in hex).
pub fn parse_cap_eff(status: &str) -> Result<u64, String> {
    let line = status.lines().find_map(|l| l.strip_prefix("CapEff:")).ok_or("no CapEff line")?;
    u64::from_str_radix(line.trim(), 16).map_err(|_| format!("CapEff '{}' is not hexadecimal", line.trim()))
}

/// True when the effective set `caps` may load and attach tracing programs: `CAP_BPF` and
/// `CAP_PERFMON` (Linux >= 5.8), or `CAP_SYS_ADMIN`, which implies both.
#[must_use]
pub fn caps_allow_tracing(caps: u64) -> bool {
    let has = |c: u32| caps & (1u64 << c) != 0;
    has(cap::SYS_ADMIN) || (has(cap::BPF) && has(cap::PERFMON))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_layouts_match_the_uapi_offsets() {
        use std::mem::{offset_of, size_of};
        assert_eq!(offset_of!(MapCreateAttr, map_name), 28);
        assert_eq!(offset_of!(MapCreateAttr, btf_vmlinux_value_type_id), 60);
        assert_eq!((offset_of!(MapElemAttr, key), offset_of!(MapElemAttr, flags), size_of::<MapElemAttr>()), (8, 24, 32));
        assert_eq!((offset_of!(MapBatchAttr, count), offset_of!(MapBatchAttr, map_fd), size_of::<MapBatchAttr>()), (32, 36, 56));
        assert_eq!(offset_of!(ProgLoadAttr, log_buf), 32);
        assert_eq!(offset_of!(ProgLoadAttr, prog_name), 48);
        assert_eq!(offset_of!(ProgLoadAttr, expected_attach_type), 68);
        assert_eq!((offset_of!(TestRunAttr, ctx_in), offset_of!(TestRunAttr, flags), size_of::<TestRunAttr>()), (48, 64, 80));
        assert_eq!((offset_of!(RawTracepointAttr, prog_fd), offset_of!(RawTracepointAttr, cookie)), (8, 16));
    }

    #[test]
    fn fdinfo_valid() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nprog_type:\t17\nprog_jited:\t1\nprog_tag:\ta1b2c3\nprog_id:\t42\nrun_time_ns:\t123456\nrun_cnt:\t789\nrecursion_misses:\t0\nverified_insns:\t97\n";
        let f = parse_fdinfo(text).unwrap();
        assert_eq!((f.u64("prog_id"), f.u64("run_time_ns"), f.u64("run_cnt")), (Some(42), Some(123_456), Some(789)));
        assert_eq!(f.get("prog_tag"), Some("a1b2c3"));
        assert_eq!(f.u64("map_id"), None);
    }

    #[test]
    fn fdinfo_malformed_line_is_named() {
        let e = parse_fdinfo("prog_id:\t1\ngarbage without colon\n").unwrap_err();
        assert!(e.contains("line 2") && e.contains("garbage"), "{e}");
        let f = parse_fdinfo("run_cnt:\tmany\n").unwrap();
        assert_eq!(f.u64("run_cnt"), None, "a non-numeric value is not a number");
    }

    #[test]
    fn fdinfo_empty() {
        assert_eq!(parse_fdinfo("").unwrap(), FdInfo::default());
        assert_eq!(parse_fdinfo("\n\n").unwrap().u64("run_cnt"), None);
    }

    #[test]
    fn cap_eff_valid() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t000001ffffffffff\n";
        let caps = parse_cap_eff(status).unwrap();
        assert!(caps_allow_tracing(caps));
        assert!(caps_allow_tracing(1 << cap::SYS_ADMIN));
        assert!(caps_allow_tracing((1 << cap::BPF) | (1 << cap::PERFMON)));
        assert!(!caps_allow_tracing(1 << cap::BPF), "CAP_BPF alone cannot attach tracing programs");
        assert!(!caps_allow_tracing(0));
    }

    #[test]
    fn cap_eff_malformed() {
        let e = parse_cap_eff("CapEff:\tzz\n").unwrap_err();
        assert!(e.contains("'zz'"), "{e}");
    }

    #[test]
    fn cap_eff_empty() {
        assert_eq!(parse_cap_eff(""), Err("no CapEff line".to_string()));
    }
}
