//! The fixed 64-byte file header, which ends with a CRC of the bytes before it: nothing in it
//! is used before that CRC matches.

use crate::writer::crc32;
use crate::FormatError;
use std::path::Path;

/// First four bytes of every trace file.
pub const MAGIC: [u8; 4] = *b"ITRC";
/// The major version this itrace writes. 2: header and chunk headers carry their own CRC (1.0
/// had none, so a damaged length or header field went unnoticed). 3: CPU chunks hold the
/// compact encoding ([`crate::compact`]), and chunks may be compressed.
pub const VERSION_MAJOR: u16 = 3;
/// The oldest major version this itrace reads (2.0: the same header and chunk headers, CPU
/// chunks of 16-byte-header records).
pub const OLDEST_MAJOR: u16 = 2;
/// Minor versions only add record kinds; readers skip kinds they do not know.
pub const VERSION_MINOR: u16 = 0;
/// Size of the file header in bytes.
pub const HEADER_LEN: usize = 64;
/// Where the header's CRC lies: the last 4 bytes of the header, over every byte before them.
/// Kept there (at header length - 4) by every later version, so that a reader checks the
/// header before it believes the version in it.
const HEADER_CRC_AT: usize = HEADER_LEN - 4;
/// Header flag bits this version defines.
const KNOWN_FLAGS: u32 = FLAG_ICOUNT | FLAG_NO_ASLR;
/// Stream numbers from here up name the MTE and end streams, so a CPU count stays below.
const MAX_NCPU: u16 = 0xFFFE;

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
        /// ptrace with debug-register breakpoints: a stop per instruction whose outcome the
        /// decoder cannot tell, blocks decoded to count (`--step block`).
        PtraceHwBreak = 6 => "ptrace-hwbreak",
        /// The program ran from a code cache of translated blocks that record their own taken
        /// branches (`--backend translate`); instructions the cache does not run are single-stepped.
        Translated = 7 => "translated",
    }
}

