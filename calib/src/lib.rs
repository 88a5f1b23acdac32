//! Calibration of the hookit profiler: its event logs, the per-sequence minima (PI's JProf
//! calibration, trained and saved), the true per-interval counts from an instruction trace of
//! the same run, and the reports (log-rt, log-gen, the validation table).

pub mod events;
pub mod model;
pub mod report;
pub mod truth;

/// What can go wrong in calibration.
#[derive(Debug, thiserror::Error)]
pub enum CalibError {
    #[error("{0}")]
    Bad(String),
    #[error(transparent)]
    Post(#[from] itrace_post::PostError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

pub(crate) fn bad<T>(msg: impl Into<String>) -> Result<T, CalibError> {
    Err(CalibError::Bad(msg.into()))
}
