//! A small eBPF instruction encoder: the 8-byte `struct bpf_insn` of `include/uapi/linux/bpf.h`,
//! one `const fn` per instruction form, and [`Asm`], a builder with forward labels.
//!
//! ```text
//!  byte 0      byte 1             bytes 2-3     bytes 4-7
//!  code        dst:4 | src:4      off (i16)     imm (i32)       (little endian: dst is
//!  class|op|src/size|mode                                        the low nibble)
//!  ld_imm64 takes two slots: the second holds the upper 32 bits of the constant in imm;
//!  with src = BPF_PSEUDO_MAP_FD the first imm is a map fd the verifier turns into a pointer.
//! ```
//!
//! Jump offsets count instructions from the one after the jump (a `ld_imm64` counts two).
//! Only what gleaner's programs use is here; it is enough to write small tracing programs by
//! hand, which is how gleaner avoids clang, libbpf and libelf at build time (docs/os.md).

/// A register: `R0` (return value), `R1`-`R5` (arguments, clobbered by calls), `R6`-`R9`
/// (kept across calls), `R10` (frame pointer, read only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reg(u8);

pub const R0: Reg = Reg(0);
pub const R1: Reg = Reg(1);
pub const R2: Reg = Reg(2);
pub const R3: Reg = Reg(3);
pub const R4: Reg = Reg(4);
pub const R5: Reg = Reg(5);
pub const R6: Reg = Reg(6);
pub const R7: Reg = Reg(7);
pub const R8: Reg = Reg(8);
pub const R9: Reg = Reg(9);
pub const R10: Reg = Reg(10);

/// Opcode parts (`include/uapi/linux/bpf_common.h` and `bpf.h`). The classic-BPF ones are in
/// `libc` as `u32` (tests check they agree); an eBPF opcode is one byte, so they are `u8` here.
pub mod op {
    // Instruction classes.
    pub const LD: u8 = 0x00;
    pub const LDX: u8 = 0x01;
    pub const ST: u8 = 0x02;
    pub const STX: u8 = 0x03;
    pub const ALU: u8 = 0x04;
    pub const JMP: u8 = 0x05;
    pub const ALU64: u8 = 0x07;
    // Sizes (loads and stores).
    pub const W: u8 = 0x00;
    pub const H: u8 = 0x08;
    pub const B: u8 = 0x10;
    pub const DW: u8 = 0x18;
    // Modes.
    pub const IMM: u8 = 0x00;
    pub const MEM: u8 = 0x60;
    /// Atomic read-modify-write; the operation is in `imm` (`ADD` = 0: the old `BPF_XADD`).
    pub const ATOMIC: u8 = 0xc0;
    // Operand source.
    pub const K: u8 = 0x00;
    pub const X: u8 = 0x08;
    // ALU operations.
    pub const ADD: u8 = 0x00;
    pub const SUB: u8 = 0x10;
    pub const MUL: u8 = 0x20;
    pub const OR: u8 = 0x40;
    pub const AND: u8 = 0x50;
    pub const LSH: u8 = 0x60;
    pub const RSH: u8 = 0x70;
    pub const MOV: u8 = 0xb0;
    // Jump operations (unsigned compares unless named S).
    pub const JA: u8 = 0x00;
    pub const JEQ: u8 = 0x10;
    pub const JGT: u8 = 0x20;
    pub const JGE: u8 = 0x30;
    pub const JSET: u8 = 0x40;
    pub const JNE: u8 = 0x50;
    pub const CALL: u8 = 0x80;
    pub const EXIT: u8 = 0x90;
    pub const JLT: u8 = 0xa0;
    pub const JLE: u8 = 0xb0;
}

/// `src_reg` of a `ld_imm64` whose constant is a map fd (`BPF_PSEUDO_MAP_FD`).
pub const PSEUDO_MAP_FD: u8 = 1;

/// Helper function ids (`enum bpf_func_id`, `__BPF_FUNC_MAPPER`).
pub mod helper {
    pub const MAP_LOOKUP_ELEM: i32 = 1;
    pub const MAP_UPDATE_ELEM: i32 = 2;
    pub const MAP_DELETE_ELEM: i32 = 3;
    pub const KTIME_GET_NS: i32 = 5;
    pub const GET_SMP_PROCESSOR_ID: i32 = 8;
    pub const GET_CURRENT_PID_TGID: i32 = 14;
}

