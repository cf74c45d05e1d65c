//! An in-kernel scheduler tracer, written in Rust down to the eBPF instructions: no C
//! toolchain, libbpf, libelf or bpftool at build or run time.
//!
//! ```text
//!  insn   the encoder: const fns for the 8-byte bpf_insn, Asm (labels, ld_imm64 map fds)
//! ```

pub mod insn;
