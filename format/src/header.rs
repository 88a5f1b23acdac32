//! The fixed 64-byte file header.

use crate::FormatError;
use std::path::Path;

/// First four bytes of every trace file.
pub const MAGIC: [u8; 4] = *b"ITRC";
/// Readers refuse files with another major version.
pub const VERSION_MAJOR: u16 = 1;
/// Minor versions only add record kinds; readers skip kinds they do not know.
pub const VERSION_MINOR: u16 = 0;
/// Size of the file header in bytes.
pub const HEADER_LEN: usize = 64;

/// Byte order of every multi-byte field after the magic (the writer's own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endian {
    Little,
    Big,
}

impl Endian {
    /// The byte order of the machine running this code.
    pub const fn native() -> Self {
        if cfg!(target_endian = "big") {
            Endian::Big
        } else {
            Endian::Little
        }
    }
    pub(crate) fn u16(self, b: &[u8]) -> u16 {
        let a = [b[0], b[1]];
        match self {
            Endian::Little => u16::from_le_bytes(a),
            Endian::Big => u16::from_be_bytes(a),
        }
    }
    pub(crate) fn u32(self, b: &[u8]) -> u32 {
        let a = [b[0], b[1], b[2], b[3]];
        match self {
            Endian::Little => u32::from_le_bytes(a),
            Endian::Big => u32::from_be_bytes(a),
        }
    }
    pub(crate) fn u64(self, b: &[u8]) -> u64 {
        let a: [u8; 8] = b[..8].try_into().expect("8 bytes");
        match self {
            Endian::Little => u64::from_le_bytes(a),
            Endian::Big => u64::from_be_bytes(a),
        }
    }
}

macro_rules! code_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident = $val:expr => $s:expr),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $var = $val),* }
        impl $name {
            /// The code stored in the file.
            pub fn code(self) -> u16 { self as u16 }
            /// The variant for a stored code.
            pub fn from_code(c: u16) -> Option<Self> { match c { $($val => Some(Self::$var),)* _ => None } }
            /// Lower-case name used on the command line and in reports.
            pub fn name(self) -> &'static str { match self { $(Self::$var => $s),* } }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str(self.name()) }
        }
    };
}

code_enum! {
    /// Architecture of the traced program.
    Arch {
        X86_64 = 1 => "x86_64",
        I386 = 2 => "i386",
        Ppc64le = 3 => "ppc64le",
        Ppc64 = 4 => "ppc64",
        S390x = 5 => "s390x",
    }
}

code_enum! {
    /// Collection mode, with PI's codes.
    Mode {
        /// Tracing stops when a buffer is full.
        Normal = 0 => "normal",
        /// Trace records overwrite the oldest; MTE records are kept.
        Wrap = 1 => "wrap",
        /// Full segments are written to the file while tracing goes on.
        Continuous = 2 => "continuous",
    }
}

code_enum! {
    /// How the recorder stopped at each instruction or branch.
    StepMethod {
        /// ptrace PTRACE_SINGLESTEP: a stop per instruction.
        PtraceSingleStep = 0 => "ptrace-singlestep",
        /// ptrace PTRACE_SINGLEBLOCK: a stop per taken branch, blocks decoded to count.
        PtraceSingleBlock = 1 => "ptrace-singleblock",
        /// GDB remote protocol single-step.
        GdbStep = 2 => "gdb-step",
        /// The traced thread steps itself with a SIGTRAP handler.
        InProcess = 3 => "in-process",
        /// The kernel shim's debug-trap handler.
        Kernel = 4 => "kernel",
        /// An emulator's per-block callbacks.
        Emulated = 5 => "emulated",
    }
}

/// Header flag: branch records carry instruction counts.
pub const FLAG_ICOUNT: u32 = 1;
/// Header flag: address-space randomisation was disabled for the tracee.
pub const FLAG_NO_ASLR: u32 = 2;

/// The decoded file header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileHeader {
    pub endian: Endian,
    pub version_major: u16,
    pub version_minor: u16,
    pub arch: Arch,
    pub mode: Mode,
    pub step_method: StepMethod,
    pub ncpu: u16,
    pub flags: u32,
    pub buffer_size: u64,
    pub segment_size: u64,
    pub start_realtime_ns: u64,
    pub start_monotonic_ns: u64,
}

