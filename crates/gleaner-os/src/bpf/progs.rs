//! The tracer's programs, written with [`super::insn`]: one per raw tracepoint, and the
//! layouts of the maps they share with user space.
//!
//! ```text
//!  every program first         cfg.epoch == 0 (paused): return at once; a per-CPU state or
//!                              a wakeup of another epoch is stale: reset, or ignored
//!  sched_waking(p)             wake[p] = { now, this CPU, epoch }
//!  cpu_idle(state, cpu)        cpu.idle_state = state + 1           (exit event ignored)
//!  sched_switch(preempt, prev, next, prev_state)   on CPU c, current = prev:
//!   1. commit   cpu.pend_task == prev (the task switched in last time, current now, so its
//!               tgid is known): managed (cfg.track_all or tgid in `managed`)?
//!                 yes: lat[pend_state] += pend_lat; the idle gap that ended then (if any)
//!                      -> gaps[c][woken] if the waker was another CPU, else gaps[c][local]
//!                         (a timer or an interrupt on c woke it)
//!                 no:  the gap -> gaps[c][other]
//!   2. forget   prev stays runnable (preempted or prev_state == TASK_RUNNING) or exits
//!               (TASK_DEAD): delete wake[prev], so a wakeup that found it running never
//!               gives a latency
//!   3. idle     prev is the idle task (pid 0): gap = now - cpu.last_switch;
//!               pend_state = busy (prev not idle) | poll | halt | idle (no cpuidle state
//!               seen since the idle task got c); cpu.last_switch = now; idle_state = none
//!   4. wakeup   wake[next] exists: delete it; latency = now - its time; at most 1 s (older
//!               is stale): pend_task = next (committed at step 1 of c's next switch);
//!               otherwise the gap -> gaps[c][other] now
//! ```
//!
//! Every map index is bounds-checked by the kernel's lookup helper (out of range gives NULL,
//! which the programs test before any access).
//!
//! The epoch lets the programs stay attached while the tracer pauses: attaching or detaching
//! a raw tracepoint patches kernel text, which interrupts every CPU; writing the epoch is one
//! map update. A paused program costs an array lookup
//! per event. Each resume starts a new epoch, so what the programs kept from before the pause
//! (a CPU's last switch, a wakeup whose switch-in was not seen) is never paired with what
//! they see after it.

use gleaner_policy::idle::hist::BUCKETS;

use super::insn::{self, helper, op, Asm, AsmError, Insn, Label, Reg, R0, R1, R10, R2, R3, R4, R5, R6, R7, R8, R9};

/// The per-CPU state (`gl_cpu`, a per-CPU array of one element): byte offsets.
pub mod cpu_state {
    /// `ktime` of this CPU's last sched_switch (0: none seen since attach).
    pub const LAST_SWITCH: i16 = 0;
    /// The task switched in with a wakeup pending commit (0: none).
    pub const PEND_TASK: i16 = 8;
    /// Its wakeup latency, ns.
    pub const PEND_LAT: i16 = 16;
    /// The idle period its switch ended, ns (valid with `FLAG_GAP`).
    pub const PEND_GAP: i16 = 24;
    /// The state its CPU was in (index into `TargetState::ALL`).
    pub const PEND_STATE: i16 = 32;
    /// `FLAG_*` bits.
    pub const PEND_FLAGS: i16 = 36;
    /// Last cpuidle state entered + 1 since the last switch (0: none).
    pub const IDLE_STATE: i16 = 40;
    /// The epoch the fields above belong to (another: they are stale, read as zeros).
    pub const EPOCH: i16 = 48;
    pub const SIZE: u32 = 56;

    /// The previous task was the idle task.
    pub const FLAG_PREV_IDLE: i32 = 1;
    /// `PEND_GAP` holds an idle period.
    pub const FLAG_GAP: i32 = 2;
    /// The wakeup was issued on another CPU.
    pub const FLAG_CROSS: i32 = 4;
}

/// A pending wakeup (`gl_wake`, keyed by the `task_struct` pointer): byte offsets.
pub mod wake {
    pub const TS: i16 = 0;
    pub const CPU: i16 = 8;
    /// The epoch it was recorded in (another: stale, dropped).
    pub const EPOCH: i16 = 16;
    pub const SIZE: u32 = 24;
}

