//! Run records: the versioned schema every module fills, environment capture, the atomic
//! store under the runs directory, and list/show/compare.

pub mod schema;
pub mod stats;

pub use schema::{RunId, RunRecord, RunStatus, Stats};
