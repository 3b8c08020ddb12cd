//! GPU telemetry through NVML (nvml-wrapper).
//!
//! NVML is initialised once by the collector thread that owns `GpuReader`; its calls can
//! block for milliseconds, which is why they never run on the UI task. Every query is read
//! on its own: NOT_SUPPORTED becomes `n/a`, any other failure becomes an error reading, and
//! neither stops the queries after it.

use super::memory::{DeviceMemory, choose_memory, read_meminfo};
use super::reading::Reading;
use super::sample::{Clocks, GpuMemory, GpuProcess, GpuSample, GpuStatus, MemorySource};
use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Clock, PerformanceState, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Turns an NVML answer into a reading: NOT_SUPPORTED is `n/a`, never zero.
pub fn reading<T>(r: Result<T, NvmlError>) -> Reading<T> {
    match r {
        Ok(v) => Reading::Value(v),
        Err(NvmlError::NotSupported) => Reading::NotSupported,
        Err(e) => Reading::Error(e.to_string()),
    }
}

/// Explains why NVML could not start, in the operator's words.
pub fn unavailable_reason(err: &NvmlError) -> String {
    match err {
        NvmlError::LibloadingError(e) => {
            let detail = e.to_string();
            if detail.contains("cannot open shared object file") {
                format!("NVML not available: libnvidia-ml.so.1 not found ({detail})")
            } else {
                format!("NVML not available: loading libnvidia-ml.so.1 failed: {detail}")
            }
        }
        NvmlError::DriverNotLoaded => {
            "NVML not available: the NVIDIA kernel driver is not loaded".to_string()
        }
        NvmlError::NoPermission => {
            "NVML not available: no permission to talk to the NVIDIA driver".to_string()
        }
        other => format!("NVML not available: {other}"),
    }
}

/// Most NVML queries cost microseconds, but some are driver round trips of milliseconds
/// (measured on an H200, driver 580: total energy ~4 ms, each maximum clock ~1.6 ms of CPU);
/// reading all of them every sample cost 3.7 % of a core at 4 Hz. Power is a ~1 s average
/// in NVML anyway, and temperature, P-state and throttle reasons move on that scale too.
pub const SLOW_REFRESH: Duration = Duration::from_secs(1);
/// The process list changes when processes start or stop; two seconds is soon enough.
pub const PROCESS_REFRESH: Duration = Duration::from_secs(2);
/// Facts that change only by an administrator's hand: name, UUID, compute capability,
/// persistence and compute mode, maximum clocks, power limit, driver versions.
pub const STATIC_REFRESH: Duration = Duration::from_secs(30);

/// The last readings of one GPU and when each group was read.
struct Cached {
    sample: GpuSample,
    slow_at: Instant,
    processes_at: Instant,
    static_at: Instant,
}

/// Owns the NVML handle (or the reason there is none) for the collector thread.
///
/// Every sample re-reads the fast figures (SM clock, utilisation, memory); the other groups
/// are re-read on their own period and carried forward between reads.
pub struct GpuReader {
    nvml: Result<Nvml, String>,
    versions: Option<(Reading<String>, Reading<String>, Instant)>,
    cache: Vec<Option<Cached>>,
}

impl GpuReader {
    /// Initialises NVML once; failure is kept as the reason shown in every sample.
    pub fn new() -> Self {
        GpuReader {
            nvml: Nvml::init().map_err(|e| unavailable_reason(&e)),
            versions: None,
            cache: Vec::new(),
        }
    }

