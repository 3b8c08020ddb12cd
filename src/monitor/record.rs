//! What the monitor contributes to a run record: the GPU facts of the environment and the
//! resources section.

use super::reading::Reading;
use super::sample::{GpuStatus, MemorySource, Sample};
use super::summary::Summary;
use crate::record::schema::{Environment, GpuFacts, Resources, SeriesPoint, ThrottleSeen};
use std::collections::BTreeMap;

/// Fills `environment.gpus` (or `gpu_error`) from one sample, e.g. from `sample_once`.
pub fn fill_environment(environment: &mut Environment, sample: &Sample) {
    match &sample.gpu {
        GpuStatus::Unavailable { reason } => {
            environment.gpus.clear();
            environment.gpu_error = Some(reason.clone());
        }
        GpuStatus::Available {
            driver_version,
            cuda_driver_version,
            gpus,
        } => {
            environment.gpus = gpus
                .iter()
                .map(|g| GpuFacts {
                    index: g.index,
                    name: g.name.value().cloned(),
                    uuid: g.uuid.value().cloned(),
                    driver_version: driver_version.value().cloned(),
                    cuda_version: cuda_driver_version.value().cloned(),
                    compute_capability: g.compute_capability.value().cloned(),
                    // Unified memory has no dedicated capacity; MemTotal is the host's.
                    memory_total_bytes: match g.memory.source {
                        MemorySource::Device => g.memory.total_bytes.get(),
                        MemorySource::Unified => None,
                    },
                    sm_clock_mhz: g.clocks.sm_mhz.get(),
                    sm_clock_max_mhz: g.max_clocks.sm_mhz.get(),
                    mem_clock_mhz: g.clocks.mem_mhz.get(),
                    mem_clock_max_mhz: g.max_clocks.mem_mhz.get(),
                    power_limit_w: g.power_limit_w.get(),
                    persistence_mode: g.persistence_mode.get(),
                    compute_mode: g.compute_mode.value().cloned(),
                })
                .collect();
            environment.gpu_error = gpu_errors(sample);
        }
    }
}

/// Names the fact queries that failed (not those answering n/a), so a partial entry says why.
fn gpu_errors(sample: &Sample) -> Option<String> {
    let GpuStatus::Available { gpus, .. } = &sample.gpu else {
        return None;
    };
    let mut errors = Vec::new();
    for g in gpus {
        let checks: [(&str, Option<&String>); 3] = [
            ("name", err(&g.name)),
            ("uuid", err(&g.uuid)),
            ("memory", err(&g.memory.total_bytes)),
        ];
        for (what, e) in checks {
            if let Some(e) = e {
                errors.push(format!("GPU {} {what}: {e}", g.index));
            }
        }
    }
    (!errors.is_empty()).then(|| errors.join("; "))
}

fn err<T>(r: &Reading<T>) -> Option<&String> {
    match r {
        Reading::Error(e) => Some(e),
        _ => None,
    }
}

/// Turns the run summary into the record's resources section. With several GPUs, peaks and
/// extremes are over all GPUs, SM clock mean is over all readings, and power is the sum of
/// the GPUs' mean draws (the node's GPU power).
pub fn resources(summary: &Summary) -> Resources {
    let gpus = &summary.gpus;
    let sm_count: u64 = gpus.iter().map(|g| g.sm_clock_mhz.count).sum();
    let sm_mean = (sm_count > 0).then(|| {
        gpus.iter()
            .filter_map(|g| g.sm_clock_mhz.mean.map(|m| m * g.sm_clock_mhz.count as f64))
            .sum::<f64>()
            / sm_count as f64
    });
    let power_means: Vec<f64> = gpus.iter().filter_map(|g| g.power_w.mean).collect();
    let mut throttle: BTreeMap<String, ThrottleSeen> = BTreeMap::new();
    for g in gpus {
        for (reason, seen) in &g.throttle_reasons {
            throttle
                .entry(reason.clone())
                .and_modify(|t| {
                    t.first_seen = t.first_seen.min(seen.first_at);
                    t.last_seen = t.last_seen.max(seen.last_at);
                    t.samples += seen.samples;
                })
                .or_insert(ThrottleSeen {
                    reason: reason.clone(),
                    first_seen: seen.first_at,
                    last_seen: seen.last_at,
                    samples: seen.samples,
                });
        }
    }
    let source = gpus.iter().find_map(|g| g.memory_source);
    let mut r = Resources {
        samples: summary.samples,
        rate_hz: summary.rate_hz,
        gpu_memory_peak_bytes: gpus.iter().filter_map(|g| g.peak_memory_bytes).max(),
        gpu_memory_source: source.map(|s| {
            match s {
                MemorySource::Device => "device",
                MemorySource::Unified => "unified",
            }
            .to_string()
        }),
        sm_clock_min_mhz: gpus
            .iter()
            .filter_map(|g| g.sm_clock_mhz.min)
            .reduce(f64::min),
        sm_clock_mean_mhz: sm_mean,
        power_mean_w: (!power_means.is_empty()).then(|| power_means.iter().sum()),
        temp_max_c: gpus
            .iter()
            .filter_map(|g| g.temperature_c.max)
            .reduce(f64::max),
        throttle: throttle.into_values().collect(),
        host_cpu_mean_pct: summary.host_cpu_pct.mean,
        host_cpu_max_pct: summary.host_cpu_pct.max,
        target_rss_peak_bytes: summary.process_peak_rss_bytes,
        server_preemptions: summary.server_preemptions,
        series: Vec::new(),
    };
    r.set_series(
        summary
            .series
            .iter()
            .map(|p| SeriesPoint {
                t_s: p.elapsed_s,
                gpu_mem_bytes: p.gpu_mem_used_bytes,
                sm_clock_mhz: p.sm_mhz,
                power_w: p.power_w,
                temp_c: p.temperature_c,
                gpu_util_pct: p.gpu_util_pct,
                host_cpu_pct: p.cpu_pct,
                target_rss_bytes: p.process_rss_bytes,
                gen_tps: p.generation_tok_s,
            })
            .collect(),
    );
    r
}
