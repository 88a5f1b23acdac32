//! A generator of random freestanding x86_64 programs for the differential test
//! (tests/tests/differential.rs): from a seed, a GNU `as` (AT&T) source that `gcc -nostdlib
//! -static -no-pie` builds into a static program that runs the same way everywhere: natively,
//! under every itrace recorder, under qemu-user.
//!
//! # What a program does
//!
//! `_start` moves the stack to `stack_area` in `.data` (a fixed address: the program's
//! memory and registers do not depend on ASLR), loads all 16 GPRs and 16 xmm registers with
//! random values, runs a generated body that calls the generated functions, and then writes its
//! whole state with one raw `write(1, ...)`: the 16 GPRs, rflags masked to the arithmetic flags
//! the program has defined at that point (CF PF ZF SF OF, never AF or TF), the 16 xmm registers,
//! the 512-byte `data_area` and the 4 KiB stack area (also below `%rsp`: a recorder that wrote
//! to the program's stack would show). It exits with `exit_group(status)`, the status a fold of
//! the saved registers.
//!
//! # The instruction mix
//!
//! - ALU `add sub adc sbb and or xor cmp test` on 8/16/32/64-bit registers, immediates, and
//!   memory (RIP-relative `data_area+N(%rip)`, stack `N(%rsp)` in the function's frame, and
//!   `data_area(,%reg,scale)` after masking the index); `inc dec neg not`; `lock` forms.
//! - `mov` (all sizes, `movabs`), `movzx`/`movsx`, `lea` (base, index, scale, displacement),
//!   `xchg`, `xadd`, `cmpxchg`, `bswap`, `cwtl cltq cltd cqto`.
//! - `imul` (one, two and three operands), `mul`, `div`/`idiv` (64, 32 and 8 bits) with a
//!   divisor made non-zero (and positive for `idiv`, so no quotient overflows).
//! - Shifts and rotates `shl shr sar rol ror rcl rcr` by an immediate or `%cl`, `shld shrd`,
//!   `bt bts btr btc` (register and memory), `setcc` to registers and memory, `cmovcc`.
//! - `push`/`pop` of registers, immediates and memory; `call` to the next instruction + `pop`.
//! - String instructions with and without `rep`: `movs stos lods` (all sizes), `repe cmpsb`,
//!   `repne scasb`, forwards and (with `std`/`cld`) backwards, over small bounded counts.
//! - SSE2 on xmm0-15: integer `padd psub pmul pand por pxor pcmp punpck pack pshuf` and shifts,
//!   `pmovmskb pextrw pinsrw movq movd`, scalar and packed double `add sub mul div min max sqrt`,
//!   `cvtsi2sd cvttsd2si ucomisd`, `movdqa`/`movdqu` to and from memory.
//! - Control flow: `jcc` on all 16 conditions (if/else, and chains of two `jcc`s on the same
//!   flags, so flags cross a not-taken branch), bounded loops (`dec`/`jnz`, `loop`, `jrcxz`,
//!   an up-counter with `cmp`/`jb`, a counter in the stack frame), jump tables (`jmp *table(,%r,8)`
//!   and `jmp *(%r,%i,8)`), `jmp *%reg`, direct calls, calls through a register, through a table
//!   in memory and through a stack slot, nested calls (function i calls only functions j > i, so
//!   every program terminates), `jmp`, `jcc` and `call` to the next instruction, `loop` to
//!   itself, tail jumps, `enter`/`leave` frames, `ret $16` with two pushed
//!   arguments, and system calls in the middle (`getpid`, `write` of part of `data_area`).
//!
//! # Determinism
//!
//! Flags the architecture leaves undefined (after `mul`, `div`, multi-bit shifts, `bt`, AF
//! after logic) are tracked: no conditional jump, `setcc`, `cmovcc`, `adc`, `sbb`, `rcl`, `rcr`
//! and no saved flag reads a flag unless an instruction since the last merge point defined it
//! (a `cmp` is put in front where needed). So even qemu's emulated flags agree. `getpid`'s value
//! is overwritten; `%r11` after `syscall` is masked to the defined flags (single-stepping
//! leaves TF there).
//!
//! With [`GenOptions::qemu_compatible`], what qemu-user 7.2 does differently from the CPU stays
//! out: `%rcx` and `%r11` are overwritten after each `syscall` (qemu leaves both unchanged),
//! `shld`/`shrd` work on registers only (qemu stores a wrong value for `shld $3, %eax, m32`),
//! and floating-point arithmetic gets integer operands, never a NaN (when both operands are
//! NaNs, qemu returns the other one than the CPU).

use std::fmt::Write as _;

/// SplitMix64: a small, fixed PRNG, so that a seed names one program on every build.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// Bytes of the read-write `data_area` the generated code loads from and stores to.
pub const DATA_SIZE: u64 = 512;
/// Bytes of the stack area (`_start` points `%rsp` at its end).
pub const STACK_SIZE: u64 = 4096;
/// Bytes of the saved registers: 16 GPRs, rflags, 16 xmm registers.
pub const STATE_SIZE: u64 = 16 * 8 + 8 + 16 * 16;
/// Bytes the program writes at its end: state, 8 bytes of padding, data_area, stack area.
pub const DUMP_SIZE: u64 = STATE_SIZE + 8 + DATA_SIZE + STACK_SIZE;

/// How the program must be built for a backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct GenOptions {
    /// Leave out what qemu-user 7.2 does differently from the CPU (see the module comment).
    pub qemu_compatible: bool,
}

/// One generated program.
#[derive(Clone, Debug)]
pub struct GeneratedProgram {
    pub seed: u64,
    /// The assembly source (AT&T syntax, no preprocessor).
    pub source: String,
    /// The generator's upper estimate of the instructions one run executes.
    pub estimated_instructions: u64,
}

/// The program of `seed`.
pub fn generate(seed: u64, options: GenOptions) -> GeneratedProgram {
    let mut g = Gen::new(seed, options);
    let source = g.program();
    GeneratedProgram { seed, source, estimated_instructions: g.main_cost }
}

const R64: [&str; 16] =
    ["rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"];
const R32: [&str; 16] = [
    "eax", "ecx", "edx", "ebx", "esp", "ebp", "esi", "edi", "r8d", "r9d", "r10d", "r11d", "r12d", "r13d", "r14d",
    "r15d",
];
const R16: [&str; 16] =
    ["ax", "cx", "dx", "bx", "sp", "bp", "si", "di", "r8w", "r9w", "r10w", "r11w", "r12w", "r13w", "r14w", "r15w"];
const R8: [&str; 16] =
    ["al", "cl", "dl", "bl", "spl", "bpl", "sil", "dil", "r8b", "r9b", "r10b", "r11b", "r12b", "r13b", "r14b", "r15b"];
const RAX: usize = 0;
const RCX: usize = 1;
const RDX: usize = 2;
const RSP: usize = 4;
const RBP: usize = 5;
const RSI: usize = 6;
const RDI: usize = 7;
const R11: usize = 11;

const CF: u16 = 0x1;
const PF: u16 = 0x4;
const ZF: u16 = 0x40;
const SF: u16 = 0x80;
const OF: u16 = 0x800;
/// The arithmetic flags the programs track and save (AF is left out: logic instructions leave
/// it undefined, and only `pushf`/`lahf` could read it).
const ALL_FLAGS: u16 = CF | PF | ZF | SF | OF;