/// The configuration (`gl_cfg`, an array of one element): byte offsets.
pub mod cfg {
    /// Count every task's wakeups, managed or not (non-zero).
    pub const TRACK_ALL: i16 = 0;
    /// The current epoch; 0: paused.
    pub const EPOCH: i16 = 8;
    pub const SIZE: u32 = 16;
}

/// One histogram bucket (`gl_lat`, `gl_gaps`): count and sum of ns.
pub mod hist {
    pub const COUNT: i16 = 0;
    pub const SUM: i16 = 8;
    pub const SIZE: u32 = 16;
}

/// Gap kinds: `gl_gaps` is indexed `(cpu * KINDS + kind) * BUCKETS + bucket`.
pub const KIND_WOKEN: i32 = 0;
pub const KIND_OTHER: i32 = 1;
/// Ended by a managed task woken from this CPU (a timer, an interrupt handled here).
pub const KIND_LOCAL: i32 = 2;
pub const KINDS: u32 = 3;
/// [`KINDS`] as the programs' immediate.
const KINDS_IMM: i32 = 3;
const _: () = assert!(KINDS_IMM as u32 == KINDS);

/// Target states: `gl_lat` is indexed `state * BUCKETS + bucket`, states in the order of
/// `gleaner_policy::idle::TargetState::ALL`.
pub const STATE_BUSY: i32 = 0;
pub const STATE_POLL: i32 = 1;
pub const STATE_HALT: i32 = 2;
pub const STATE_IDLE: i32 = 3;
pub const STATES: u32 = 4;

/// `TASK_DEAD` in a `prev_state` (`include/linux/sched.h`).
pub const TASK_DEAD: i32 = 0x80;

/// Latencies longer than this are stale wakeups (the tracer missed the task's switch-in).
pub const STALE_NS: i32 = 1_000_000_000;

/// `BUCKETS` as an immediate.
#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)] // 40
const NBUCKETS: i32 = BUCKETS as i32;

// Stack slots (below the frame pointer R10), aligned to their size.
const KEY32: i16 = -4;
const KEY64: i16 = -16;
const CPU: i16 = -24;
const EPOCH_SLOT: i16 = -32;

/// The maps the programs reference, by fd.
#[derive(Debug, Clone, Copy)]
pub struct MapFds {
    pub cpu: i32,
    pub cfg: i32,
    pub managed: i32,
    pub wake: i32,
    pub lat: i32,
    pub gaps: i32,
}

/// `dst = bucket_of(src)`: `floor(log2 src)`, 0 for 0 and 1, at most `BUCKETS - 1`, as
/// `gleaner_policy::idle::hist::bucket_of` (eBPF has no count-leading-zeros: a binary search
/// on 32, 16, 8, 4, 2, 1 bits). `src` is kept; `tmp` is clobbered.
pub fn emit_bucket(a: &mut Asm, dst: Reg, src: Reg, tmp: Reg) {
    let steps: [Label; 6] = std::array::from_fn(|_| a.label());
    a.emit(&[insn::mov64_reg(tmp, src), insn::mov64_reg(dst, tmp), insn::alu64_imm(op::RSH, dst, 32)]);
    a.jmp_imm(op::JEQ, dst, 0, steps[0]); // below 2^32: dst = 0
    a.emit(&[insn::mov64_reg(tmp, dst), insn::mov64_imm(dst, 32)]);
    a.bind(steps[0]);
    for (i, bits) in [16, 8, 4, 2].into_iter().enumerate() {
        a.jmp_imm(op::JLT, tmp, 1 << bits, steps[i + 1]);
        a.emit(&[insn::alu64_imm(op::RSH, tmp, bits), insn::alu64_imm(op::ADD, dst, bits)]);
        a.bind(steps[i + 1]);
    }
    let clamp = a.label();
    a.jmp_imm(op::JLT, tmp, 2, steps[5]);
    a.emit(&[insn::alu64_imm(op::ADD, dst, 1)]);
    a.bind(steps[5]);
    a.jmp_imm(op::JLE, dst, NBUCKETS - 1, clamp);
    a.emit(&[insn::mov64_imm(dst, NBUCKETS - 1)]);
    a.bind(clamp);
}