    /// Reads every GPU.
    pub fn read(&mut self) -> GpuStatus {
        let nvml = match &self.nvml {
            Ok(n) => n,
            Err(reason) => {
                return GpuStatus::Unavailable {
                    reason: reason.clone(),
                };
            }
        };
        let now = Instant::now();
        let (driver_version, cuda_driver_version) = match &self.versions {
            Some((d, c, at)) if now.duration_since(*at) < STATIC_REFRESH => (d.clone(), c.clone()),
            _ => {
                let d = reading(nvml.sys_driver_version());
                let c = reading(nvml.sys_cuda_driver_version()).map(|v| {
                    format!(
                        "{}.{}",
                        nvml_wrapper::cuda_driver_version_major(v),
                        nvml_wrapper::cuda_driver_version_minor(v)
                    )
                });
                self.versions = Some((d.clone(), c.clone(), now));
                (d, c)
            }
        };
        let count = match nvml.device_count() {
            Ok(n) => n,
            Err(e) => {
                return GpuStatus::Unavailable {
                    reason: format!("NVML initialised but could not count GPUs: {e}"),
                };
            }
        };
        self.cache.resize_with(count as usize, || None);
        let mut gpus = Vec::with_capacity(count as usize);
        for (index, slot) in (0..count).zip(self.cache.iter_mut()) {
            match nvml.device_by_index(index) {
                Ok(device) => {
                    let c = read_device(index, &device, slot.take(), now);
                    gpus.push(c.sample.clone());
                    *slot = Some(c);
                }
                Err(e) => {
                    *slot = None;
                    gpus.push(failed_device(index, &e));
                }
            }
        }
        GpuStatus::Available {
            driver_version,
            cuda_driver_version,
            gpus,
        }
    }
}

impl Default for GpuReader {
    fn default() -> Self {
        Self::new()
    }
}

fn read_device(index: u32, d: &Device<'_>, prev: Option<Cached>, now: Instant) -> Cached {
    let mut c = prev.unwrap_or_else(|| {
        let mut sample = blank(index);
        read_static(d, &mut sample);
        read_slow(d, &mut sample);
        sample.processes = read_processes(d);
        Cached {
            sample,
            slow_at: now,
            processes_at: now,
            static_at: now,
        }
    });
    let due = |at: Instant, every: Duration| now.duration_since(at) >= every;
    if due(c.static_at, STATIC_REFRESH) {
        read_static(d, &mut c.sample);
        c.static_at = now;
    }
    if due(c.slow_at, SLOW_REFRESH) {
        read_slow(d, &mut c.sample);
        c.slow_at = now;
    }
    if due(c.processes_at, PROCESS_REFRESH) {
        c.sample.processes = read_processes(d);
        c.processes_at = now;
    }
    read_fast(d, &mut c.sample);
    c
}

/// Every sample: what moves within a second and what the charts show.
fn read_fast(d: &Device<'_>, s: &mut GpuSample) {
    let device_memory = reading(d.memory_info()).map(|m| DeviceMemory {
        used: m.used,
        total: m.total,
    });
    s.memory = choose_memory(device_memory, read_meminfo, &s.processes);
    s.clocks.sm_mhz = reading(d.clock_info(Clock::SM));
    let utilization = reading(d.utilization_rates());
    s.utilization_gpu_pct = utilization.clone().map(|u| u.gpu);
    s.utilization_mem_pct = utilization.map(|u| u.memory);
}

/// Every `SLOW_REFRESH`.
fn read_slow(d: &Device<'_>, s: &mut GpuSample) {
    s.clocks.graphics_mhz = reading(d.clock_info(Clock::Graphics));
    s.clocks.mem_mhz = reading(d.clock_info(Clock::Memory));
    s.power_w = reading(d.power_usage()).map(|mw| f64::from(mw) / 1000.0);
    s.energy_j = reading(d.total_energy_consumption()).map(|mj| mj as f64 / 1000.0);
    s.temperature_c = reading(d.temperature(TemperatureSensor::Gpu));
    s.pstate = reading(d.performance_state()).map(pstate_name);
    s.throttle_reasons = reading(d.current_throttle_reasons()).map(throttle_reason_names);
}

/// The throttle reasons NVML reports active, by their lower-case names (`sw_power_cap`,
/// `gpu_idle`, …), `none` left out.
pub fn throttle_reason_names(r: ThrottleReasons) -> Vec<String> {
    r.iter_names()
        .map(|(name, _)| name.to_ascii_lowercase())
        .filter(|n| n != "none")
        .collect()
}

/// Every `STATIC_REFRESH`.
fn read_static(d: &Device<'_>, s: &mut GpuSample) {
    s.name = reading(d.name());
    s.uuid = reading(d.uuid());
    s.compute_capability =
        reading(d.cuda_compute_capability()).map(|c| format!("{}.{}", c.major, c.minor));
    s.persistence_mode = reading(d.is_in_persistent_mode());
    s.compute_mode = reading(d.compute_mode()).map(|m| format!("{m:?}"));
    s.max_clocks = Clocks {
        sm_mhz: reading(d.max_clock_info(Clock::SM)),
        graphics_mhz: reading(d.max_clock_info(Clock::Graphics)),
        mem_mhz: reading(d.max_clock_info(Clock::Memory)),
    };
    s.power_limit_w = reading(d.enforced_power_limit()).map(|mw| f64::from(mw) / 1000.0);
}