/// The 16 conditions and the flags each reads.
const CONDITIONS: [(&str, u16); 16] = [
    ("o", OF),
    ("no", OF),
    ("b", CF),
    ("ae", CF),
    ("e", ZF),
    ("ne", ZF),
    ("be", CF | ZF),
    ("a", CF | ZF),
    ("s", SF),
    ("ns", SF),
    ("p", PF),
    ("np", PF),
    ("l", SF | OF),
    ("ge", SF | OF),
    ("le", ZF | SF | OF),
    ("g", ZF | SF | OF),
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Size {
    B,
    W,
    L,
    Q,
}

impl Size {
    fn bits(self) -> u64 {
        match self {
            Size::B => 8,
            Size::W => 16,
            Size::L => 32,
            Size::Q => 64,
        }
    }
    fn bytes(self) -> u64 {
        self.bits() / 8
    }
    fn suffix(self) -> char {
        match self {
            Size::B => 'b',
            Size::W => 'w',
            Size::L => 'l',
            Size::Q => 'q',
        }
    }
    fn reg(self, r: usize) -> String {
        let name = match self {
            Size::B => R8[r],
            Size::W => R16[r],
            Size::L => R32[r],
            Size::Q => R64[r],
        };
        format!("%{name}")
    }
}

/// A generated function: what its callers must know.
#[derive(Clone, Debug)]
struct Func {
    name: String,
    /// Bytes `ret` pops beyond the return address (`ret $16`): callers push that much first.
    ret_pop: u64,
    /// Upper estimate of the instructions one call executes.
    cost: u64,
}

/// Where the generator is inside a function body.
#[derive(Clone, Debug)]
struct Ctx {
    /// Registers the code being generated must not write (bit i = register i). `%rsp` always.
    protected: u16,
    /// Qwords pushed in the current straight-line run (stack operands shift by 8 each).
    depth: u64,
    /// Bytes of the frame that random memory operands use, from `%rsp` up.
    frame: u64,
    /// Loop counters in the frame above `frame`: the next free slot.
    counter_slot: u64,
    /// Arguments above the return address (a `ret $16` function), read-only.
    args: u64,
    /// Where the first argument is, from `%rsp` with nothing pushed.
    arg_base: u64,
    /// Functions with an index at or above this may be called.
    first_callee: usize,
    /// Flags defined here (see the module comment).
    flags: u16,
    /// Nesting of control constructs.
    nesting: u32,
    /// Instructions this body may still add to one run (an estimate).
    budget: u64,
}

struct Gen {
    rng: SplitMix64,
    options: GenOptions,
    out: String,
    labels: u32,
    funcs: Vec<Func>,
    /// Jump tables in .rodata: (label, entries).
    tables: Vec<(String, Vec<String>)>,
    /// The instructions emitted so far, weighted by how often they run (see `cost`).
    cost: u64,
    main_cost: u64,
}

const COUNTER_SLOTS: u64 = 4;
/// Instructions `_start`'s body may add to a run, its calls included (an estimate).
const MAIN_BUDGET: u64 = 2500;

impl Gen {
    fn new(seed: u64, options: GenOptions) -> Self {
        Gen {
            rng: SplitMix64::new(seed),
            options,
            out: String::new(),
            labels: 0,
            funcs: Vec::new(),
            tables: Vec::new(),
            cost: 0,
            main_cost: 0,
        }
    }

    fn label(&mut self) -> String {
        self.labels += 1;
        format!(".L{}", self.labels)
    }

    fn emit(&mut self, line: &str) {
        self.out.push_str("    ");
        self.out.push_str(line);
        self.out.push('\n');
        self.cost += 1;
    }

    fn place(&mut self, label: &str) {
        let _ = writeln!(self.out, "{label}:");
    }

    /// A register the code may write (never `%rsp`, never a protected one).
    fn dst(&mut self, ctx: &Ctx) -> usize {
        loop {
            let r = self.rng.below(16) as usize;
            if r != RSP && ctx.protected & (1 << r) == 0 {
                return r;
            }
        }
    }

    /// A register to read: any, `%rsp` too (its value is fixed: the stack is at a fixed address).
    fn src(&mut self) -> usize {
        if self.rng.chance(3) {
            RSP
        } else {
            loop {
                let r = self.rng.below(16) as usize;
                if r != RSP {
                    return r;
                }
            }
        }
    }

    fn free(ctx: &Ctx, regs: &[usize]) -> bool {
        regs.iter().all(|r| ctx.protected & (1 << r) == 0)
    }

    fn size(&mut self) -> Size {
        *self.rng.pick(&[Size::B, Size::W, Size::L, Size::Q, Size::L, Size::Q])
    }

    fn imm(&mut self, size: Size) -> i64 {
        let v = self.rng.next_u64();
        match size {
            Size::B => v as i8 as i64,
            Size::W => v as i16 as i64,
            _ => {
                if self.rng.chance(50) {
                    v as i8 as i64
                } else {
                    v as i32 as i64
                }
            }
        }
    }

    /// A data_area operand of `bytes`, aligned to `align`.
    fn data_mem(&mut self, bytes: u64, align: u64) -> String {
        let slots = (DATA_SIZE - bytes) / align + 1;
        let off = self.rng.below(slots) * align;
        format!("data_area+{off}(%rip)")
    }

    /// A memory operand of `bytes`: in data_area or in the frame.
    fn mem(&mut self, ctx: &Ctx, bytes: u64) -> String {
        if ctx.frame >= bytes && self.rng.chance(45) {
            let slots = ctx.frame - bytes + 1;
            let off = self.rng.below(slots) + ctx.depth * 8;
            format!("{off}(%rsp)")
        } else {
            let align = if self.rng.chance(80) { bytes } else { 1 };
            self.data_mem(bytes, align)
        }
    }

    /// Makes sure `need` flags are defined: puts a compare in front when they are not.
    fn ensure_flags(&mut self, ctx: &mut Ctx, need: u16) {
        if ctx.flags & need == need {
            return;
        }
        let size = self.size();
        let a = self.src();
        match self.rng.below(4) {
            0 => {
                let b = self.src();
                self.emit(&format!("cmp {}, {}", size.reg(b), size.reg(a)));
            }
            1 => {
                let b = self.src();
                self.emit(&format!("test {}, {}", size.reg(b), size.reg(a)));
            }
            2 => {
                let i = self.imm(size);
                self.emit(&format!("cmp ${i}, {}", size.reg(a)));
            }
            _ => {
                let m = self.mem(ctx, size.bytes());
                self.emit(&format!("cmp{} {}, {m}", size.suffix(), size.reg(a)));
            }
        }
        ctx.flags = ALL_FLAGS;
    }

    /// A condition whose flags are defined, or any condition after a compare.
    fn condition(&mut self, ctx: &mut Ctx) -> &'static str {
        let (cc, need) = *self.rng.pick(&CONDITIONS);
        self.ensure_flags(ctx, need);
        cc
    }

    /// One straight-line operation (a few instructions at most).
    fn op(&mut self, ctx: &mut Ctx) {
        match self.rng.below(30) {
            0..=4 => self.alu(ctx),
            5 => self.unary(ctx),
            6 | 7 => self.mov(ctx),
            8 => self.lea(ctx),
            9 => self.multiply(ctx),
            10 => self.divide(ctx),
            11 | 12 => self.shift(ctx),
            13 => self.bit_test(ctx),
            14 => self.flags_to_register(ctx),
            15 => self.exchange(ctx),
            16 => self.push_pop(ctx),
            17 => self.string_op(ctx),
            18..=21 => self.sse(ctx),
            22 => self.indexed(ctx),
            23 => self.misc(ctx),
            24 => self.carry_chain(ctx),
            25 if ctx.args > 0 => {
                let d = self.dst(ctx);
                let off = ctx.arg_base + ctx.depth * 8 + 8 * self.rng.below(ctx.args);
                self.emit(&format!("mov {off}(%rsp), {}", Size::Q.reg(d)));
            }
            _ => self.alu(ctx),
        }
    }

    fn alu(&mut self, ctx: &mut Ctx) {
        let ops = ["add", "sub", "and", "or", "xor", "cmp", "test", "adc", "sbb"];
        let op = *self.rng.pick(&ops);
        if matches!(op, "adc" | "sbb") {
            if ctx.flags & CF == 0 {
                let carry = *self.rng.pick(&["clc", "stc"]);
                self.emit(carry);
                ctx.flags |= CF;
            } else if self.rng.chance(20) {
                self.emit("cmc");
            }
        }
        let size = self.size();
        let lock = if matches!(op, "cmp" | "test") { "" } else { "lock " };
        match self.rng.below(5) {
            0 | 1 => {
                let (s, d) = (self.src(), self.dst(ctx));
                self.emit(&format!("{op} {}, {}", size.reg(s), size.reg(d)));
            }
            2 => {
                let d = self.dst(ctx);
                let i = self.imm(size);
                let i = if op == "test" && size == Size::Q { i & 0x7fff_ffff } else { i };
                self.emit(&format!("{op} ${i}, {}", size.reg(d)));
            }
            3 if op != "test" => {
                let d = self.dst(ctx);
                let m = self.mem(ctx, size.bytes());
                self.emit(&format!("{op} {m}, {}", size.reg(d)));
            }
            _ => {
                let m = self.mem(ctx, size.bytes());
                let lock = if self.rng.chance(20) { lock } else { "" };
                if self.rng.chance(50) {
                    let s = self.src();
                    self.emit(&format!("{lock}{op}{} {}, {m}", size.suffix(), size.reg(s)));
                } else {
                    let i = self.imm(size);
                    self.emit(&format!("{lock}{op}{} ${i}, {m}", size.suffix()));
                }
            }
        }
        ctx.flags = ALL_FLAGS;
    }

    fn unary(&mut self, ctx: &mut Ctx) {
        let op = *self.rng.pick(&["inc", "dec", "neg", "not"]);
        let size = self.size();
        let operand = if self.rng.chance(60) {
            let d = self.dst(ctx);
            format!("{op} {}", size.reg(d))
        } else {
            let m = self.mem(ctx, size.bytes());
            format!("{op}{} {m}", size.suffix())
        };
        self.emit(&operand);
        match op {
            "inc" | "dec" => ctx.flags |= ALL_FLAGS & !CF,
            "neg" => ctx.flags = ALL_FLAGS,
            _ => {}
        }
    }

    fn mov(&mut self, ctx: &mut Ctx) {
        let size = self.size();
        match self.rng.below(7) {
            0 => {
                let (s, d) = (self.src(), self.dst(ctx));
                self.emit(&format!("mov {}, {}", size.reg(s), size.reg(d)));
            }
            1 => {
                let d = self.dst(ctx);
                if size == Size::Q && self.rng.chance(50) {
                    let v = self.rng.next_u64();
                    self.emit(&format!("movabs ${v:#x}, {}", size.reg(d)));
                } else {
                    let i = self.imm(size);
                    self.emit(&format!("mov ${i}, {}", size.reg(d)));
                }
            }
            2 => {
                let d = self.dst(ctx);
                let m = self.mem(ctx, size.bytes());
                self.emit(&format!("mov {m}, {}", size.reg(d)));
            }
            3 => {
                let s = self.src();
                let m = self.mem(ctx, size.bytes());
                self.emit(&format!("mov {}, {m}", size.reg(s)));
            }
            4 => {
                let i = self.imm(size);
                let m = self.mem(ctx, size.bytes());
                self.emit(&format!("mov{} ${i}, {m}", size.suffix()));
            }
            _ => {
                let forms = [
                    ("movzbl", Size::B, Size::L),
                    ("movzwl", Size::W, Size::L),
                    ("movzbq", Size::B, Size::Q),
                    ("movsbl", Size::B, Size::L),
                    ("movswq", Size::W, Size::Q),
                    ("movslq", Size::L, Size::Q),
                    ("movsbw", Size::B, Size::W),
                ];
                let (op, from, to) = *self.rng.pick(&forms);
                let d = self.dst(ctx);
                if self.rng.chance(50) {
                    let s = self.src();
                    self.emit(&format!("{op} {}, {}", from.reg(s), to.reg(d)));
                } else {
                    let m = self.mem(ctx, from.bytes());
                    self.emit(&format!("{op} {m}, {}", to.reg(d)));
                }
            }
        }
    }

    fn lea(&mut self, ctx: &mut Ctx) {
        let size = if self.rng.chance(70) { Size::Q } else { Size::L };
        let d = self.dst(ctx);
        let (b, i) = (self.src(), self.src());
        let i = if i == RSP { RBP } else { i };
        let scale = *self.rng.pick(&[1, 2, 4, 8]);
        let disp = self.rng.next_u64() as i16;
        let addr = match self.rng.below(3) {
            0 => format!("{disp}(%{})", R64[b]),
            1 => format!("{disp}(%{},%{},{scale})", R64[b], R64[i]),
            _ => format!("{disp}(,%{},{scale})", R64[i]),
        };
        self.emit(&format!("lea {addr}, {}", size.reg(d)));
    }

    fn multiply(&mut self, ctx: &mut Ctx) {
        let size = *self.rng.pick(&[Size::W, Size::L, Size::Q]);
        match self.rng.below(4) {
            0 => {
                let (s, d) = (self.src(), self.dst(ctx));
                self.emit(&format!("imul {}, {}", size.reg(s), size.reg(d)));
            }
            1 => {
                let (s, d) = (self.src(), self.dst(ctx));
                let i = self.imm(size);
                self.emit(&format!("imul ${i}, {}, {}", size.reg(s), size.reg(d)));
            }
            2 => {
                let d = self.dst(ctx);
                let m = self.mem(ctx, size.bytes());
                self.emit(&format!("imul {m}, {}", size.reg(d)));
            }
            _ => {
                if !Self::free(ctx, &[RAX, RDX]) {
                    return;
                }
                let op = *self.rng.pick(&["mul", "imul"]);
                let size = self.size();
                let s = self.src();
                self.emit(&format!("{op} {}", size.reg(s)));
            }
        }
        ctx.flags = (ctx.flags & !(SF | ZF | PF)) | CF | OF;
    }

    fn divide(&mut self, ctx: &mut Ctx) {
        if !Self::free(ctx, &[RAX, RDX]) {
            return;
        }
        let t = self.dst(ctx);
        if t == RAX || t == RDX {
            return;
        }
        let s = self.src();
        let signed = self.rng.chance(50);
        let op = if signed { "idiv" } else { "div" };
        match self.rng.below(3) {
            0 => {
                self.emit(&format!("mov %{}, %{}", R64[s], R64[t]));
                if signed {
                    self.emit(&format!("and $0xfffff, %{}", R32[t]));
                }
                self.emit(&format!("or $1, %{}", R64[t]));
                self.emit(if signed { "cqto" } else { "xor %edx, %edx" });
                self.emit(&format!("{op} %{}", R64[t]));
            }
            1 => {
                self.emit(&format!("mov %{}, %{}", R32[s], R32[t]));
                if signed {
                    self.emit(&format!("and $0xfff, %{}", R32[t]));
                }
                self.emit(&format!("or $1, %{}", R32[t]));
                self.emit(if signed { "cltd" } else { "xor %edx, %edx" });
                self.emit(&format!("{op} %{}", R32[t]));
            }
            _ => {
                // ax / r8: unsigned, with ah = 0 the quotient fits in al.
                self.emit("movzbl %al, %eax");
                self.emit(&format!("mov %{}, %{}", R32[s], R32[t]));
                self.emit(&format!("or $1, %{}", R8[t]));
                self.emit(&format!("div %{}", R8[t]));
            }
        }
        ctx.flags = 0;
    }

    fn shift(&mut self, ctx: &mut Ctx) {
        let op =
            *self.rng.pick(&["shl", "shr", "sar", "rol", "ror", "rcl", "rcr", "shl", "shr", "sar", "shld", "shrd"]);
        let size =
            if matches!(op, "shld" | "shrd") { *self.rng.pick(&[Size::W, Size::L, Size::Q]) } else { self.size() };
        if matches!(op, "rcl" | "rcr") && ctx.flags & CF == 0 {
            let carry = *self.rng.pick(&["clc", "stc"]);
            self.emit(carry);
            ctx.flags |= CF;
        }
        let count = self.rng.range(1, size.bits() - 1);
        let by_cl = Self::free(ctx, &[RCX]) && self.rng.chance(30);
        let count_op = if by_cl {
            self.emit(&format!("mov ${count}, %cl"));
            "%cl".to_string()
        } else {
            format!("${count}")
        };
        // qemu-user 7.2 stores a wrong value, one byte too low, for `shld $3, %eax, m32`.
        let register_only = self.options.qemu_compatible && matches!(op, "shld" | "shrd");
        let target = if register_only || self.rng.chance(70) {
            let d = self.dst(ctx);
            let d = if by_cl && d == RCX { RAX } else { d };
            if by_cl && d == RAX && !Self::free(ctx, &[RAX]) {
                return;
            }
            size.reg(d)
        } else {
            self.mem(ctx, size.bytes())
        };
        let suffix = if target.starts_with('%') { String::new() } else { size.suffix().to_string() };
        if matches!(op, "shld" | "shrd") {
            let s = self.src();
            self.emit(&format!("{op}{suffix} {count_op}, {}, {target}", size.reg(s)));
        } else {
            self.emit(&format!("{op}{suffix} {count_op}, {target}"));
        }
        let one = if count == 1 { OF } else { 0 };
        ctx.flags = match op {
            "rol" | "ror" | "rcl" | "rcr" => (ctx.flags & !OF) | CF | one,
            _ => (ctx.flags & !OF) | CF | SF | ZF | PF | one,
        };
    }

    fn bit_test(&mut self, ctx: &mut Ctx) {
        let op = *self.rng.pick(&["bt", "bts", "btr", "btc"]);
        let size = *self.rng.pick(&[Size::W, Size::L, Size::Q]);
        let bit = self.rng.below(size.bits());
        match self.rng.below(3) {
            0 => {
                let d = if op == "bt" { self.src() } else { self.dst(ctx) };
                self.emit(&format!("{op} ${bit}, {}", size.reg(d)));
            }
            1 => {
                let (s, d) = (self.src(), if op == "bt" { self.src() } else { self.dst(ctx) });
                self.emit(&format!("{op} {}, {}", size.reg(s), size.reg(d)));
            }
            _ => {
                let m = self.mem(ctx, size.bytes());
                self.emit(&format!("{op}{} ${bit}, {m}", size.suffix()));
            }
        }
        ctx.flags = (ctx.flags & !(OF | SF | ZF | PF)) | CF;
    }

    fn flags_to_register(&mut self, ctx: &mut Ctx) {
        let cc = self.condition(ctx);
        match self.rng.below(3) {
            0 => {
                let d = self.dst(ctx);
                self.emit(&format!("set{cc} {}", Size::B.reg(d)));
            }
            1 => {
                let m = self.mem(ctx, 1);
                self.emit(&format!("set{cc} {m}"));
            }
            _ => {
                let size = *self.rng.pick(&[Size::W, Size::L, Size::Q]);
                let d = self.dst(ctx);
                if self.rng.chance(50) {
                    let s = self.src();
                    self.emit(&format!("cmov{cc} {}, {}", size.reg(s), size.reg(d)));
                } else {
                    let m = self.mem(ctx, size.bytes());
                    self.emit(&format!("cmov{cc} {m}, {}", size.reg(d)));
                }
            }
        }
    }

    fn exchange(&mut self, ctx: &mut Ctx) {
        let size = self.size();
        let (a, b) = (self.dst(ctx), self.dst(ctx));
        match self.rng.below(5) {
            0 => self.emit(&format!("xchg {}, {}", size.reg(a), size.reg(b))),
            1 => {
                let m = self.mem(ctx, size.bytes());
                self.emit(&format!("xchg {}, {m}", size.reg(a)));
            }
            2 => {
                let lock = if self.rng.chance(50) { "lock " } else { "" };
                let m = self.mem(ctx, size.bytes());
                self.emit(&format!("{lock}xadd {}, {m}", size.reg(a)));
                ctx.flags = ALL_FLAGS;
            }
            3 => {
                self.emit(&format!("xadd {}, {}", size.reg(a), size.reg(b)));
                ctx.flags = ALL_FLAGS;
            }
            _ => {
                if !Self::free(ctx, &[RAX]) {
                    return;
                }
                let s = self.src();
                if self.rng.chance(50) {
                    self.emit(&format!("cmpxchg {}, {}", size.reg(s), size.reg(a)));
                } else {
                    let lock = if self.rng.chance(50) { "lock " } else { "" };
                    let m = self.mem(ctx, size.bytes());
                    self.emit(&format!("{lock}cmpxchg{} {}, {m}", size.suffix(), size.reg(s)));
                }
                ctx.flags = ALL_FLAGS;
            }
        }
    }

    fn push_pop(&mut self, ctx: &mut Ctx) {
        if ctx.depth > 0 && self.rng.chance(50) {
            ctx.depth -= 1;
            if self.rng.chance(75) {
                let d = self.dst(ctx);
                self.emit(&format!("pop %{}", R64[d]));
            } else {
                let m = self.data_mem(8, 8);
                self.emit(&format!("popq {m}"));
            }
        } else if ctx.depth < 6 {
            match self.rng.below(4) {
                0 | 1 => {
                    let s = self.src();
                    self.emit(&format!("push %{}", R64[s]));
                }
                2 => {
                    let i = self.imm(Size::L);
                    self.emit(&format!("pushq ${i}"));
                }
                _ => {
                    let m = self.mem(ctx, 8);
                    self.emit(&format!("pushq {m}"));
                }
            }
            ctx.depth += 1;
        }
    }

    /// Pops what the current straight-line run pushed.
    fn pop_all(&mut self, ctx: &mut Ctx) {
        while ctx.depth > 0 {
            ctx.depth -= 1;
            let d = self.dst(ctx);
            self.emit(&format!("pop %{}", R64[d]));
        }
    }

    fn string_op(&mut self, ctx: &mut Ctx) {
        if !Self::free(ctx, &[RSI, RDI, RCX, RAX]) {
            return;
        }
        let size = self.size();
        let kind = *self.rng.pick(&["movs", "movs", "stos", "lods", "cmps", "scas"]);
        let rep = self.rng.chance(70);
        let count = if rep { self.rng.range(if kind == "cmps" || kind == "scas" { 1 } else { 0 }, 12) } else { 1 };
        let span = count.max(1) * size.bytes();
        let backwards = self.rng.chance(15);
        // Where the destination (%rdi) and source (%rsi) start: in data_area, or the
        // destination in the frame.
        let first = |g: &mut Self| g.rng.below(DATA_SIZE - span + 1);
        let (dst_off, src_off) = (first(self), first(self));
        let last = if backwards { span - size.bytes() } else { 0 };
        let to_frame = ctx.frame >= span && self.rng.chance(30);
        if to_frame {
            let off = self.rng.below(ctx.frame - span + 1) + ctx.depth * 8;
            self.emit(&format!("lea {}(%rsp), %rdi", off + last));
        } else {
            self.emit(&format!("lea data_area+{}(%rip), %rdi", dst_off + last));
        }
        self.emit(&format!("lea data_area+{}(%rip), %rsi", src_off + last));
        if rep {
            self.emit(&format!("mov ${count}, %ecx"));
        }
        if backwards {
            self.emit("std");
        }
        let (prefix, insn) = match kind {
            "cmps" => ("repe ", "cmpsb".to_string()),
            "scas" => ("repne ", "scasb".to_string()),
            _ => ("rep ", format!("{kind}{}", size.suffix())),
        };
        let prefix = if rep { prefix } else { "" };
        self.emit(&format!("{prefix}{insn}"));
        // A rep string instruction is one instruction for the trace whatever its count.
        if backwards {
            self.emit("cld");
        }
        if matches!(kind, "cmps" | "scas") {
            ctx.flags = ALL_FLAGS;
        }
    }

    fn xmm(&mut self) -> String {
        format!("%xmm{}", self.rng.below(16))
    }

    fn sse(&mut self, ctx: &mut Ctx) {
        const BINARY: [&str; 40] = [
            "paddb",
            "paddw",
            "paddd",
            "paddq",
            "psubb",
            "psubw",
            "psubd",
            "psubq",
            "pmullw",
            "pmulhw",
            "pmuludq",
            "pand",
            "pandn",
            "por",
            "pxor",
            "pcmpeqb",
            "pcmpeqw",
            "pcmpeqd",
            "pcmpgtb",
            "pcmpgtw",
            "pcmpgtd",
            "punpcklbw",
            "punpcklwd",
            "punpckldq",
            "punpcklqdq",
            "punpckhbw",
            "punpckhqdq",
            "packsswb",
            "packuswb",
            "pmaxsw",
            "pminub",
            "pavgb",
            "psadbw",
            "pmaddwd",
            "paddusb",
            "psubsw",
            "unpcklpd",
            "andpd",
            "xorpd",
            "addpd",
        ];
        const SCALAR: [&str; 7] = ["addsd", "subsd", "mulsd", "divsd", "minsd", "maxsd", "sqrtsd"];
        match self.rng.below(10) {
            0..=2 => {
                let op = *self.rng.pick(&BINARY);
                // qemu-user 7.2 picks the other NaN than the CPU when both operands are NaNs.
                let op = if op == "addpd" && self.options.qemu_compatible { "paddw" } else { op };
                let d = self.xmm();
                let s = if self.rng.chance(25) { self.data_mem(16, 16) } else { self.xmm() };
                self.emit(&format!("{op} {s}, {d}"));
            }
            3 => {
                let op = *self.rng.pick(&SCALAR);
                let d = self.xmm();
                if self.options.qemu_compatible {
                    // Integers as operands, never a NaN (see addpd above): the results may
                    // still be the default NaN (0/0), infinities, rounded values.
                    let s = self.xmm();
                    let (a, b) = (self.src(), self.src());
                    self.emit(&format!("cvtsi2sdq %{}, {s}", R64[a]));
                    self.emit(&format!("cvtsi2sdq %{}, {d}", R64[b]));
                    self.emit(&format!("{op} {s}, {d}"));
                    return;
                }
                let s = if self.rng.chance(25) { self.mem(ctx, 8) } else { self.xmm() };
                self.emit(&format!("{op} {s}, {d}"));
            }
            4 => {
                let (s, d) = (self.xmm(), self.xmm());
                let i = self.rng.below(256);
                let op = *self.rng.pick(&["pshufd", "pshuflw", "pshufhw", "shufpd"]);
                let i = if op == "shufpd" { i & 3 } else { i };
                self.emit(&format!("{op} ${i}, {s}, {d}"));
            }
            5 => {
                let op = *self.rng.pick(&["psllw", "pslld", "psllq", "psrlw", "psrld", "psrlq", "psraw", "psrad"]);
                let d = self.xmm();
                let count = self.rng.below(if op.ends_with('q') { 64 } else { 32 });
                self.emit(&format!("{op} ${count}, {d}"));
            }
            6 => {
                let d = self.xmm();
                let count = self.rng.below(17);
                let op = *self.rng.pick(&["pslldq", "psrldq"]);
                self.emit(&format!("{op} ${count}, {d}"));
            }
            7 => {
                let x = self.xmm();
                match self.rng.below(6) {
                    0 => {
                        let s = self.src();
                        self.emit(&format!("movq %{}, {x}", R64[s]));
                    }
                    1 => {
                        let d = self.dst(ctx);
                        self.emit(&format!("movq {x}, %{}", R64[d]));
                    }
                    2 => {
                        let d = self.dst(ctx);
                        let op = *self.rng.pick(&["pmovmskb", "movd"]);
                        if op == "movd" {
                            self.emit(&format!("movd {x}, %{}", R32[d]));
                        } else {
                            self.emit(&format!("pmovmskb {x}, %{}", R32[d]));
                        }
                    }
                    3 => {
                        let d = self.dst(ctx);
                        let i = self.rng.below(8);
                        self.emit(&format!("pextrw ${i}, {x}, %{}", R32[d]));
                    }
                    4 => {
                        let s = self.src();
                        let i = self.rng.below(8);
                        self.emit(&format!("pinsrw ${i}, %{}, {x}", R32[s]));
                    }
                    _ => {
                        let s = self.src();
                        self.emit(&format!("cvtsi2sdq %{}, {x}", R64[s]));
                    }
                }
            }
            8 => {
                let x = self.xmm();
                match self.rng.below(5) {
                    0 => {
                        let m = self.data_mem(16, 16);
                        self.emit(&format!("movdqa {x}, {m}"));
                    }
                    1 => {
                        let m = self.mem(ctx, 16);
                        self.emit(&format!("movdqu {m}, {x}"));
                    }
                    2 => {
                        let m = self.mem(ctx, 16);
                        self.emit(&format!("movdqu {x}, {m}"));
                    }
                    3 => {
                        let m = self.mem(ctx, 8);
                        self.emit(&format!("movq {x}, {m}"));
                    }
                    _ => {
                        let m = self.mem(ctx, 8);
                        self.emit(&format!("movsd {m}, {x}"));
                    }
                }
            }
            _ => {
                let (a, b) = (self.xmm(), self.xmm());
                if self.rng.chance(50) {
                    let d = self.dst(ctx);
                    self.emit(&format!("cvttsd2si {a}, %{}", R64[d]));
                } else {
                    let op = *self.rng.pick(&["ucomisd", "comisd"]);
                    self.emit(&format!("{op} {a}, {b}"));
                    ctx.flags = ALL_FLAGS;
                }
            }
        }
    }

    /// A data_area operand indexed by a register masked into range.
    fn indexed(&mut self, ctx: &mut Ctx) {
        let size = self.size();
        let idx = self.dst(ctx);
        let scale = *self.rng.pick(&[1u64, 2, 4, 8]);
        let count = (DATA_SIZE - size.bytes()) / scale + 1;
        let mask = count.next_power_of_two() / 2 - 1;
        let s = self.src();
        self.emit(&format!("mov %{}, %{}", R32[s], R32[idx]));
        self.emit(&format!("and ${mask}, %{}", R32[idx]));
        ctx.flags = ALL_FLAGS;
        let d = self.dst(ctx);
        let via_base = self.rng.chance(40) && d != idx;
        let operand = if via_base {
            // The base in a register: lea of data_area, then (%base,%idx,scale).
            self.emit(&format!("lea data_area(%rip), %{}", R64[d]));
            format!("(%{},%{},{scale})", R64[d], R64[idx])
        } else {
            format!("data_area(,%{},{scale})", R64[idx])
        };
        if self.rng.chance(50) {
            let d = if via_base { self.dst(ctx) } else { d };
            self.emit(&format!("mov{} {operand}, {}", size.suffix(), size.reg(d)));
        } else {
            let s = self.src();
            self.emit(&format!("add{} {}, {operand}", size.suffix(), size.reg(s)));
        }
    }

    fn misc(&mut self, ctx: &mut Ctx) {
        match self.rng.below(6) {
            0 => {
                let d = self.dst(ctx);
                let size = *self.rng.pick(&[Size::L, Size::Q]);
                self.emit(&format!("bswap {}", size.reg(d)));
            }
            1 if Self::free(ctx, &[RAX, RDX]) => {
                let op = *self.rng.pick(&["cwtl", "cltq", "cltd", "cqto"]);
                self.emit(op);
            }
            2 => {
                // call to the next instruction: a taken branch to pc + length.
                let l = self.label();
                let d = self.dst(ctx);
                self.emit(&format!("call {l}"));
                self.place(&l);
                self.emit(&format!("pop %{}", R64[d]));
            }
            3 => {
                let l = self.label();
                self.emit(&format!("jmp {l}"));
                self.place(&l);
            }
            4 => {
                // A conditional jump to the next instruction: taken or not, it lands there.
                let cc = self.condition(ctx);
                let l = self.label();
                self.emit(&format!("j{cc} {l}"));
                self.place(&l);
            }
            _ if Self::free(ctx, &[RCX]) => {
                // `loop` to itself: a branch whose target is its own address, taken count-1
                // times.
                let count = self.rng.range(1, 5);
                let l = self.label();
                self.emit(&format!("mov ${count}, %ecx"));
                self.place(&l);
                self.emit(&format!("loop {l}"));
                self.cost += count - 1;
            }
            _ => {}
        }
    }

    /// adc/sbb chains: a multi-word add in registers.
    fn carry_chain(&mut self, ctx: &mut Ctx) {
        let (a, b, c) = (self.dst(ctx), self.src(), self.src());
        let d = self.dst(ctx);
        let op = *self.rng.pick(&[("add", "adc"), ("sub", "sbb")]);
        self.emit(&format!("{} %{}, %{}", op.0, R64[b], R64[a]));
        self.emit(&format!("{} %{}, %{}", op.1, R64[c], R64[d]));
        ctx.flags = ALL_FLAGS;
    }

    /// A straight-line run of `n` operations, stack balanced at its end.
    fn straight(&mut self, ctx: &mut Ctx, n: u64) {
        for _ in 0..n {
            if ctx.budget >= 4 {
                self.op(ctx);
            }
        }
        self.pop_all(ctx);
    }

    /// Generates a body with `f`, returning its text and cost without emitting it.
    fn capture(&mut self, f: impl FnOnce(&mut Self)) -> (String, u64) {
        let saved_out = std::mem::take(&mut self.out);
        let saved_cost = self.cost;
        self.cost = 0;
        f(self);
        let text = std::mem::replace(&mut self.out, saved_out);
        let cost = std::mem::replace(&mut self.cost, saved_cost);
        (text, cost)
    }

    /// A sequence of constructs filling (most of) the budget.
    fn block(&mut self, ctx: &mut Ctx, items: u64) {
        for _ in 0..items {
            let before = self.cost;
            self.construct(ctx);
            let spent = self.cost - before;
            ctx.budget = ctx.budget.saturating_sub(spent);
            if ctx.budget < 8 {
                break;
            }
        }
    }

    fn construct(&mut self, ctx: &mut Ctx) {
        let deep = ctx.nesting >= 3;
        match self.rng.below(20) {
            0..=5 => {
                let n = self.rng.range(2, 8);
                self.straight(ctx, n);
            }
            6 | 7 if !deep => self.if_else(ctx),
            8 if !deep => self.jcc_chain(ctx),
            9 | 10 if !deep => self.loop_construct(ctx),
            11 if !deep => self.switch(ctx),
            12..=15 => self.call(ctx),
            16 => self.syscall(ctx),
            17 => self.indirect_jump(ctx),
            _ => {
                let n = self.rng.range(1, 4);
                self.straight(ctx, n);
            }
        }
    }

    /// Body of a nested construct: a copy of `ctx` with a part of the budget.
    fn inner(ctx: &Ctx, budget: u64) -> Ctx {
        Ctx { nesting: ctx.nesting + 1, budget, ..ctx.clone() }
    }

    fn if_else(&mut self, ctx: &mut Ctx) {
        let cc = self.condition(ctx);
        let (l_else, l_end) = (self.label(), self.label());
        self.emit(&format!("j{cc} {l_else}"));
        let mut then_ctx = Self::inner(ctx, ctx.budget / 3);
        let items = self.rng.range(1, 3);
        self.block(&mut then_ctx, items);
        let has_else = self.rng.chance(60);
        if has_else {
            self.emit(&format!("jmp {l_end}"));
        }
        self.place(&l_else);
        let mut else_ctx = Self::inner(ctx, ctx.budget / 3);
        if has_else {
            let items = self.rng.range(1, 3);
            self.block(&mut else_ctx, items);
            self.place(&l_end);
            ctx.flags = then_ctx.flags & else_ctx.flags;
        } else {
            ctx.flags &= then_ctx.flags;
        }
    }

    /// Two conditional jumps on the same flags: the second reads flags across the first's
    /// not-taken path.
    fn jcc_chain(&mut self, ctx: &mut Ctx) {
        self.ensure_flags(ctx, ALL_FLAGS);
        let (a, _) = *self.rng.pick(&CONDITIONS);
        let (b, _) = *self.rng.pick(&CONDITIONS);
        let (l1, l2, end) = (self.label(), self.label(), self.label());
        self.emit(&format!("j{a} {l1}"));
        self.emit(&format!("j{b} {l2}"));
        let mut flags = ALL_FLAGS;
        for (i, l) in [None, Some(&l1), Some(&l2)].into_iter().enumerate() {
            if let Some(l) = l {
                self.place(l);
            }
            let mut c = Self::inner(ctx, ctx.budget / 4);
            self.block(&mut c, 1);
            flags &= c.flags;
            if i < 2 {
                self.emit(&format!("jmp {end}"));
            }
        }
        self.place(&end);
        ctx.flags = flags;
    }

    fn loop_construct(&mut self, ctx: &mut Ctx) {
        let mut kinds = vec!["dec", "up"];
        if Self::free(ctx, &[RCX]) {
            kinds.extend(["loop", "jrcxz"]);
        }
        if ctx.counter_slot < COUNTER_SLOTS {
            kinds.push("memory");
        }
        let kind = *self.rng.pick(&kinds);
        let counter = match kind {
            "loop" | "jrcxz" => RCX,
            "memory" => RSP,
            _ => self.dst(ctx),
        };
        let mut body_ctx = Self::inner(ctx, ctx.budget / 3);
        body_ctx.flags = 0;
        if counter != RSP {
            body_ctx.protected |= 1 << counter;
        }
        let slot = ctx.frame + 8 * ctx.counter_slot;
        if kind == "memory" {
            body_ctx.counter_slot += 1;
        }
        let items = self.rng.range(1, 3);
        let (body, body_cost) = self.capture(|g| g.block(&mut body_ctx, items));
        let iterations = self.rng.range(1, 8).min((ctx.budget / (body_cost + 3).max(1)).max(1));
        let (head, end) = (self.label(), self.label());
        let c = R64[counter];
        let c32 = R32[counter];
        match kind {
            "dec" => self.emit(&format!("mov ${iterations}, %{c32}")),
            "up" => self.emit(&format!("mov $0, %{c}")),
            "loop" | "jrcxz" => self.emit(&format!("mov ${iterations}, %ecx")),
            _ => self.emit(&format!("movq ${iterations}, {slot}(%rsp)")),
        }
        // loop and jrcxz reach 127 bytes at most: around a long body they go through a jmp
        // (the body's instructions take up to 11 bytes).
        let long = body.lines().filter(|l| l.starts_with("    ")).count() > 10;
        let (near, far) = (self.label(), self.label());
        self.place(&head);
        if kind == "jrcxz" {
            if long {
                self.emit(&format!("jrcxz {near}"));
                self.emit(&format!("jmp {far}"));
                self.place(&near);
                self.emit(&format!("jmp {end}"));
                self.place(&far);
                self.cost += 1;
            } else {
                self.emit(&format!("jrcxz {end}"));
            }
        }
        self.out.push_str(&body);
        let tail = match kind {
            "dec" => {
                let dec = if self.rng.chance(50) { format!("dec %{c}") } else { format!("sub $1, %{c}") };
                let jump = if self.rng.chance(50) { "jnz" } else { "jne" };
                vec![dec, format!("{jump} {head}")]
            }
            "up" => {
                let jump = *self.rng.pick(&["jb", "jl", "jne", "jbe"]);
                let limit = if jump == "jbe" { iterations - 1 } else { iterations };
                vec![format!("inc %{c}"), format!("cmp ${limit}, %{c}"), format!("{jump} {head}")]
            }
            "loop" if long => {
                vec![format!("loop {near}"), format!("jmp {end}"), format!("{near}: jmp {head}")]
            }
            "loop" => vec![format!("loop {head}")],
            "jrcxz" => vec!["lea -1(%rcx), %rcx".to_string(), format!("jmp {head}")],
            _ => vec![format!("decq {slot}(%rsp)"), format!("jnz {head}")],
        };
        let tail_cost = tail.len() as u64 + u64::from(kind == "jrcxz");
        for line in &tail {
            self.emit(line);
        }
        self.place(&end);
        // The body and the loop's own instructions ran `iterations` times.
        self.cost += (body_cost + tail_cost) * iterations - tail_cost;
        ctx.flags = match kind {
            "dec" | "memory" => (body_ctx.flags & CF) | (ALL_FLAGS & !CF),
            "up" => ALL_FLAGS,
            "loop" => body_ctx.flags,
            _ => 0,
        };
    }

    fn switch(&mut self, ctx: &mut Ctx) {
        let t = self.dst(ctx);
        let s = self.src();
        let cases = *self.rng.pick(&[2u64, 4, 4, 8]);
        let table = format!("jump_table{}", self.label().trim_start_matches(".L"));
        let end = self.label();
        let labels: Vec<String> = (0..cases).map(|_| self.label()).collect();
        self.emit(&format!("mov %{}, %{}", R32[s], R32[t]));
        self.emit(&format!("and ${}, %{}", cases - 1, R32[t]));
        let b = self.dst(ctx);
        if b != t && self.rng.chance(40) {
            self.emit(&format!("lea {table}(%rip), %{}", R64[b]));
            self.emit(&format!("jmp *(%{},%{},8)", R64[b], R64[t]));
        } else {
            self.emit(&format!("jmp *{table}(,%{},8)", R64[t]));
        }
        let mut flags = ALL_FLAGS;
        for (i, l) in labels.iter().enumerate() {
            self.place(l);
            let mut c = Self::inner(ctx, ctx.budget / (cases + 1));
            c.flags = ALL_FLAGS;
            self.block(&mut c, 1);
            flags &= c.flags;
            if i + 1 < labels.len() {
                self.emit(&format!("jmp {end}"));
            }
        }
        self.place(&end);
        self.tables.push((table, labels));
        ctx.flags = flags;
    }

    fn indirect_jump(&mut self, ctx: &mut Ctx) {
        let r = self.dst(ctx);
        let l = self.label();
        self.emit(&format!("lea {l}(%rip), %{}", R64[r]));
        self.emit(&format!("jmp *%{}", R64[r]));
        self.emit("ud2");
        self.place(&l);
    }

    fn call(&mut self, ctx: &mut Ctx) {
        let callable: Vec<usize> =
            (ctx.first_callee..self.funcs.len()).filter(|&j| self.funcs[j].cost + 20 <= ctx.budget).collect();
        if callable.is_empty() {
            return self.straight(ctx, 2);
        }
        let j = *self.rng.pick(&callable);
        let f = self.funcs[j].clone();
        // Registers the callee may overwrite and this code still needs, saved around the call.
        let saved: Vec<usize> = (0..16).filter(|&r| r != RSP && ctx.protected & (1 << r) != 0).collect();
        for r in &saved {
            self.emit(&format!("push %{}", R64[*r]));
        }
        for _ in 0..f.ret_pop / 8 {
            let i = self.imm(Size::L);
            self.emit(&format!("pushq ${i}"));
        }
        let through = self.dst(ctx);
        let can_use_reg = !saved.contains(&through);
        match self.rng.below(5) {
            0 if can_use_reg => {
                self.emit(&format!("lea {}(%rip), %{}", f.name, R64[through]));
                self.emit(&format!("call *%{}", R64[through]));
            }
            1 => self.emit(&format!("call *functions+{}(%rip)", 8 * j)),
            2 if can_use_reg => {
                self.emit(&format!("mov ${j}, %{}", R32[through]));
                self.emit(&format!("call *functions(,%{},8)", R64[through]));
            }
            3 if ctx.frame >= 8 && can_use_reg => {
                // Through a stack slot of the frame (saved registers and arguments shift it).
                let shift = 8 * saved.len() as u64 + f.ret_pop;
                let off = self.rng.below(ctx.frame / 8) * 8;
                self.emit(&format!("lea {}(%rip), %{}", f.name, R64[through]));
                self.emit(&format!("mov %{}, {}(%rsp)", R64[through], off + shift));
                self.emit(&format!("call *{}(%rsp)", off + shift));
            }
            _ => self.emit(&format!("call {}", f.name)),
        }
        for r in saved.iter().rev() {
            self.emit(&format!("pop %{}", R64[*r]));
        }
        self.cost += f.cost;
        ctx.flags = 0;
    }

    fn syscall(&mut self, ctx: &mut Ctx) {
        if !Self::free(ctx, &[RAX, RDI, RSI, RDX, RCX, R11]) {
            return self.straight(ctx, 1);
        }
        if self.rng.chance(50) {
            self.emit("mov $39, %eax");
            self.emit("syscall");
            // The pid differs between runs.
            let v = self.imm(Size::L);
            self.emit(&format!("mov ${v}, %eax"));
        } else {
            let len = self.rng.range(1, 24);
            let off = self.rng.below(DATA_SIZE - len);
            self.emit("mov $1, %eax");
            self.emit("mov $1, %edi");
            self.emit(&format!("lea data_area+{off}(%rip), %rsi"));
            self.emit(&format!("mov ${len}, %edx"));
            self.emit("syscall");
        }
        if self.options.qemu_compatible {
            // qemu-user leaves %rcx and %r11 as they were: give both a known value (mov
            // leaves the flags alone).
            let (c, r) = (self.imm(Size::L), self.imm(Size::L));
            self.emit(&format!("mov ${c}, %rcx"));
            self.emit(&format!("mov ${r}, %r11"));
        } else {
            // %r11 holds rflags: keep the defined arithmetic flags only (TF, IF and the rest
            // differ between recorders).
            self.emit(&format!("and ${}, %r11", ctx.flags));
            ctx.flags = ALL_FLAGS;
        }
    }

    /// Saves the registers and flags (masked to `flags`, the defined ones), writes the state,
    /// data_area and the stack area in one `write(1, ...)`, and exits with a fold of the saved
    /// registers.
    fn save_state(&mut self, flags: u16) {
        for (r, name) in R64.iter().enumerate() {
            self.emit(&format!("mov %{name}, state+{}(%rip)", 8 * r));
        }
        self.emit("pushfq");
        self.emit("popq state+128(%rip)");
        // The copy pushf left below %rsp: single-stepping's TF is in it.
        self.emit("movq $0, -8(%rsp)");
        self.emit(&format!("andq ${flags}, state+128(%rip)"));
        for x in 0..16 {
            self.emit(&format!("movdqu %xmm{x}, state+{}(%rip)", 136 + 16 * x));
        }
        self.emit("mov state(%rip), %rax");
        for q in 1..17 {
            self.emit(&format!("xor state+{}(%rip), %rax", 8 * q));
        }
        for shift in [32, 16, 8] {
            self.emit("mov %rax, %rdx");
            self.emit(&format!("shr ${shift}, %rdx"));
            self.emit("xor %rdx, %rax");
        }
        self.emit("movzbl %al, %ebx");
        self.emit("mov $1, %eax");
        self.emit("mov $1, %edi");
        self.emit("lea state(%rip), %rsi");
        self.emit(&format!("mov ${DUMP_SIZE}, %edx"));
        self.emit("syscall");
        self.emit("mov $231, %eax");
        self.emit("mov %ebx, %edi");
        self.emit("syscall");
    }

    fn program(&mut self) -> String {
        let count = self.rng.range(3, 7) as usize;
        // Generated from the last to the first, so that each knows its callees' costs (the
        // placeholders' cost keeps functions not generated yet from being called).
        self.funcs = (0..count).map(|i| Func { name: format!("f{i}"), ret_pop: 0, cost: u64::MAX / 4 }).collect();
        let mut texts = vec![String::new(); count];
        for index in (0..count).rev() {
            texts[index] = self.function(index);
        }

        let mut out = String::from(
            "# Generated by tests/src/gen_x86.rs (itrace-tests' differential test)\n\
             \x20   .text\n    .globl _start\n    .type _start, @function\n_start:\n",
        );
        let (main, main_cost) = self.capture(|g| {
            g.emit("lea stack_top(%rip), %rsp");
            for x in 0..16 {
                g.emit(&format!("movdqa xmm_init+{}(%rip), %xmm{x}", 16 * x));
            }
            for (r, name) in R64.iter().enumerate() {
                if r != RSP {
                    let v = g.rng.next_u64();
                    let v = match g.rng.below(4) {
                        0 => v & 0xff,
                        1 => v as i32 as i64 as u64,
                        _ => v,
                    };
                    g.emit(&format!("movabs ${v:#x}, %{name}"));
                }
            }
            g.emit("sub $128, %rsp");
            g.emit("cmp %rbx, %rax");
            let mut ctx = Ctx {
                protected: 0,
                depth: 0,
                frame: 128 - COUNTER_SLOTS * 8,
                counter_slot: 0,
                args: 0,
                arg_base: 0,
                first_callee: 0,
                flags: ALL_FLAGS,
                nesting: 0,
                budget: MAIN_BUDGET,
            };
            let items = g.rng.range(6, 16);
            g.block(&mut ctx, items);
            g.emit("add $128, %rsp");
            g.save_state(ctx.flags);
        });
        self.main_cost = main_cost;
        out.push_str(&main);
        for t in &texts {
            out.push_str(t);
        }
        out.push_str("    .section .rodata\n    .balign 16\nfunctions:\n");
        for f in &self.funcs {
            let _ = writeln!(out, "    .quad {}", f.name);
        }
        for (name, labels) in &self.tables {
            let _ = writeln!(out, "    .balign 8\n{name}:");
            for l in labels {
                let _ = writeln!(out, "    .quad {l}");
            }
        }
        out.push_str("    .balign 16\nxmm_init:\n");
        for _ in 0..16 {
            // Random bits, or two doubles of small magnitude.
            let (a, b) = if self.rng.chance(50) {
                (self.rng.next_u64(), self.rng.next_u64())
            } else {
                let small = |g: &mut Self| ((g.rng.below(2001) as f64 - 1000.0) / 8.0).to_bits();
                (small(self), small(self))
            };
            let _ = writeln!(out, "    .quad {a:#x}, {b:#x}");
        }
        out.push_str("    .data\n    .balign 16\nstate:\n");
        let _ = writeln!(out, "    .fill {},1,0", STATE_SIZE + 8);
        out.push_str("data_area:\n");
        for _ in 0..DATA_SIZE / 8 {
            let v = self.rng.next_u64();
            let _ = writeln!(out, "    .quad {v:#x}");
        }
        let _ = writeln!(out, "stack_area:\n    .fill {STACK_SIZE},1,0\nstack_top:");
        out
    }

    fn function(&mut self, index: usize) -> String {
        let name = format!("f{index}");
        let ret_pop = if self.rng.chance(20) { 16 } else { 0 };
        let frame = *self.rng.pick(&[0u64, 16, 32, 64, 64, 128]);
        let enter = self.rng.chance(25);
        let budget = self.rng.range(40, 400);
        let full_frame = frame + COUNTER_SLOTS * 8;
        let mut ctx = Ctx {
            protected: if enter { 1 << RBP } else { 0 },
            depth: 0,
            frame,
            counter_slot: 0,
            args: ret_pop / 8,
            // Above the frame: the saved %rbp of enter, the return address.
            arg_base: full_frame + u64::from(enter) * 8 + 8,
            first_callee: index + 1,
            flags: 0,
            nesting: 0,
            budget,
        };
        // A tail jump goes to a later function with the same `ret $n`.
        let tail: Vec<usize> = (index + 1..self.funcs.len())
            .filter(|&j| self.funcs[j].ret_pop == ret_pop && self.funcs[j].cost <= 400)
            .collect();
        let tail_to = if !tail.is_empty() && self.rng.chance(30) { Some(*self.rng.pick(&tail)) } else { None };
        let (text, cost) = self.capture(|g| {
            let _ = writeln!(g.out, "    .type {name}, @function\n{name}:");
            if enter {
                g.emit(&format!("enter ${full_frame}, $0"));
            } else {
                g.emit(&format!("sub ${full_frame}, %rsp"));
            }
            let items = g.rng.range(2, 6);
            g.block(&mut ctx, items);
            if enter {
                g.emit("leave");
            } else {
                g.emit(&format!("add ${full_frame}, %rsp"));
            }
            match tail_to {
                Some(j) => {
                    let target = g.funcs[j].name.clone();
                    g.emit(&format!("jmp {target}"));
                    g.cost += g.funcs[j].cost;
                }
                None if ret_pop > 0 => g.emit(&format!("ret ${ret_pop}")),
                None => g.emit("ret"),
            }
        });
        self.funcs[index] = Func { name, ret_pop, cost };
        text
    }
}