/// `R2 = &stack[off]` then `call id` with `R1` = the map: the map helpers' calling shape.
fn emit_map_call(a: &mut Asm, map: i32, key_off: i16, id: i32) {
    a.emit(&insn::ld_map_fd(R1, map));
    a.emit(&[insn::mov64_reg(R2, R10), insn::alu64_imm(op::ADD, R2, i32::from(key_off)), insn::call(id)]);
}

/// Adds the u64 at `R8 + val_off` to bucket `R1` of histogram map `map` (count += 1, sum +=
/// value), atomically: `gl_lat` is shared by every CPU.
fn emit_hist_add(a: &mut Asm, map: i32, val_off: i16) {
    let skip = a.label();
    a.emit(&[insn::stx(op::W, R10, R1, KEY32)]);
    emit_map_call(a, map, KEY32, helper::MAP_LOOKUP_ELEM);
    a.jmp_imm(op::JEQ, R0, 0, skip);
    a.emit(&[
        insn::mov64_imm(R1, 1),
        insn::atomic_add64(R0, R1, hist::COUNT),
        insn::ldx(op::DW, R1, R8, val_off),
        insn::atomic_add64(R0, R1, hist::SUM),
    ]);
    a.bind(skip);
}

/// Adds the idle period at `R8 + PEND_GAP` to this CPU's gaps of `kind`.
fn emit_gap_add(a: &mut Asm, m: &MapFds, kind: i32) {
    a.emit(&[insn::ldx(op::DW, R1, R8, cpu_state::PEND_GAP)]);
    emit_bucket(a, R2, R1, R3);
    a.emit(&[
        insn::ldx(op::DW, R1, R10, CPU),
        insn::alu64_imm(op::MUL, R1, KINDS_IMM),
        insn::alu64_imm(op::ADD, R1, kind),
        insn::alu64_imm(op::MUL, R1, NBUCKETS),
        insn::alu64_reg(op::ADD, R1, R2),
    ]);
    emit_hist_add(a, m.gaps, cpu_state::PEND_GAP);
}

fn emit_return_zero(a: &mut Asm) {
    a.emit(&[insn::mov64_imm(R0, 0), insn::exit()]);
}

/// `dst = cfg.epoch`, or return (to `out`) when it is 0: paused. Clobbers R0-R5.
fn emit_epoch_or_out(a: &mut Asm, m: &MapFds, dst: Reg, out: Label) {
    a.emit(&[insn::st_imm(op::W, R10, KEY32, 0)]);
    emit_map_call(a, m.cfg, KEY32, helper::MAP_LOOKUP_ELEM);
    a.jmp_imm(op::JEQ, R0, 0, out);
    a.emit(&[insn::ldx(op::DW, dst, R0, cfg::EPOCH)]);
    a.jmp_imm(op::JEQ, dst, 0, out);
}

/// The per-CPU state at `state` belongs to `epoch`: if it was written in another, its fields
/// are zeroed (nothing seen yet in this epoch). `tmp` is clobbered.
fn emit_fresh_cpu_state(a: &mut Asm, state: Reg, epoch: Reg, tmp: Reg) {
    let fresh = a.label();
    a.emit(&[insn::ldx(op::DW, tmp, state, cpu_state::EPOCH)]);
    a.jmp_reg(op::JEQ, tmp, epoch, fresh);
    let mut off = 0;
    while off < cpu_state::EPOCH {
        a.emit(&[insn::st_imm(op::DW, state, off, 0)]);
        off += 8;
    }
    a.emit(&[insn::stx(op::DW, state, epoch, cpu_state::EPOCH)]);
    a.bind(fresh);
}

