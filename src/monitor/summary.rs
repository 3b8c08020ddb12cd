//! The run summary that goes into the run record: what the hardware did during the run.
//!
//! A benchmark taken while the GPU throttled is not comparable, so the summary keeps every
//! clock-event reason seen, with when it was first and last seen.

use super::reading::Reading;
use super::ring::ChartPoint;
use super::sample::{GpuStatus, MemorySource, Sample, ServerStatus};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::BTreeMap;

/// Running min / mean / max of one figure.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Stat {
    /// Samples that had a value.
    pub count: u64,
    /// Smallest value seen.
    pub min: Option<f64>,
    /// Largest value seen.
    pub max: Option<f64>,
    /// Mean of the values seen.
    pub mean: Option<f64>,
    #[serde(skip)]
    sum: f64,
}

impl Stat {
    /// Folds in one value (`None` = the sample had no reading).
    pub fn add(&mut self, v: Option<f64>) {
        let Some(v) = v.filter(|v| v.is_finite()) else {
            return;
        };
        self.count += 1;
        self.sum += v;
        self.min = Some(self.min.map_or(v, |m| m.min(v)));
        self.max = Some(self.max.map_or(v, |m| m.max(v)));
        self.mean = Some(self.sum / self.count as f64);
    }
}

/// When a clock-event (throttle) reason was active.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReasonSeen {
    /// First sample showing it.
    pub first_at: DateTime<Utc>,
    /// Seconds into the run at the first sample.
    pub first_elapsed_s: f64,
    /// Last sample showing it.
    pub last_at: DateTime<Utc>,
    /// Seconds into the run at the last sample.
    pub last_elapsed_s: f64,
    /// Samples showing it.
    pub samples: u64,
}

/// One GPU over the run.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct GpuSummary {
    /// NVML index.
    pub index: u32,
    /// Product name, from the last sample that had it.
    pub name: Option<String>,
    /// UUID, from the last sample that had it.
    pub uuid: Option<String>,
    /// Where memory figures came from (`unified` on GB10).
    pub memory_source: Option<MemorySource>,
    /// Highest memory in use, bytes.
    pub peak_memory_bytes: Option<u64>,
    /// Memory capacity, bytes.
    pub memory_total_bytes: Option<u64>,
    /// SM clock, MHz (min and mean are what matter).
    pub sm_clock_mhz: Stat,
    /// Power draw, W.
    pub power_w: Stat,
    /// Temperature, °C (max is what matters).
    pub temperature_c: Stat,
    /// GPU utilisation, percent.
    pub utilization_pct: Stat,
    /// Clock-event reasons seen, by NVML name.
    pub throttle_reasons: BTreeMap<String, ReasonSeen>,
}

/// Most points the run series keeps; halved (every other point dropped) when reached, so
/// a 24-hour run costs the same memory as a 6-minute one.
pub const SERIES_CAPACITY: usize = 1440;

/// The whole run, as the run record stores it.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Summary {
    /// Samples folded in.
    pub samples: u64,
    /// Sample rate the collector ran at, Hz.
    pub rate_hz: Option<f64>,
    /// First sample's time.
    pub started_at: Option<DateTime<Utc>>,
    /// Last sample's time.
    pub ended_at: Option<DateTime<Utc>>,
    /// Why there were no GPU figures, if NVML was unavailable.
    pub gpu_unavailable: Option<String>,
    /// Per GPU, by NVML index.
    pub gpus: Vec<GpuSummary>,
    /// Host CPU, percent.
    pub host_cpu_pct: Stat,
    /// Highest host RAM in use, bytes.
    pub host_peak_ram_bytes: Option<u64>,
    /// Highest RSS of the watched process, bytes.
    pub process_peak_rss_bytes: Option<u64>,
    /// Server-side generation tok/s.
    pub generation_tok_s: Stat,
    /// Server-side prompt tok/s.
    pub prompt_tok_s: Stat,
    /// Requests the server pre-empted while it was watched (`None`: not exported).
    pub server_preemptions: Option<u64>,
    /// Samples the consumer did not take in time (dropped from the channel, not from here).
    pub dropped_samples: u64,
    /// The run's chart points, evenly thinned to at most `SERIES_CAPACITY`.
    pub series: Vec<ChartPoint>,
    /// One series point is kept every `series_stride` samples.
    #[serde(skip)]
    series_stride: u64,
}

fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

impl Summary {
    /// An empty summary for a collector sampling at `rate_hz`.
    pub fn new(rate_hz: Option<f64>) -> Self {
        Summary {
            rate_hz,
            series_stride: 1,
            ..Summary::default()
        }
    }

    /// Folds in one sample.
    pub fn add(&mut self, s: &Sample) {
        self.series_stride = self.series_stride.max(1);
        if self.samples.is_multiple_of(self.series_stride) {
            self.series.push(ChartPoint::from_sample(s));
            if self.series.len() >= SERIES_CAPACITY {
                let mut i = 0;
                self.series.retain(|_| {
                    i += 1;
                    i % 2 == 1
                });
                self.series_stride *= 2;
            }
        }
        self.samples += 1;
        self.started_at.get_or_insert(s.at);
        self.ended_at = Some(s.at);
        match &s.gpu {
            GpuStatus::Unavailable { reason } => self.gpu_unavailable = Some(reason.clone()),
            GpuStatus::Available { gpus, .. } => {
                for g in gpus {
                    let pos = match self.gpus.iter().position(|x| x.index == g.index) {
                        Some(p) => p,
                        None => {
                            self.gpus.push(GpuSummary {
                                index: g.index,
                                ..GpuSummary::default()
                            });
                            self.gpus.len() - 1
                        }
                    };
                    let e = &mut self.gpus[pos];
                    if let Some(n) = g.name.value() {
                        e.name = Some(n.clone());
                    }
                    if let Some(u) = g.uuid.value() {
                        e.uuid = Some(u.clone());
                    }
                    e.memory_source = Some(g.memory.source);
                    e.peak_memory_bytes = max_opt(e.peak_memory_bytes, g.memory.used_bytes.get());
                    e.memory_total_bytes = g.memory.total_bytes.get().or(e.memory_total_bytes);
                    e.sm_clock_mhz.add(g.clocks.sm_mhz.get().map(f64::from));
                    e.power_w.add(g.power_w.get());
                    e.temperature_c.add(g.temperature_c.get().map(f64::from));
                    e.utilization_pct
                        .add(g.utilization_gpu_pct.get().map(f64::from));
                    for reason in g.throttle_reasons.value().into_iter().flatten() {
                        e.throttle_reasons
                            .entry(reason.clone())
                            .and_modify(|r| {
                                r.last_at = s.at;
                                r.last_elapsed_s = s.elapsed_s;
                                r.samples += 1;
                            })
                            .or_insert(ReasonSeen {
                                first_at: s.at,
                                first_elapsed_s: s.elapsed_s,
                                last_at: s.at,
                                last_elapsed_s: s.elapsed_s,
                                samples: 1,
                            });
                    }
                }
            }
        }
        self.host_cpu_pct.add(s.host.cpu_pct.get().map(f64::from));
        self.host_peak_ram_bytes = max_opt(self.host_peak_ram_bytes, Some(s.host.ram_used_bytes));
        if let Some(p) = &s.host.process {
            self.process_peak_rss_bytes = max_opt(self.process_peak_rss_bytes, p.rss_bytes.get());
        }
        if let ServerStatus::Scraped(m) = &s.server {
            self.generation_tok_s.add(m.generation_tok_s.get());
            self.prompt_tok_s.add(m.prompt_tok_s.get());
            // A count since the monitor started: the latest is the run's.
            let seen = m.preemptions.as_ref().and_then(Reading::get);
            self.server_preemptions = max_opt(self.server_preemptions, seen.map(|n| n as u64));
        }
    }
}