/// A GPU whose handle could not be obtained: every reading carries that error.
fn failed_device(index: u32, e: &NvmlError) -> GpuSample {
    filled(
        index,
        Some(&format!("NVML could not open GPU {index}: {e}")),
    )
}

/// A sample not read yet; every query group then fills its part.
fn blank(index: u32) -> GpuSample {
    filled(index, None)
}

/// A sample whose every reading is the given error, or `n/a` without one.
fn filled(index: u32, error: Option<&str>) -> GpuSample {
    fn r<T>(error: Option<&str>) -> Reading<T> {
        error.map_or(Reading::NotSupported, |e| Reading::Error(e.to_string()))
    }
    let clocks = || Clocks {
        sm_mhz: r(error),
        graphics_mhz: r(error),
        mem_mhz: r(error),
    };
    GpuSample {
        index,
        name: r(error),
        uuid: r(error),
        compute_capability: r(error),
        persistence_mode: r(error),
        compute_mode: r(error),
        memory: GpuMemory {
            source: MemorySource::Device,
            used_bytes: r(error),
            total_bytes: r(error),
            process_bytes: r(error),
        },
        clocks: clocks(),
        max_clocks: clocks(),
        power_w: r(error),
        power_limit_w: r(error),
        energy_j: r(error),
        temperature_c: r(error),
        utilization_gpu_pct: r(error),
        utilization_mem_pct: r(error),
        pstate: r(error),
        throttle_reasons: r(error),
        processes: r(error),
    }
}

/// Compute and graphics processes, merged by pid (a process can be both).
fn read_processes(d: &Device<'_>) -> Reading<Vec<GpuProcess>> {
    let compute = reading(d.running_compute_processes());
    let graphics = reading(d.running_graphics_processes());
    let lists: Vec<Vec<ProcessInfo>> = match (compute, graphics) {
        (Reading::Value(c), Reading::Value(g)) => vec![c, g],
        (Reading::Value(c), _) => vec![c],
        (_, Reading::Value(g)) => vec![g],
        (Reading::Error(e), _) | (_, Reading::Error(e)) => return Reading::Error(e),
        (Reading::NotSupported, Reading::NotSupported) => return Reading::NotSupported,
    };
    let mut by_pid: BTreeMap<u32, Reading<u64>> = BTreeMap::new();
    for info in lists.into_iter().flatten() {
        let used = match info.used_gpu_memory {
            UsedGpuMemory::Used(b) => Reading::Value(b),
            UsedGpuMemory::Unavailable => Reading::NotSupported,
        };
        let entry = by_pid.entry(info.pid).or_insert(Reading::NotSupported);
        if let (Some(seen), Some(now)) = (entry.get(), used.get()) {
            *entry = Reading::Value(seen.max(now));
        } else if used.get().is_some() {
            *entry = used;
        }
    }
    Reading::Value(
        by_pid
            .into_iter()
            .map(|(pid, used_bytes)| GpuProcess { pid, used_bytes })
            .collect(),
    )
}

fn pstate_name(p: PerformanceState) -> String {
    let n = match p {
        PerformanceState::Zero => 0,
        PerformanceState::One => 1,
        PerformanceState::Two => 2,
        PerformanceState::Three => 3,
        PerformanceState::Four => 4,
        PerformanceState::Five => 5,
        PerformanceState::Six => 6,
        PerformanceState::Seven => 7,
        PerformanceState::Eight => 8,
        PerformanceState::Nine => 9,
        PerformanceState::Ten => 10,
        PerformanceState::Eleven => 11,
        PerformanceState::Twelve => 12,
        PerformanceState::Thirteen => 13,
        PerformanceState::Fourteen => 14,
        PerformanceState::Fifteen => 15,
        PerformanceState::Unknown => return "unknown".to_string(),
    };
    format!("P{n}")
}