/// One instruction, laid out as the kernel's `struct bpf_insn` (8 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    /// `dst_reg:4, src_reg:4` as the C bitfield lays them out on this target.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

const fn regs(dst: Reg, src: Reg) -> u8 {
    if cfg!(target_endian = "little") {
        (dst.0 & 0xf) | (src.0 << 4)
    } else {
        (dst.0 << 4) | (src.0 & 0xf)
    }
}

const fn insn(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> Insn {
    Insn { code, regs: regs(dst, src), off, imm }
}

impl Insn {
    /// The 8 bytes the kernel reads, in this machine's byte order.
    #[must_use]
    pub fn to_bytes(self) -> [u8; 8] {
        let off = self.off.to_ne_bytes();
        let imm = self.imm.to_ne_bytes();
        [self.code, self.regs, off[0], off[1], imm[0], imm[1], imm[2], imm[3]]
    }
}

/// `dst = imm` (64-bit, `imm` sign-extended).
pub const fn mov64_imm(dst: Reg, imm: i32) -> Insn {
    insn(op::ALU64 | op::MOV | op::K, dst, R0, 0, imm)
}

/// `dst = src` (64-bit).
pub const fn mov64_reg(dst: Reg, src: Reg) -> Insn {
    insn(op::ALU64 | op::MOV | op::X, dst, src, 0, 0)
}

/// `dst = (u32)src`: the upper half of `dst` is zeroed.
pub const fn mov32_reg(dst: Reg, src: Reg) -> Insn {
    insn(op::ALU | op::MOV | op::X, dst, src, 0, 0)
}

/// `dst op= imm` (64-bit: `ADD`, `SUB`, `MUL`, `OR`, `AND`, `LSH`, `RSH`, ...).
pub const fn alu64_imm(alu: u8, dst: Reg, imm: i32) -> Insn {
    insn(op::ALU64 | alu | op::K, dst, R0, 0, imm)
}

/// `dst op= src` (64-bit).
pub const fn alu64_reg(alu: u8, dst: Reg, src: Reg) -> Insn {
    insn(op::ALU64 | alu | op::X, dst, src, 0, 0)
}

/// `dst = (u32)(dst op imm)`: 32-bit, the upper half of `dst` is zeroed.
pub const fn alu32_imm(alu: u8, dst: Reg, imm: i32) -> Insn {
    insn(op::ALU | alu | op::K, dst, R0, 0, imm)
}

/// `dst = *(size *)(src + off)` (`size`: `op::B`, `H`, `W`, `DW`; zero-extended).
pub const fn ldx(size: u8, dst: Reg, src: Reg, off: i16) -> Insn {
    insn(op::LDX | size | op::MEM, dst, src, off, 0)
}

/// `*(size *)(dst + off) = src`.
pub const fn stx(size: u8, dst: Reg, src: Reg, off: i16) -> Insn {
    insn(op::STX | size | op::MEM, dst, src, off, 0)
}

/// `*(size *)(dst + off) = imm`.
pub const fn st_imm(size: u8, dst: Reg, off: i16, imm: i32) -> Insn {
    insn(op::ST | size | op::MEM, dst, R0, off, imm)
}

/// `lock *(u64 *)(dst + off) += src` (atomic add, the former `BPF_XADD`).
pub const fn atomic_add64(dst: Reg, src: Reg, off: i16) -> Insn {
    insn(op::STX | op::DW | op::ATOMIC, dst, src, off, op::ADD as i32)
}

/// `if dst jmp imm goto +off` (64-bit compare, `imm` sign-extended).
pub const fn jmp_imm(jmp: u8, dst: Reg, imm: i32, off: i16) -> Insn {
    insn(op::JMP | jmp | op::K, dst, R0, off, imm)
}

/// `if dst jmp src goto +off` (64-bit compare).
pub const fn jmp_reg(jmp: u8, dst: Reg, src: Reg, off: i16) -> Insn {
    insn(op::JMP | jmp | op::X, dst, src, off, 0)
}

/// `goto +off`.
pub const fn ja(off: i16) -> Insn {
    insn(op::JMP | op::JA, R0, R0, off, 0)
}

/// Calls kernel helper `id` (arguments in `R1`-`R5`, result in `R0`; `R1`-`R5` are clobbered).
pub const fn call(id: i32) -> Insn {
    insn(op::JMP | op::CALL, R0, R0, 0, id)
}

/// Returns `R0`.
pub const fn exit() -> Insn {
    insn(op::JMP | op::EXIT, R0, R0, 0, 0)
}

/// `dst = imm` for a full 64-bit constant (two slots).
#[allow(clippy::cast_possible_truncation)] // the two halves are taken on purpose
pub const fn ld_imm64(dst: Reg, imm: u64) -> [Insn; 2] {
    [insn(op::LD | op::DW | op::IMM, dst, R0, 0, (imm as u32).cast_signed()), insn(0, R0, R0, 0, ((imm >> 32) as u32).cast_signed())]
}

/// `dst = &map` for the map whose fd is `fd` (two slots; the verifier replaces the fd).
pub const fn ld_map_fd(dst: Reg, fd: i32) -> [Insn; 2] {
    [insn(op::LD | op::DW | op::IMM, dst, Reg(PSEUDO_MAP_FD), 0, fd), insn(0, R0, R0, 0, 0)]
}

/// A jump target, bound once with [`Asm::bind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label(usize);

/// Why a program could not be assembled (a bug in the program's generator).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AsmError {
    #[error("label {0} used but never bound")]
    Unbound(usize),
    #[error("label {0} bound twice")]
    Rebound(usize),
    #[error("jump at {at} to {to} does not fit a 16-bit offset")]
    TooFar { at: usize, to: usize },
}

