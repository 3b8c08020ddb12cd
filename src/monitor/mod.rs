//! Live monitor: NVML GPU telemetry, host stats and the target's own `/metrics`, merged into
//! one stream of `Sample`s for the TUI, the headless commands and the run record.
//!
//! One collector thread (`collector`) owns the readers — `nvml` (GPU), `host` (sysinfo) and
//! `prom` (Prometheus scrape) — samples at 1–20 Hz and sends each sample on a channel.
//! `ring` keeps bounded chart history; `summary` folds samples into the run summary, and
//! `record` turns that (and a sample's GPU facts) into the run record's sections.

pub mod cli;
pub mod collector;
pub mod host;
pub mod memory;
pub mod nvml;
pub mod prom;
pub mod reading;
pub mod record;
pub mod ring;
pub mod sample;
pub mod summary;

pub use collector::{Monitor, MonitorConfig, clamp_rate, sample_once};
pub use reading::Reading;
pub use sample::Sample;
pub use summary::Summary;
