//! Progress of the matrix and A/B runners as events. The runners never print: they emit
//! [`MatrixEvent`]s through a [`Progress`] sink. `mxtune matrix` and `mxtune ab` print them
//! ([`print_cli`]); the panel turns them into screen state.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use super::ab::Ratio;
use super::state::{LevelOutcome, PresetStatus};
use crate::record::schema::WorkloadPoint;

/// Something the matrix or A/B runner did.
#[derive(Debug, Clone, PartialEq)]
pub enum MatrixEvent {
    /// The matrix starts (or resumes).
    Planned {
        /// Matrix id.
        matrix_id: String,
        /// Presets in run order.
        order: Vec<String>,
        /// Shuffle seed; `None` = the given order.
        seed: Option<u64>,
        /// The state file (resume reads it).
        state: PathBuf,
    },
    /// A preset starts (launch, then its levels).
    PresetStarted {
        /// Preset name.
        name: String,
        /// Its place in the run order, 0-based.
        index: usize,
        /// Presets in the order.
        total: usize,
    },
    /// The preset's target entered a launch phase.
    TargetPhase {
        /// Preset name.
        preset: String,
        /// The phase, as the launch module names it.
        phase: String,
    },
    /// The preset's target warned.
    TargetWarning {
        /// Preset name.
        preset: String,
        /// The warning.
        message: String,
    },
    /// The preset's target failed.
    TargetFailed {
        /// Preset name.
        preset: String,
        /// Why.
        message: String,
    },
    /// The target is ready (L1 passed).
    Ready {
        /// Preset name.
        preset: String,
        /// Seconds from launch to ready.
        startup_s: f64,
    },
    /// Waiting for the GPU to cool down before a measured point.
    CoolDown {
        /// The hosts.toml host whose GPU it is; `None`: this machine's.
        host: Option<String>,
        /// GPU temperature now, °C.
        celsius: f64,
        /// Threshold, °C.
        threshold: f64,
    },
    /// An L4 point starts.
    PointStarted {
        /// Preset name.
        preset: String,
        /// Index in the grid, 0-based.
        index: usize,
        /// Points in the grid.
        total: usize,
        /// The point.
        point: WorkloadPoint,
    },
    /// An L4 point was measured.
    PointDone {
        /// Preset name.
        preset: String,
        /// The point.
        point: WorkloadPoint,
        /// Its generation tokens/s (mean), when measured.
        tg_tps: Option<f64>,
    },
    /// A preset finished (or was interrupted) with its verdicts and record.
    PresetFinished {
        /// Preset name.
        name: String,
        /// Done, failed or interrupted.
        status: PresetStatus,
        /// The run record.
        record: Option<PathBuf>,
        /// Level verdicts.
        levels: Vec<LevelOutcome>,
    },
    /// The matrix report was written.
    ReportWritten(PathBuf),
    /// An A/B round starts.
    AbRound {
        /// Round, 1-based.
        round: u32,
        /// Rounds asked for.
        rounds: u32,
    },
    /// The A/B ratios after a round.
    AbRatios {
        /// Rounds with both A and B measured.
        valid_rounds: usize,
        /// B/A per point and metric so far.
        ratios: Vec<Ratio>,
    },
    /// A problem that did not stop the run.
    Warning(String),
}

/// Where a runner's events go. Cloning shares the sink; the default drops them.
#[derive(Clone, Default)]
pub struct Progress(Option<Arc<dyn Fn(MatrixEvent) + Send + Sync>>);

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Progress(sink)"
        } else {
            "Progress(none)"
        })
    }
}

impl Progress {
    /// Events go to `f`.
    pub fn new(f: impl Fn(MatrixEvent) + Send + Sync + 'static) -> Self {
        Progress(Some(Arc::new(f)))
    }

    /// The headless commands' sink: [`print_cli`].
    pub fn cli() -> Self {
        Progress::new(|e| print_cli(&e))
    }

    /// Send one event.
    pub fn emit(&self, e: MatrixEvent) {
        if let Some(f) = &self.0 {
            f(e);
        }
    }
}

/// What `mxtune matrix` and `mxtune ab` print for an event (progress on stderr, the report
/// path on stdout); events they never printed print nothing.
pub fn print_cli(e: &MatrixEvent) {
    match e {
        MatrixEvent::Planned {
            matrix_id,
            order,
            seed,
            state,
        } => crate::errln!(
            "matrix {matrix_id}: {} ({}); state {}",
            order.join(" → "),
            match seed {
                Some(s) => format!("shuffled with seed {s}"),
                None => "given order".into(),
            },
            state.display()
        ),
        MatrixEvent::PresetStarted { name, index, total } => {
            crate::errln!("preset {name} ({} of {total})", index + 1)
        }
        MatrixEvent::TargetPhase { preset, phase } => crate::errln!("  [{preset}] phase: {phase}"),
        MatrixEvent::TargetWarning { preset, message } => {
            crate::errln!("  [{preset}] warning: {message}")
        }
        MatrixEvent::TargetFailed { preset, message } => {
            crate::errln!("  [{preset}] failed: {message}")
        }
        MatrixEvent::CoolDown {
            host,
            celsius,
            threshold,
        } => crate::errln!(
            "  cool-down: GPU{} at {celsius:.0} °C, waiting for < {threshold:.0} °C",
            host.as_ref()
                .map(|h| format!(" of host {h}"))
                .unwrap_or_default()
        ),
        MatrixEvent::PresetFinished { levels, .. } => {
            for l in levels {
                crate::errln!(
                    "  {}: {} — {}",
                    l.level.title(),
                    l.verdict,
                    l.detail.lines().next().unwrap_or("")
                );
            }
        }
        MatrixEvent::ReportWritten(p) => crate::outln!("report: {}", p.display()),
        MatrixEvent::AbRound { round, rounds } => crate::errln!("round {round} of {rounds}"),
        MatrixEvent::Warning(m) => crate::errln!("mxtune: warning: {m}"),
        MatrixEvent::Ready { .. }
        | MatrixEvent::PointStarted { .. }
        | MatrixEvent::PointDone { .. }
        | MatrixEvent::AbRatios { .. } => {}
    }
}