/// `sched_waking(struct task_struct *p)`: remember when `p` was woken, and from which CPU.
pub fn sched_waking(m: &MapFds) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let out = a.label();
    const _: () = assert!(wake::SIZE == 24);
    let value = KEY64 - 24; // {ts, cpu, epoch} below the key
    a.emit(&[insn::ldx(op::DW, R6, R1, 0)]);
    emit_epoch_or_out(&mut a, m, R7, out);
    a.emit(&[insn::stx(op::DW, R10, R6, KEY64), insn::stx(op::DW, R10, R7, value + wake::EPOCH), insn::call(helper::KTIME_GET_NS)]);
    a.emit(&[insn::stx(op::DW, R10, R0, value + wake::TS), insn::call(helper::GET_SMP_PROCESSOR_ID)]);
    a.emit(&[insn::stx(op::DW, R10, R0, value + wake::CPU)]);
    a.emit(&insn::ld_map_fd(R1, m.wake));
    a.emit(&[
        insn::mov64_reg(R2, R10),
        insn::alu64_imm(op::ADD, R2, i32::from(KEY64)),
        insn::mov64_reg(R3, R10),
        insn::alu64_imm(op::ADD, R3, i32::from(value)),
        insn::mov64_imm(R4, 0), // BPF_ANY
        insn::call(helper::MAP_UPDATE_ELEM),
    ]);
    a.bind(out);
    emit_return_zero(&mut a);
    a.finish()
}

