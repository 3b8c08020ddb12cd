//! Launching targets: the Docker vLLM container, the bundled engine, or an attached URL.
//!
//! Every target is driven the same way: it produces log lines and (maybe) an exit, and one
//! follower task (`follow.rs`) turns those into [`LaunchEvent`]s — phases from log patterns,
//! readiness from HTTP probes, failures from fatal patterns or the exit, and the kernel-path
//! verdict once the target is ready. The TUI and the headless CLI consume the same events.

pub mod attach;
pub mod cli;
pub mod cluster;
pub mod dialect;
pub mod docker;
pub mod engine;
pub mod follow;
pub mod logbuf;
pub mod preflight;
pub mod ready;
pub mod record;
pub mod rules;
pub mod state;
pub mod target;
pub mod verdict;

pub use follow::{
    DEFAULT_ATTACH_LIMIT, DEFAULT_QUIET_WARNING, DEFAULT_STARTUP_LIMIT, Launch, LaunchOptions,
    Status, fired_by_startup_limit,
};
pub use rules::LogRules;
pub use target::Target;
pub use verdict::{ValidationReport, Verdict};

use crate::vocab::ProbeAnswer;
use serde::{Deserialize, Serialize};

/// Start-up phase of a target, in the order phases normally happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Creating the container or spawning the process.
    Starting,
    /// Pulling the image.
    Pulling,
    /// Reading the checkpoint.
    LoadingWeights,
    /// Compiling kernels at run time (FlashInfer, torch.compile, NVRTC).
    JitCompiling,
    /// Capturing CUDA graphs.
    CapturingGraphs,
    /// The HTTP server is coming up.
    StartingServer,
    /// Readiness probes passed.
    Ready,
    /// Stopping on request.
    Stopping,
    /// The target is gone.
    Exited,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Phase::Starting => "starting",
            Phase::Pulling => "pulling image",
            Phase::LoadingWeights => "loading weights",
            Phase::JitCompiling => "JIT compiling",
            Phase::CapturingGraphs => "capturing CUDA graphs",
            Phase::StartingServer => "starting server",
            Phase::Ready => "ready",
            Phase::Stopping => "stopping",
            Phase::Exited => "exited",
        };
        f.write_str(s)
    }
}

/// Which output stream a log line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
    /// Both streams go through one file or TTY and cannot be told apart.
    Combined,
}

/// How a target ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    /// Exit status, when the target exited normally.
    pub code: Option<i64>,
    /// Signal that ended a child process.
    pub signal: Option<i32>,
    /// Docker reports the container was killed by the OOM killer.
    pub oom_killed: bool,
    /// Anything the runtime said about the exit (e.g. Docker's state error).
    pub detail: Option<String>,
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "exit code {c}")?,
            (None, Some(s)) => write!(f, "killed by signal {s}")?,
            (None, None) => write!(f, "exit status unknown")?,
        }
        if self.oom_killed {
            write!(f, " (OOM-killed)")?;
        }
        if let Some(d) = &self.detail {
            write!(f, " ({d})")?;
        }
        Ok(())
    }
}

/// Something that happened to a launched target; the TUI and the CLI consume these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LaunchEvent {
    /// One log line from the target.
    Log {
        /// Stream the line came from.
        stream: LogStream,
        /// The line without its trailing newline.
        line: String,
    },
    /// Image pull progress (Docker).
    PullProgress {
        /// Docker's status text, e.g. `Downloading 12MB/1.2GB`.
        status: String,
    },
    /// The start-up phase moved on.
    Phase {
        /// The new phase.
        phase: Phase,
    },
    /// A readiness probe did not prove readiness: the server's answer or why there was none.
    /// Sent for every probe, so a start that is stuck shows why while it is stuck.
    Probe {
        /// What the probe got back.
        answer: ProbeAnswer,
    },
    /// Readiness probes passed.
    Ready {
        /// Base URL of the OpenAI API.
        url: String,
        /// Seconds from start to ready.
        startup_s: f64,
    },
    /// Kernel-path verdict, evaluated once ready.
    Verdict {
        /// The report.
        report: ValidationReport,
    },
    /// Something the operator should know that does not stop the target.
    Warning {
        /// What happened and what to do.
        message: String,
    },
    /// The target failed (fatal log line, exit before ready, start-up limit).
    Failed {
        /// What happened, with the last log lines.
        message: String,
    },
    /// The target is gone.
    Exited {
        /// How it ended.
        exit: ExitInfo,
    },
}
