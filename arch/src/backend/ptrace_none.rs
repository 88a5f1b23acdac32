//! No native recorder on this architecture (s390x: single-step under QEMU's PER emulation did
//! not stop at every instruction, so a ptrace stepper could not be checked there). Programs
//! are traced from outside: `--qemu ARCH` (the GDB stub) or `--backend qemu` (the TCG plugin).
//! [`super::choose`] refuses native settings before a recorder would be built.

use super::{BackendError, Native, Recorded, Recorder, TriggerResolver};
use itrace_format::LiveCounts;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Errors of a native recording: none here, as nothing is recorded natively.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {}

/// Stands in for the ptrace recorder of the architectures that have one.
pub struct PtraceRecorder;

impl PtraceRecorder {
    pub fn new(_native: Native, _resolver: Arc<dyn TriggerResolver + Send + Sync>) -> Self {
        PtraceRecorder
    }
}

impl Recorder for PtraceRecorder {
    fn record(&mut self, _live: Arc<LiveCounts>, _stop: &AtomicBool) -> Result<Recorded, BackendError> {
        Err(BackendError::Settings(
            "no native recorder on this architecture: trace with --qemu ARCH or --backend qemu".into(),
        ))
    }
}