/// A program under construction: instructions plus forward jumps resolved by [`Asm::finish`].
#[derive(Debug, Default)]
pub struct Asm {
    insns: Vec<Insn>,
    labels: Vec<Option<usize>>,
    /// (index of a jump instruction, its target).
    fixups: Vec<(usize, Label)>,
    error: Option<AsmError>,
}

impl Asm {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A new, unbound label.
    pub fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    /// Binds `l` to the next instruction.
    pub fn bind(&mut self, l: Label) {
        if self.labels[l.0].replace(self.insns.len()).is_some() {
            self.error.get_or_insert(AsmError::Rebound(l.0));
        }
    }

    /// Appends instructions.
    pub fn emit(&mut self, insns: &[Insn]) -> &mut Self {
        self.insns.extend_from_slice(insns);
        self
    }

    /// `if dst jmp imm goto l`.
    pub fn jmp_imm(&mut self, jmp: u8, dst: Reg, imm: i32, l: Label) -> &mut Self {
        self.fixups.push((self.insns.len(), l));
        self.emit(&[jmp_imm(jmp, dst, imm, 0)])
    }

    /// `if dst jmp src goto l`.
    pub fn jmp_reg(&mut self, jmp: u8, dst: Reg, src: Reg, l: Label) -> &mut Self {
        self.fixups.push((self.insns.len(), l));
        self.emit(&[jmp_reg(jmp, dst, src, 0)])
    }

    /// `goto l`.
    pub fn goto(&mut self, l: Label) -> &mut Self {
        self.fixups.push((self.insns.len(), l));
        self.emit(&[ja(0)])
    }

    /// Number of instruction slots so far.
    #[must_use]
    pub fn len(&self) -> usize {
        self.insns.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.insns.is_empty()
    }