/// `cpu_idle(unsigned int state, unsigned int cpu_id)`: the last cpuidle state this CPU
/// entered (the exit event, state `u32::MAX`, is ignored). The event fires on the CPU itself.
pub fn cpu_idle(m: &MapFds) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let out = a.label();
    // state + 1 in 32 bits: the exit event (u32::MAX) wraps to 0.
    a.emit(&[insn::ldx(op::DW, R6, R1, 0), insn::alu32_imm(op::ADD, R6, 1)]);
    a.jmp_imm(op::JEQ, R6, 0, out);
    emit_epoch_or_out(&mut a, m, R7, out);
    a.emit(&[insn::st_imm(op::W, R10, KEY32, 0)]);
    emit_map_call(&mut a, m.cpu, KEY32, helper::MAP_LOOKUP_ELEM);
    a.jmp_imm(op::JEQ, R0, 0, out);
    emit_fresh_cpu_state(&mut a, R0, R7, R1);
    a.emit(&[insn::stx(op::W, R0, R6, cpu_state::IDLE_STATE)]);
    a.bind(out);
    emit_return_zero(&mut a);
    a.finish()
}

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state)`: the four steps of the module documentation. `poll_state` is
/// the cpuidle index of the POLL state, if the CPUs have one.
///
/// Registers: R6 = args, R7 = now, R8 = this CPU's state, R9 = prev's pid_tgid.
pub fn sched_switch(m: &MapFds, poll_state: Option<u32>) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let out = a.label();

    a.emit(&[insn::mov64_reg(R6, R1)]);
    emit_epoch_or_out(&mut a, m, R7, out);
    a.emit(&[insn::stx(op::DW, R10, R7, EPOCH_SLOT), insn::call(helper::KTIME_GET_NS), insn::mov64_reg(R7, R0)]);
    a.emit(&[insn::call(helper::GET_SMP_PROCESSOR_ID), insn::stx(op::DW, R10, R0, CPU)]);
    a.emit(&[insn::st_imm(op::W, R10, KEY32, 0)]);
    emit_map_call(&mut a, m.cpu, KEY32, helper::MAP_LOOKUP_ELEM);
    a.jmp_imm(op::JEQ, R0, 0, out);
    a.emit(&[insn::mov64_reg(R8, R0), insn::ldx(op::DW, R2, R10, EPOCH_SLOT)]);
    emit_fresh_cpu_state(&mut a, R8, R2, R1);
    a.emit(&[insn::call(helper::GET_CURRENT_PID_TGID), insn::mov64_reg(R9, R0)]);

    emit_commit(&mut a, m);
    emit_forget_prev(&mut a, m);
    emit_idle_period(&mut a, poll_state);
    emit_next_wakeup(&mut a, m, out);

    a.bind(out);
    emit_return_zero(&mut a);
    a.finish()
}

/// Step 1: commit the sample pending since this CPU's last switch, now that its task is
/// current (prev) and its tgid known.
fn emit_commit(a: &mut Asm, m: &MapFds) {
    use cpu_state::*;
    let done = a.label();
    let managed = a.label();
    let unmanaged = a.label();
    let check_set = a.label();
    let other = a.label();
    let local = a.label();

    a.emit(&[insn::ldx(op::DW, R1, R8, PEND_TASK)]);
    a.jmp_imm(op::JEQ, R1, 0, done);
    a.emit(&[insn::st_imm(op::DW, R8, PEND_TASK, 0), insn::ldx(op::DW, R2, R6, 8)]);
    a.jmp_reg(op::JNE, R1, R2, done); // not the task we switched in: events were missed

    // Managed: cfg.track_all, or prev's tgid in the managed set.
    a.emit(&[insn::st_imm(op::W, R10, KEY32, 0)]);
    emit_map_call(a, m.cfg, KEY32, helper::MAP_LOOKUP_ELEM);
    a.jmp_imm(op::JEQ, R0, 0, check_set);
    a.emit(&[insn::ldx(op::DW, R1, R0, cfg::TRACK_ALL)]);
    a.jmp_imm(op::JNE, R1, 0, managed);
    a.bind(check_set);
    a.emit(&[insn::mov64_reg(R1, R9), insn::alu64_imm(op::RSH, R1, 32), insn::stx(op::W, R10, R1, KEY32)]);
    emit_map_call(a, m.managed, KEY32, helper::MAP_LOOKUP_ELEM);
    a.jmp_imm(op::JNE, R0, 0, managed);
    a.goto(unmanaged);

    // The latency by target state, the gap by where the wakeup came from.
    a.bind(managed);
    a.emit(&[insn::ldx(op::DW, R1, R8, PEND_LAT)]);
    emit_bucket(a, R2, R1, R3);
    a.emit(&[insn::ldx(op::W, R1, R8, PEND_STATE), insn::alu64_imm(op::MUL, R1, NBUCKETS), insn::alu64_reg(op::ADD, R1, R2)]);
    emit_hist_add(a, m.lat, PEND_LAT);
    a.emit(&[insn::ldx(op::W, R1, R8, PEND_FLAGS), insn::mov64_reg(R2, R1), insn::alu64_imm(op::AND, R2, FLAG_GAP)]);
    a.jmp_imm(op::JEQ, R2, 0, done);
    a.emit(&[insn::alu64_imm(op::AND, R1, FLAG_CROSS)]);
    a.jmp_imm(op::JEQ, R1, 0, local); // woken from this CPU: a timer or an interrupt here
    emit_gap_add(a, m, KIND_WOKEN);
    a.goto(done);

    a.bind(local);
    emit_gap_add(a, m, KIND_LOCAL);
    a.goto(done);

    a.bind(unmanaged);
    a.emit(&[insn::ldx(op::W, R1, R8, PEND_FLAGS), insn::alu64_imm(op::AND, R1, FLAG_GAP)]);
    a.jmp_imm(op::JEQ, R1, 0, done);
    a.bind(other);
    emit_gap_add(a, m, KIND_OTHER);
    a.bind(done);
}

/// Step 2: prev stays runnable (preempted, or switched out while TASK_RUNNING): a wakeup
/// recorded for it found it running and must not give a latency at its next switch-in. Nor
/// may one of a task that exits (TASK_DEAD): its `task_struct`, freed, may become another
/// task's, whose first switch-in follows no sched_waking.
///
/// A task that blocks keeps its entry: the wakeup that ends the block may come in before this
/// tracepoint (the waker sees it dequeued while its CPU is still switching away from it).
fn emit_forget_prev(a: &mut Asm, m: &MapFds) {
    let forget = a.label();
    let done = a.label();
    a.emit(&[insn::mov32_reg(R1, R9)]);
    a.jmp_imm(op::JEQ, R1, 0, done); // the idle task is never woken
    a.emit(&[insn::ldx(op::DW, R1, R6, 24)]);
    a.jmp_imm(op::JEQ, R1, 0, forget);
    a.jmp_imm(op::JSET, R1, TASK_DEAD, forget);
    a.emit(&[insn::ldx(op::DW, R1, R6, 0)]);
    a.jmp_imm(op::JEQ, R1, 0, done);
    a.bind(forget);
    a.emit(&[insn::ldx(op::DW, R1, R6, 8), insn::stx(op::DW, R10, R1, KEY64)]);
    emit_map_call(a, m.wake, KEY64, helper::MAP_DELETE_ELEM);
    a.bind(done);
}

/// Step 3: the idle period that ends now (prev is the idle task), and the state the CPU was
/// in, kept as `PEND_GAP`, `PEND_FLAGS` and `PEND_STATE`.
fn emit_idle_period(a: &mut Asm, poll_state: Option<u32>) {
    use cpu_state::*;
    let not_idle = a.label();
    let flags = a.label();
    let state_done = a.label();

    a.emit(&[insn::st_imm(op::W, R8, PEND_FLAGS, 0), insn::st_imm(op::DW, R8, PEND_GAP, 0), insn::mov32_reg(R1, R9)]);
    a.jmp_imm(op::JNE, R1, 0, not_idle);
    a.emit(&[insn::ldx(op::DW, R2, R8, LAST_SWITCH), insn::mov64_imm(R3, FLAG_PREV_IDLE)]);
    a.jmp_imm(op::JEQ, R2, 0, flags); // the idle task got the CPU before we attached
    a.jmp_reg(op::JGT, R2, R7, flags);
    a.emit(&[
        insn::mov64_reg(R1, R7),
        insn::alu64_reg(op::SUB, R1, R2),
        insn::stx(op::DW, R8, R1, PEND_GAP),
        insn::alu64_imm(op::OR, R3, FLAG_GAP),
    ]);
    a.bind(flags);
    a.emit(&[insn::stx(op::W, R8, R3, PEND_FLAGS)]);
    a.bind(not_idle);
    a.emit(&[insn::stx(op::DW, R8, R7, LAST_SWITCH)]);

    // The target's state: busy unless prev was idle; then by the last cpuidle state seen.
    a.emit(&[
        insn::ldx(op::W, R1, R8, IDLE_STATE),
        insn::st_imm(op::W, R8, IDLE_STATE, 0),
        insn::ldx(op::W, R2, R8, PEND_FLAGS),
        insn::mov64_imm(R3, STATE_BUSY),
    ]);
    a.emit(&[insn::alu64_imm(op::AND, R2, FLAG_PREV_IDLE)]);
    a.jmp_imm(op::JEQ, R2, 0, state_done);
    a.emit(&[insn::mov64_imm(R3, STATE_IDLE)]);
    a.jmp_imm(op::JEQ, R1, 0, state_done);
    a.emit(&[insn::mov64_imm(R3, STATE_HALT)]);
    if let Some(poll) = poll_state.and_then(|p| i32::try_from(p).ok()).and_then(|p| p.checked_add(1)) {
        a.jmp_imm(op::JNE, R1, poll, state_done);
        a.emit(&[insn::mov64_imm(R3, STATE_POLL)]);
    }
    a.bind(state_done);
    a.emit(&[insn::stx(op::W, R8, R3, PEND_STATE)]);
}

/// Step 4: was next woken? Then its sample waits for its tgid (step 1 of the next switch);
/// otherwise the idle period, if one ended, is `other` now.
fn emit_next_wakeup(a: &mut Asm, m: &MapFds, out: Label) {
    use cpu_state::*;
    let no_wake = a.label();
    let same_cpu = a.label();
    let stale = a.label();

    a.emit(&[insn::ldx(op::DW, R1, R6, 16), insn::stx(op::DW, R10, R1, KEY64)]);
    emit_map_call(a, m.wake, KEY64, helper::MAP_LOOKUP_ELEM);
    a.jmp_imm(op::JEQ, R0, 0, no_wake);
    a.emit(&[insn::ldx(op::DW, R1, R0, wake::EPOCH), insn::ldx(op::DW, R2, R10, EPOCH_SLOT)]);
    a.jmp_reg(op::JNE, R1, R2, stale); // recorded before a pause
    a.emit(&[
        insn::ldx(op::DW, R1, R0, wake::TS),
        insn::ldx(op::DW, R2, R0, wake::CPU),
        insn::mov64_reg(R3, R7),
        insn::alu64_reg(op::SUB, R3, R1),
        insn::stx(op::DW, R8, R3, PEND_LAT),
        insn::ldx(op::DW, R4, R10, CPU),
    ]);
    a.jmp_reg(op::JEQ, R2, R4, same_cpu);
    a.emit(&[insn::ldx(op::W, R5, R8, PEND_FLAGS), insn::alu64_imm(op::OR, R5, FLAG_CROSS), insn::stx(op::W, R8, R5, PEND_FLAGS)]);
    a.bind(same_cpu);
    emit_map_call(a, m.wake, KEY64, helper::MAP_DELETE_ELEM);
    // A time after now wraps to a huge latency: stale as well.
    a.emit(&[insn::ldx(op::DW, R3, R8, PEND_LAT)]);
    a.jmp_imm(op::JGT, R3, STALE_NS, no_wake);
    a.emit(&[insn::ldx(op::DW, R1, R6, 16), insn::stx(op::DW, R8, R1, PEND_TASK)]);
    a.goto(out);

    a.bind(stale);
    emit_map_call(a, m.wake, KEY64, helper::MAP_DELETE_ELEM);
    a.bind(no_wake);
    a.emit(&[insn::ldx(op::W, R1, R8, PEND_FLAGS), insn::alu64_imm(op::AND, R1, FLAG_GAP)]);
    a.jmp_imm(op::JEQ, R1, 0, out);
    emit_gap_add(a, m, KIND_OTHER);
}

/// A test program: returns `bucket_of(args[0])`, computed by [`emit_bucket`].
#[cfg(test)]
pub fn bucket_probe() -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    a.emit(&[insn::ldx(op::DW, R6, R1, 0)]);
    emit_bucket(&mut a, R0, R6, R7);
    a.emit(&[insn::exit()]);
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fds() -> MapFds {
        MapFds { cpu: 3, cfg: 4, managed: 5, wake: 6, lat: 7, gaps: 8 }
    }

    #[test]
    fn programs_assemble_and_reference_only_their_maps() {
        let m = fds();
        for (name, p, maps) in [
            ("sched_waking", sched_waking(&m).unwrap(), vec![4, 6]),
            ("cpu_idle", cpu_idle(&m).unwrap(), vec![3, 4]),
            ("sched_switch", sched_switch(&m, Some(0)).unwrap(), vec![3, 4, 5, 6, 7, 8]),
        ] {
            assert_eq!(p.last().map(|i| i.code), Some(op::JMP | op::EXIT), "{name} ends with exit");
            let mut used: Vec<i32> =
                p.iter().filter(|i| i.code == op::LD | op::DW | op::IMM && i.regs >> 4 == insn::PSEUDO_MAP_FD).map(|i| i.imm).collect();
            used.sort_unstable();
            used.dedup();
            assert_eq!(used, maps, "{name}");
            assert!(p.len() < 400, "{name}: {} instructions", p.len());
        }
    }

    /// Where `p` marks the target vCPU halted (`mov R3, STATE_HALT`), the step that decides
    /// between halted and polling.
    fn halt_mark(p: &[Insn]) -> usize {
        let at: Vec<usize> = p.iter().enumerate().filter(|(_, i)| **i == insn::mov64_imm(R3, STATE_HALT)).map(|(k, _)| k).collect();
        assert_eq!(at.len(), 1, "one halt mark");
        at[0]
    }

    /// A known POLL state k marks the target vCPU as polling exactly when the last cpuidle
    /// state seen (kept as k + 1; 0: none) is k: after the halt mark, one `if R1 != k + 1`
    /// that skips only `mov R3, STATE_POLL`, then the store of the state; an unknown one goes
    /// from the halt mark straight to the store.
    #[test]
    fn poll_state_is_compared_only_when_known() {
        let m = fds();
        let store = insn::stx(op::W, R8, R3, cpu_state::PEND_STATE);
        let without = sched_switch(&m, None).unwrap();
        let h = halt_mark(&without);
        assert_eq!(without[h + 1], store, "no POLL state known: halted is stored as it is");
        for k in [0u32, 3] {
            let with = sched_switch(&m, Some(k)).unwrap();
            let h = halt_mark(&with);
            let imm = i32::try_from(k).unwrap() + 1;
            assert_eq!(with[h + 1], insn::jmp_imm(op::JNE, R1, imm, 1), "state {k}: compared with {imm}, skipping only the mark");
            assert_eq!(with[h + 2], insn::mov64_imm(R3, STATE_POLL), "state {k}: polling");
            assert_eq!(with[h + 3], store, "state {k}: then stored");
            assert_eq!(with.len(), without.len() + 2, "state {k}: the comparison and the mark, nothing else");
        }
    }
}
