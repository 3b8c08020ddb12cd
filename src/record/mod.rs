//! Run records: the versioned schema every module fills, environment capture, secret
//! redaction, the atomic store under the runs directory, list/show/compare, exports that
//! never replace a file, and perf rows, the measured figures appended to `docs/perf/*.json`.

pub mod cli;
pub mod compare;
pub mod env;
pub mod export;
pub mod migrate;
pub mod perfrows;
pub mod redact;
pub mod schema;
pub mod stats;
pub mod store;

pub use schema::{RunId, RunRecord, RunStatus, Stats};
pub use store::{RunHandle, RunStore};

use crate::vocab::TargetKind;
use std::path::PathBuf;

/// A new `running` record with this host's facts, the mxtune commit and the git state of
/// the given source trees (name, path) captured now. GPU facts are the monitor's to add.
pub fn begin(
    kind: TargetKind,
    preset: Option<String>,
    source_repos: &[(String, PathBuf)],
) -> RunRecord {
    let mut r = RunRecord::new(kind, preset);
    r.identity.mxtune_git_sha = env::mxtune_git_sha();
    r.environment.host = env::capture_host();
    r.environment.source_repos = source_repos
        .iter()
        .map(|(name, path)| env::capture_source_repo(name, path))
        .collect();
    r
}
