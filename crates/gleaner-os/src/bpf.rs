//! An in-kernel scheduler tracer, written in Rust down to the eBPF instructions: no C
//! toolchain, libbpf, libelf or bpftool at build or run time.
//!
//! ```text
//!  insn   the encoder: const fns for the 8-byte bpf_insn, Asm (labels, ld_imm64 map fds)
//!  sys    bpf(2): map create/lookup/update/delete/next-key/batch, prog load (verifier log),
//!         raw tracepoint open, test run, enable stats, fd by id; fdinfo and CapEff readers
//!  progs  the three programs (sched_waking, cpu_idle, sched_switch) and the map layouts
//! ```

pub mod insn;
pub mod progs;
pub mod sys;

#[cfg(test)]
mod tests;
