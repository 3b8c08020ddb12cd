//! GPU telemetry through NVML (nvml-wrapper).
//!
//! NVML is initialised once by the collector thread that owns `GpuReader`; its calls can
//! block for milliseconds, which is why they never run on the UI task. Every query is read
//! on its own: NOT_SUPPORTED becomes `n/a`, any other failure becomes an error reading, and
//! neither stops the queries after it.

use super::memory::{DeviceMemory, choose_memory, read_meminfo};
use super::reading::Reading;
use super::sample::{Clocks, GpuProcess, GpuSample, GpuStatus};
use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, PerformanceState, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use std::collections::BTreeMap;

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

/// Owns the NVML handle (or the reason there is none) for the collector thread.
pub struct GpuReader {
    nvml: Result<Nvml, String>,
}

impl GpuReader {
    /// Initialises NVML once; failure is kept as the reason shown in every sample.
    pub fn new() -> Self {
        GpuReader {
            nvml: Nvml::init().map_err(|e| unavailable_reason(&e)),
        }
    }

    /// Reads every GPU.
    pub fn read(&self) -> GpuStatus {
        let nvml = match &self.nvml {
            Ok(n) => n,
            Err(reason) => {
                return GpuStatus::Unavailable {
                    reason: reason.clone(),
                };
            }
        };
        let driver_version = reading(nvml.sys_driver_version());
        let cuda_driver_version = reading(nvml.sys_cuda_driver_version()).map(|v| {
            format!(
                "{}.{}",
                nvml_wrapper::cuda_driver_version_major(v),
                nvml_wrapper::cuda_driver_version_minor(v)
            )
        });
        let gpus = match nvml.device_count() {
            Ok(n) => (0..n)
                .map(|index| match nvml.device_by_index(index) {
                    Ok(device) => read_device(index, &device),
                    Err(e) => failed_device(index, &e),
                })
                .collect(),
            Err(e) => {
                return GpuStatus::Unavailable {
                    reason: format!("NVML initialised but could not count GPUs: {e}"),
                };
            }
        };
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

fn read_device(index: u32, d: &Device<'_>) -> GpuSample {
    let processes = read_processes(d);
    let device_memory = reading(d.memory_info()).map(|m| DeviceMemory {
        used: m.used,
        total: m.total,
    });
    let memory = choose_memory(device_memory, read_meminfo, &processes);
    let milli = |r: Result<u32, NvmlError>| reading(r).map(|mw| f64::from(mw) / 1000.0);
    let utilization = reading(d.utilization_rates());
    GpuSample {
        index,
        name: reading(d.name()),
        uuid: reading(d.uuid()),
        compute_capability: reading(d.cuda_compute_capability())
            .map(|c| format!("{}.{}", c.major, c.minor)),
        persistence_mode: reading(d.is_in_persistent_mode()),
        compute_mode: reading(d.compute_mode()).map(|m| format!("{m:?}")),
        memory,
        clocks: Clocks {
            sm_mhz: reading(d.clock_info(Clock::SM)),
            graphics_mhz: reading(d.clock_info(Clock::Graphics)),
            mem_mhz: reading(d.clock_info(Clock::Memory)),
        },
        max_clocks: Clocks {
            sm_mhz: reading(d.max_clock_info(Clock::SM)),
            graphics_mhz: reading(d.max_clock_info(Clock::Graphics)),
            mem_mhz: reading(d.max_clock_info(Clock::Memory)),
        },
        power_w: milli(d.power_usage()),
        power_limit_w: milli(d.enforced_power_limit()),
        energy_j: reading(d.total_energy_consumption()).map(|mj| mj as f64 / 1000.0),
        temperature_c: reading(d.temperature(TemperatureSensor::Gpu)),
        utilization_gpu_pct: utilization.clone().map(|u| u.gpu),
        utilization_mem_pct: utilization.map(|u| u.memory),
        pstate: reading(d.performance_state()).map(pstate_name),
        throttle_reasons: reading(d.current_throttle_reasons()).map(|r| {
            r.iter_names()
                .map(|(name, _)| name.to_ascii_lowercase())
                .filter(|n| n != "none")
                .collect()
        }),
        processes,
    }
}

/// A GPU whose handle could not be obtained: every reading carries that error.
fn failed_device(index: u32, e: &NvmlError) -> GpuSample {
    let msg = format!("NVML could not open GPU {index}: {e}");
    fn err<T>(msg: &str) -> Reading<T> {
        Reading::Error(msg.to_string())
    }
    let clocks = || Clocks {
        sm_mhz: err(&msg),
        graphics_mhz: err(&msg),
        mem_mhz: err(&msg),
    };
    GpuSample {
        index,
        name: err(&msg),
        uuid: err(&msg),
        compute_capability: err(&msg),
        persistence_mode: err(&msg),
        compute_mode: err(&msg),
        memory: choose_memory(err(&msg), read_meminfo, &err(&msg)),
        clocks: clocks(),
        max_clocks: clocks(),
        power_w: err(&msg),
        power_limit_w: err(&msg),
        energy_j: err(&msg),
        temperature_c: err(&msg),
        utilization_gpu_pct: err(&msg),
        utilization_mem_pct: err(&msg),
        pstate: err(&msg),
        throttle_reasons: err(&msg),
        processes: err(&msg),
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