    /// The program, every jump resolved.
    pub fn finish(mut self) -> Result<Vec<Insn>, AsmError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        for &(at, l) in &self.fixups {
            let to = self.labels[l.0].ok_or(AsmError::Unbound(l.0))?;
            let off = i64::try_from(to).unwrap_or(i64::MAX) - i64::try_from(at).unwrap_or(i64::MAX) - 1;
            self.insns[at].off = i16::try_from(off).map_err(|_| AsmError::TooFar { at, to })?;
        }
        Ok(self.insns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(i: Insn) -> [u8; 8] {
        i.to_bytes()
    }

    // Encodings as llvm-objdump prints them for clang-built BPF objects.
    #[test]
    fn known_encodings() {
        assert_eq!(bytes(exit()), [0x95, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bytes(mov64_imm(R0, 0)), [0xb7, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bytes(mov64_reg(R2, R10)), [0xbf, 0xa2, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bytes(alu64_imm(op::ADD, R2, -8)), [0x07, 0x02, 0, 0, 0xf8, 0xff, 0xff, 0xff]);
        assert_eq!(bytes(call(helper::MAP_LOOKUP_ELEM)), [0x85, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(bytes(jmp_imm(op::JEQ, R0, 0, 2)), [0x15, 0, 2, 0, 0, 0, 0, 0]);
        assert_eq!(bytes(ldx(op::DW, R6, R1, 8)), [0x79, 0x16, 8, 0, 0, 0, 0, 0]);
        assert_eq!(bytes(stx(op::DW, R10, R6, -8)), [0x7b, 0x6a, 0xf8, 0xff, 0, 0, 0, 0]);
        assert_eq!(bytes(st_imm(op::W, R10, -4, 0)), [0x62, 0x0a, 0xfc, 0xff, 0, 0, 0, 0]);
        assert_eq!(bytes(atomic_add64(R0, R1, 8)), [0xdb, 0x10, 8, 0, 0, 0, 0, 0]);
        assert_eq!(bytes(mov32_reg(R1, R9)), [0xbc, 0x91, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bytes(alu32_imm(op::ADD, R6, 1)), [0x04, 0x06, 0, 0, 1, 0, 0, 0]);
        let [a, b] = ld_map_fd(R1, 3);
        assert_eq!((bytes(a), bytes(b)), ([0x18, 0x11, 0, 0, 3, 0, 0, 0], [0; 8]));
        let [a, b] = ld_imm64(R3, 0x1122_3344_5566_7788);
        assert_eq!((bytes(a), bytes(b)), ([0x18, 0x03, 0, 0, 0x88, 0x77, 0x66, 0x55], [0, 0, 0, 0, 0x44, 0x33, 0x22, 0x11]));
        assert_eq!(std::mem::size_of::<Insn>(), 8);
    }

    #[test]
    fn opcodes_agree_with_libc_classic_bpf() {
        for (ours, theirs) in [
            (op::LD, libc::BPF_LD),
            (op::LDX, libc::BPF_LDX),
            (op::ST, libc::BPF_ST),
            (op::STX, libc::BPF_STX),
            (op::ALU, libc::BPF_ALU),
            (op::JMP, libc::BPF_JMP),
            (op::W, libc::BPF_W),
            (op::H, libc::BPF_H),
            (op::B, libc::BPF_B),
            (op::MEM, libc::BPF_MEM),
            (op::ADD, libc::BPF_ADD),
            (op::SUB, libc::BPF_SUB),
            (op::MUL, libc::BPF_MUL),
            (op::OR, libc::BPF_OR),
            (op::AND, libc::BPF_AND),
            (op::LSH, libc::BPF_LSH),
            (op::RSH, libc::BPF_RSH),
            (op::JA, libc::BPF_JA),
            (op::JEQ, libc::BPF_JEQ),
            (op::JGT, libc::BPF_JGT),
            (op::JGE, libc::BPF_JGE),
            (op::JSET, libc::BPF_JSET),
            (op::K, libc::BPF_K),
            (op::X, libc::BPF_X),
        ] {
            assert_eq!(u32::from(ours), theirs);
        }
    }

    #[test]
    fn labels_resolve_forward_and_backward() {
        let mut a = Asm::new();
        let fwd = a.label();
        let back = a.label();
        a.bind(back);
        a.jmp_imm(op::JEQ, R1, 0, fwd); // 0 -> 4: off 3
        a.emit(&ld_imm64(R2, 1)); // 1, 2
        a.goto(back); // 3 -> 0: off -4
        a.bind(fwd);
        a.emit(&[exit()]);
        let p = a.finish().unwrap();
        assert_eq!((p[0].off, p[3].off, p.len()), (3, -4, 5));

        let mut a = Asm::new();
        let l = a.label();
        a.goto(l);
        assert_eq!(a.finish(), Err(AsmError::Unbound(0)));

        let mut a = Asm::new();
        let l = a.label();
        a.bind(l);
        a.bind(l);
        assert_eq!(a.finish(), Err(AsmError::Rebound(0)));
    }
}