impl FileHeader {
    /// The header of a trace that starts now: native byte order, this format version, both
    /// clocks read now.
    #[allow(clippy::too_many_arguments)]
    pub fn starting_now(
        arch: Arch,
        mode: Mode,
        step_method: StepMethod,
        ncpu: u16,
        flags: u32,
        buffer_size: u64,
        segment_size: u64,
    ) -> FileHeader {
        let realtime = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        FileHeader {
            endian: Endian::native(),
            version_major: VERSION_MAJOR,
            version_minor: VERSION_MINOR,
            arch,
            mode,
            step_method,
            ncpu,
            flags,
            buffer_size,
            segment_size,
            start_realtime_ns: realtime,
            start_monotonic_ns: crate::now_ns(),
        }
    }

    /// Whether address-space randomisation was off for the traced program.
    pub fn aslr_disabled(&self) -> bool {
        self.flags & FLAG_NO_ASLR != 0
    }

    /// Encode in native byte order.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = match Endian::native() {
            Endian::Little => 1,
            Endian::Big => 2,
        };
        b[5] = HEADER_LEN as u8;
        b[6..8].copy_from_slice(&self.version_major.to_ne_bytes());
        b[8..10].copy_from_slice(&self.version_minor.to_ne_bytes());
        b[10..12].copy_from_slice(&self.arch.code().to_ne_bytes());
        b[12] = self.mode.code() as u8;
        b[13] = self.step_method.code() as u8;
        b[14..16].copy_from_slice(&self.ncpu.to_ne_bytes());
        b[16..20].copy_from_slice(&self.flags.to_ne_bytes());
        b[24..32].copy_from_slice(&self.buffer_size.to_ne_bytes());
        b[32..40].copy_from_slice(&self.segment_size.to_ne_bytes());
        b[40..48].copy_from_slice(&self.start_realtime_ns.to_ne_bytes());
        b[48..56].copy_from_slice(&self.start_monotonic_ns.to_ne_bytes());
        b
    }

    /// Decode and validate; `path` is only used in error messages.
    pub fn decode(path: &Path, b: &[u8]) -> Result<Self, FormatError> {
        if b.is_empty() {
            return Err(FormatError::Empty { path: path.into() });
        }
        if b.len() < 4 || b[0..4] != MAGIC {
            return Err(FormatError::NotATrace { path: path.into(), found: b[..b.len().min(4)].to_vec() });
        }
        if b.len() < HEADER_LEN {
            return Err(FormatError::Corrupt {
                offset: b.len() as u64,
                what: format!("file ends inside the {HEADER_LEN}-byte header"),
            });
        }
        let endian = match b[4] {
            1 => Endian::Little,
            2 => Endian::Big,
            x => return Err(corrupt(4, format!("unknown byte-order code {x}"))),
        };
        let version_major = endian.u16(&b[6..]);
        let version_minor = endian.u16(&b[8..]);
        if version_major != VERSION_MAJOR {
            return Err(FormatError::UnsupportedVersion {
                path: path.into(),
                major: version_major,
                minor: version_minor,
            });
        }
        let arch_code = endian.u16(&b[10..]);
        let arch =
            Arch::from_code(arch_code).ok_or_else(|| corrupt(10, format!("unknown architecture code {arch_code}")))?;
        let mode = Mode::from_code(b[12] as u16).ok_or_else(|| corrupt(12, format!("unknown mode code {}", b[12])))?;
        let step_method = StepMethod::from_code(b[13] as u16)
            .ok_or_else(|| corrupt(13, format!("unknown step method code {}", b[13])))?;
        let ncpu = endian.u16(&b[14..]);
        if ncpu == 0 {
            return Err(corrupt(14, "CPU count is 0".into()));
        }
        Ok(FileHeader {
            endian,
            version_major,
            version_minor,
            arch,
            mode,
            step_method,
            ncpu,
            flags: endian.u32(&b[16..]),
            buffer_size: endian.u64(&b[24..]),
            segment_size: endian.u64(&b[32..]),
            start_realtime_ns: endian.u64(&b[40..]),
            start_monotonic_ns: endian.u64(&b[48..]),
        })
    }
}

fn corrupt(offset: u64, what: String) -> FormatError {
    FormatError::Corrupt { offset, what }
}
