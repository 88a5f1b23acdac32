//! The kernel shim's device ABI (`/dev/itrace`, kmod-shim/itrace_kmod.h), shared by
//! `itrace record --backend kmod` and libitrace's ITraceOn/ITraceOff: ioctl numbers, their
//! argument structures and the control block of the mapped rings. The ring records themselves
//! have the trace file's layout. `itrace`'s test `c_header_matches` compiles the C header
//! and checks every size and offset here against it.

/// The device the module creates.
pub const DEVICE: &str = "/dev/itrace";

/// Environment variable telling libitrace's ITraceOn/ITraceOff to use the device.
pub const ENV_KMOD: &str = "ITRACE_KMOD";

pub const ITR_MAGIC: u32 = 0x4b52_5449;
pub const ITR_VERSION: u32 = 2;
pub const ITR_MAJOR_PAD: u16 = 0x7f00;
pub const ITR_CFG_FOLLOW_FORKS: u32 = 1;
pub const ITR_CFG_NO_FOLLOW_THREADS: u32 = 2;
pub const ITR_EN_TID: u32 = 1;
pub const ITR_EN_ON_EXEC: u32 = 2;
pub const ITR_EN_REGION: u32 = 4;

/// `struct itr_stream`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Stream {
    pub head: u64,
    pub tail: u64,
    pub lost: u64,
    pub records: u64,
    pub offset: u64,
    pub size: u64,
    pub pad: [u64; 2],
}

/// `struct itr_ctl` without its stream array (which follows at offset 64).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Ctl {
    pub magic: u32,
    pub version: u32,
    pub ncpu: u32,
    pub mode: u32,
    pub map_size: u64,
    pub full: u32,
    pub threads: u32,
    pub pad: [u64; 4],
}

/// `struct itr_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    pub mode: u32,
    pub flags: u32,
    pub buffer_size: u64,
    pub mte_size: u64,
}

/// `struct itr_target`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TargetArg {
    pub pid: i32,
    pub flags: u32,
}

/// `struct itr_consume`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Consume {
    pub stream: u32,
    pub pad: u32,
    pub tail: u64,
}

/// `struct itr_status`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Status {
    pub version: u32,
    pub installed: u32,
    pub ncpu: u32,
    pub mode: u32,
    pub threads: u32,
    pub full: u32,
    pub map_size: u64,
    pub traps: u64,
}

/// The most library entry points `struct itr_on` carries.
pub const ITR_MAX_ENTRIES: usize = 8;

/// `struct itr_on`: where the calling thread's region starts or goes on, and the library's
/// entry points (where recording of a traced thread pauses).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RegionOn {
    pub resume_pc: u64,
    pub nentries: u32,
    pub pad: u32,
    pub entry: [u64; ITR_MAX_ENTRIES],
}

const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | ((b'i' as u64) << 8) | nr
}
pub const ITR_IOC_STATUS: u64 = ioc(2, 1, std::mem::size_of::<Status>());
pub const ITR_IOC_INSTALL: u64 = ioc(1, 2, std::mem::size_of::<Config>());
pub const ITR_IOC_REMOVE: u64 = ioc(0, 3, 0);
pub const ITR_IOC_ENABLE: u64 = ioc(1, 4, std::mem::size_of::<TargetArg>());
pub const ITR_IOC_ON: u64 = ioc(1, 5, std::mem::size_of::<RegionOn>());
pub const ITR_IOC_OFF: u64 = ioc(0, 6, 0);
pub const ITR_IOC_STOP: u64 = ioc(0, 7, 0);
pub const ITR_IOC_CONSUME: u64 = ioc(1, 8, std::mem::size_of::<Consume>());
