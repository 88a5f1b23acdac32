//! The part of QEMU 7.2's C plugin API (`include/qemu/qemu-plugin.h`, API
//! version 1) that the plugin uses, declared by hand: Debian ships no header.
//! The functions are exported by the qemu-user executable that loads us.

use std::ffi::{c_char, c_int, c_uint, c_void};

/// The plugin API version this plugin is written against (QEMU 7.2's `QEMU_PLUGIN_VERSION`).
pub const API_VERSION: c_int = 1;

pub type PluginId = u64;

/// `qemu_info_t`.
#[repr(C)]
pub struct QemuInfo {
    pub target_name: *const c_char,
    pub version_min: c_int,
    pub version_cur: c_int,
    pub system_emulation: bool,
    /// The `system` union member (smp_vcpus, max_vcpus); unused in user mode.
    pub system: [c_int; 2],
}

/// `struct qemu_plugin_tb` (opaque).
#[repr(C)]
pub struct Tb {
    _opaque: [u8; 0],
}

/// `struct qemu_plugin_insn` (opaque).
#[repr(C)]
pub struct Insn {
    _opaque: [u8; 0],
}

/// `QEMU_PLUGIN_CB_NO_REGS`.
pub const CB_NO_REGS: c_int = 0;

pub type TbTransCb = extern "C" fn(id: PluginId, tb: *mut Tb);
pub type VcpuUdataCb = extern "C" fn(vcpu_index: c_uint, udata: *mut c_void);
pub type UdataCb = extern "C" fn(id: PluginId, udata: *mut c_void);
pub type SimpleCb = extern "C" fn(id: PluginId);
pub type SyscallCb = extern "C" fn(
    id: PluginId,
    vcpu_index: c_uint,
    num: i64,
    a1: u64,
    a2: u64,
    a3: u64,
    a4: u64,
    a5: u64,
    a6: u64,
    a7: u64,
    a8: u64,
);
pub type SyscallRetCb = extern "C" fn(id: PluginId, vcpu_index: c_uint, num: i64, ret: i64);

extern "C" {
    pub fn qemu_plugin_register_vcpu_tb_trans_cb(id: PluginId, cb: TbTransCb);
    pub fn qemu_plugin_register_vcpu_tb_exec_cb(tb: *mut Tb, cb: VcpuUdataCb, flags: c_int, udata: *mut c_void);
    pub fn qemu_plugin_register_vcpu_syscall_cb(id: PluginId, cb: SyscallCb);
    pub fn qemu_plugin_register_vcpu_syscall_ret_cb(id: PluginId, cb: SyscallRetCb);
    pub fn qemu_plugin_register_atexit_cb(id: PluginId, cb: UdataCb, udata: *mut c_void);
    /// Unregisters all of the plugin's callbacks and calls `cb` once no vCPU runs any (from a
    /// vCPU thread: qemu flushes its translations in an exclusive section first).
    pub fn qemu_plugin_reset(id: PluginId, cb: SimpleCb);
    pub fn qemu_plugin_tb_n_insns(tb: *const Tb) -> usize;
    pub fn qemu_plugin_tb_vaddr(tb: *const Tb) -> u64;
    pub fn qemu_plugin_tb_get_insn(tb: *const Tb, idx: usize) -> *mut Insn;
    pub fn qemu_plugin_insn_data(insn: *const Insn) -> *const c_void;
    pub fn qemu_plugin_insn_size(insn: *const Insn) -> usize;
    pub fn qemu_plugin_insn_vaddr(insn: *const Insn) -> u64;
    pub fn qemu_plugin_path_to_binary() -> *const c_char;
    pub fn qemu_plugin_start_code() -> u64;
}