/// Whether a file of this minor version is newer than this reader: it may set flag bits this
/// reader does not know (fields it does not know are reserved zeros to this reader otherwise).
#[allow(clippy::absurd_extreme_comparisons)] // VERSION_MINOR is 0 today; the rule is for later ones.
pub(crate) fn later_minor(minor: u16) -> bool {
    minor > VERSION_MINOR
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
        let crc = crc32(&b[..HEADER_CRC_AT]);
        b[HEADER_CRC_AT..].copy_from_slice(&crc.to_ne_bytes());
        b
    }

    /// Decode and validate; `path` is only used in error messages. The bytes that say how
    /// to check the rest (byte order, header length) are checked one by one, then the CRC,
    /// then the version, then every field.
    pub fn decode(path: &Path, b: &[u8]) -> Result<Self, FormatError> {
        let damaged = |what: String| FormatError::HeaderDamaged { path: path.into(), what };
        let invalid = |what: String| FormatError::HeaderInvalid { path: path.into(), what };
        if b.is_empty() {
            return Err(FormatError::Empty { path: path.into() });
        }
        if b.len() < 4 || b[0..4] != MAGIC {
            return Err(FormatError::NotATrace { path: path.into(), found: b[..b.len().min(4)].to_vec() });
        }
        if b.len() < HEADER_LEN {
            return Err(FormatError::HeaderCut { path: path.into(), len: b.len() as u64 });
        }
        let endian = match b[4] {
            1 => Endian::Little,
            2 => Endian::Big,
            x => {
                return Err(damaged(format!(
                    "its byte-order byte (offset 4) is {x:#04x}, not 1 (little-endian) or 2 (big-endian)"
                )))
            }
        };
        let version_major = endian.u16(&b[6..]);
        let version_minor = endian.u16(&b[8..]);
        // Format 1.0 had no header CRC: its last 8 bytes were reserved zeros. It is read as it
        // was (its fields checked one by one below), with what 1.0 could not tell apart.
        let v1 = version_major == 1 && version_minor == 0 && b[5] as usize == HEADER_LEN && b[56..64] == [0; 8];
        let len = b[5] as usize;
        if !v1 {
            if len < HEADER_LEN || len % 4 != 0 {
                return Err(damaged(format!(
                    "its header-length byte (offset 5) is {len}; format 2 and 3 headers are 64 bytes"
                )));
            }
            if b.len() < len {
                return Err(damaged(format!("its header-length byte (offset 5) says {len}, longer than the file")));
            }
            let crc_at = len - 4;
            let stored = endian.u32(&b[crc_at..]);
            if crc32(&b[..crc_at]) != stored {
                // Name the byte when it is the one damaged: the header checks out as 64 bytes long.
                if len != HEADER_LEN {
                    let mut h: [u8; HEADER_LEN] = b[..HEADER_LEN].try_into().expect("64 bytes");
                    h[5] = HEADER_LEN as u8;
                    if crc32(&h[..HEADER_CRC_AT]) == endian.u32(&h[HEADER_CRC_AT..]) {
                        return Err(damaged(format!("its header-length byte (offset 5) is {len}, not {HEADER_LEN}")));
                    }
                }
                // Or the byte-order byte: the header checks out read in the other order.
                let mut h: [u8; HEADER_LEN] = b[..HEADER_LEN].try_into().expect("64 bytes");
                h[4] ^= 3;
                let other = if endian == Endian::Little { Endian::Big } else { Endian::Little };
                if len == HEADER_LEN && crc32(&h[..HEADER_CRC_AT]) == other.u32(&h[HEADER_CRC_AT..]) {
                    return Err(damaged(format!(
                        "its byte-order byte (offset 4) is {}, but the header was written {}",
                        b[4],
                        if other == Endian::Little { "little-endian (1)" } else { "big-endian (2)" }
                    )));
                }
                return Err(damaged("its checksum does not match".into()));
            }
            if !(OLDEST_MAJOR..=VERSION_MAJOR).contains(&version_major) {
                return Err(FormatError::UnsupportedVersion {
                    path: path.into(),
                    major: version_major,
                    minor: version_minor,
                });
            }
        }
        // From here on the bytes are as written: a value out of range is a writer's mistake.
        if len != HEADER_LEN {
            return Err(invalid(format!("header length {len} (offset 5); format 2 and 3 headers are 64 bytes")));
        }
        let arch_code = endian.u16(&b[10..]);
        let arch = Arch::from_code(arch_code)
            .ok_or_else(|| invalid(format!("unknown architecture code {arch_code} (offset 10)")))?;
        let mode =
            Mode::from_code(b[12] as u16).ok_or_else(|| invalid(format!("unknown mode code {} (offset 12)", b[12])))?;
        let step_method = StepMethod::from_code(b[13] as u16)
            .ok_or_else(|| invalid(format!("unknown step method code {} (offset 13)", b[13])))?;
        let ncpu = endian.u16(&b[14..]);
        if ncpu == 0 || ncpu >= MAX_NCPU {
            return Err(invalid(format!("CPU count {ncpu} (offset 14); 1 to {} expected", MAX_NCPU - 1)));
        }
        let flags = endian.u32(&b[16..]);
        // A later minor version may define more flags; this one's writer sets only its own.
        if !later_minor(version_minor) && flags & !KNOWN_FLAGS != 0 {
            return Err(invalid(format!("unknown flag bits {:#x} (offset 16)", flags & !KNOWN_FLAGS)));
        }
        for (at, n) in [(20, 4), (56, 4)] {
            if b[at..at + n].iter().any(|&x| x != 0) {
                return Err(invalid(format!("reserved bytes at offset {at} are not zero")));
            }
        }
        Ok(FileHeader {
            endian,
            version_major,
            version_minor,
            arch,
            mode,
            step_method,
            ncpu,
            flags,
            buffer_size: endian.u64(&b[24..]),
            segment_size: endian.u64(&b[32..]),
            start_realtime_ns: endian.u64(&b[40..]),
            start_monotonic_ns: endian.u64(&b[48..]),
        })
    }
}
