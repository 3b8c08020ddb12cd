//! The one `Sample` type every consumer sees: GPU, host and server readings taken together.

use super::reading::Reading;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Everything the monitor measured at one instant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    /// Wall-clock time of the sample.
    pub at: DateTime<Utc>,
    /// Seconds since the monitor started (monotonic clock).
    pub elapsed_s: f64,
    /// NVML readings, or why there are none.
    pub gpu: GpuStatus,
    /// Host CPU, memory, load and the watched process.
    pub host: HostSample,
    /// The target's own `/metrics`, when a URL was given.
    pub server: ServerStatus,
}

/// The GPU side: either NVML answered, or the reason it could not be used.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum GpuStatus {
    /// NVML initialised; per-GPU readings follow.
    Available {
        /// Driver version string, e.g. `580.95.05`.
        driver_version: Reading<String>,
        /// CUDA version the driver supports, e.g. `13.0`.
        cuda_driver_version: Reading<String>,
        /// One entry per GPU, in NVML index order.
        gpus: Vec<GpuSample>,
    },
    /// NVML could not be initialised (no driver, no library, no permission).
    Unavailable {
        /// The real reason, e.g. `NVML not available: libnvidia-ml.so.1 not found`.
        reason: String,
    },
}

/// One GPU's readings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuSample {
    /// NVML device index.
    pub index: u32,
    /// Product name.
    pub name: Reading<String>,
    /// Stable GPU UUID.
    pub uuid: Reading<String>,
    /// CUDA compute capability, e.g. `9.0` (H100) or `12.1` (GB10).
    pub compute_capability: Reading<String>,
    /// Whether the driver stays loaded with no client (persistence mode).
    pub persistence_mode: Reading<bool>,
    /// NVML compute mode: `Default`, `ExclusiveProcess` or `Prohibited`.
    pub compute_mode: Reading<String>,
    /// Memory in use, from the device or (GB10) from the unified system memory.
    pub memory: GpuMemory,
    /// Current clocks in MHz.
    pub clocks: Clocks,
    /// Maximum clocks in MHz.
    pub max_clocks: Clocks,
    /// Power draw in watts.
    pub power_w: Reading<f64>,
    /// Enforced power limit in watts.
    pub power_limit_w: Reading<f64>,
    /// Energy consumed since the driver loaded, in joules.
    pub energy_j: Reading<f64>,
    /// GPU die temperature in °C.
    pub temperature_c: Reading<u32>,
    /// Percent of time a kernel was running.
    pub utilization_gpu_pct: Reading<u32>,
    /// Percent of time device memory was read or written.
    pub utilization_mem_pct: Reading<u32>,
    /// Performance state, `P0` (fastest) … `P15`.
    pub pstate: Reading<String>,
    /// Active clock-event (throttle) reasons, NVML names in snake case; empty means none.
    pub throttle_reasons: Reading<Vec<String>>,
    /// Processes using this GPU.
    pub processes: Reading<Vec<GpuProcess>>,
}

/// SM, graphics and memory clocks in MHz.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Clocks {
    /// Streaming-multiprocessor clock.
    pub sm_mhz: Reading<u32>,
    /// Graphics clock.
    pub graphics_mhz: Reading<u32>,
    /// Memory clock.
    pub mem_mhz: Reading<u32>,
}

/// A process holding a GPU context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProcess {
    /// Process id (in the host's pid namespace).
    pub pid: u32,
    /// GPU memory the process uses, in bytes; `n/a` where the driver does not say.
    pub used_bytes: Reading<u64>,
}

/// Where a GPU's memory figures come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySource {
    /// The GPU's own memory, as NVML reports it.
    Device,
    /// System memory shared with the CPU (GB10): NVML has no device-memory figure, so
    /// used/total come from /proc/meminfo and the per-process figures from NVML.
    Unified,
}

/// A GPU's memory figures and where they come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuMemory {
    /// Device memory or unified system memory.
    pub source: MemorySource,
    /// Bytes in use (device: allocated; unified: MemTotal − MemAvailable).
    pub used_bytes: Reading<u64>,
    /// Bytes in total (device: installed; unified: MemTotal).
    pub total_bytes: Reading<u64>,
    /// Sum of per-process GPU memory from NVML's process list.
    pub process_bytes: Reading<u64>,
}

/// Host readings from sysinfo.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostSample {
    /// All CPUs together, percent.
    pub cpu_pct: Reading<f32>,
    /// Each logical CPU, percent.
    pub cpu_per_core_pct: Vec<f32>,
    /// RAM in use (total − available), bytes.
    pub ram_used_bytes: u64,
    /// RAM installed, bytes.
    pub ram_total_bytes: u64,
    /// Swap in use, bytes.
    pub swap_used_bytes: u64,
    /// Swap configured, bytes.
    pub swap_total_bytes: u64,
    /// Load average over 1, 5 and 15 minutes.
    pub load: Reading<[f64; 3]>,
    /// The watched process (target or container main process), when a pid was given.
    pub process: Option<ProcessSample>,
}

/// RSS and CPU of one watched process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessSample {
    /// Process id.
    pub pid: u32,
    /// Resident set size, bytes.
    pub rss_bytes: Reading<u64>,
    /// CPU use in percent of one core (can exceed 100 for a multi-threaded process).
    pub cpu_pct: Reading<f32>,
}

/// The target server's `/metrics`, if a URL was given.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ServerStatus {
    /// No URL was given: nothing to scrape.
    NotConfigured,
    /// The scrape answered (fields the server does not export read `n/a`). Boxed: the
    /// figures are ten times the size of the other variants.
    Scraped(Box<ServerMetrics>),
    /// The server has no `/metrics` (HTTP 404): every figure is `n/a`.
    NoMetrics {
        /// The URL that answered 404.
        url: String,
    },
    /// The scrape failed; the message names the URL.
    Failed {
        /// What went wrong.
        error: String,
    },
}

/// Which server dialect the metric names came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerKind {
    /// `vllm:*` names (vLLM, and the bundled engine which exports the same names).
    Vllm,
    /// `llamacpp:*` names (llama.cpp server).
    LlamaCpp,
    /// Neither family was found in the scrape.
    Unknown,
}

/// Server-side figures derived from one scrape and the ones before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerMetrics {
    /// The scraped URL.
    pub url: String,
    /// Which metric names the server uses.
    pub kind: ServerKind,
    /// Generated tokens per second over the last rate window.
    pub generation_tok_s: Reading<f64>,
    /// Prompt tokens per second over the last rate window.
    pub prompt_tok_s: Reading<f64>,
    /// Requests being processed.
    pub running: Reading<f64>,
    /// Requests queued.
    pub waiting: Reading<f64>,
    /// KV-cache usage, 0–1.
    pub kv_cache_usage: Reading<f64>,
    /// Accepted / proposed draft tokens since the monitor started.
    pub spec_acceptance_rate: Reading<f64>,
    /// 1 + accepted tokens / drafts since the monitor started.
    pub spec_mean_acceptance_length: Reading<f64>,
    /// Mean time per output token over the last rate window, ms (vLLM's TPOT histogram:
    /// its `_sum` growth over its `_count` growth). `None` when the server does not export
    /// the histogram; `n/a` when no request finished in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpot_ms: Option<Reading<f64>>,
    /// Prefix-cache hits / queries over the last rate window, 0–1. `None` when the server
    /// does not export the counters; `n/a` when nothing was looked up in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_cache_hit_rate: Option<Reading<f64>>,
    /// Requests the server pre-empted (freed their KV to recompute them later) since the
    /// monitor started: the growth of vLLM's `num_preemptions` counter. `None` when the
    /// server does not export it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemptions: Option<Reading<f64>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample of every shape a remote host can send reads back into the same JSON.
    #[test]
    fn json_round_trip() {
        let clocks = Clocks {
            sm_mhz: Reading::Value(2405),
            graphics_mhz: Reading::NotSupported,
            mem_mhz: Reading::Error("timeout".into()),
        };
        let gpu = GpuSample {
            index: 0,
            name: Reading::Value("NVIDIA GB10".into()),
            uuid: Reading::Value("GPU-1".into()),
            compute_capability: Reading::Value("12.1".into()),
            persistence_mode: Reading::Value(true),
            compute_mode: Reading::Value("Default".into()),
            memory: GpuMemory {
                source: MemorySource::Unified,
                used_bytes: Reading::Value(1 << 36),
                total_bytes: Reading::Value(1 << 37),
                process_bytes: Reading::NotSupported,
            },
            clocks: clocks.clone(),
            max_clocks: clocks,
            power_w: Reading::Value(41.5),
            power_limit_w: Reading::NotSupported,
            energy_j: Reading::Value(1234.25),
            temperature_c: Reading::Value(52),
            utilization_gpu_pct: Reading::Value(97),
            utilization_mem_pct: Reading::Error("Unknown".into()),
            pstate: Reading::Value("P0".into()),
            throttle_reasons: Reading::Value(vec!["sw_power_cap".into()]),
            processes: Reading::Value(vec![GpuProcess {
                pid: 4242,
                used_bytes: Reading::NotSupported,
            }]),
        };
        let metrics = ServerMetrics {
            url: "http://127.0.0.1:8000/metrics".into(),
            kind: ServerKind::Vllm,
            generation_tok_s: Reading::Value(57.25),
            prompt_tok_s: Reading::NotSupported,
            running: Reading::Value(1.0),
            waiting: Reading::Value(0.0),
            kv_cache_usage: Reading::Value(0.125),
            spec_acceptance_rate: Reading::NotSupported,
            spec_mean_acceptance_length: Reading::NotSupported,
            tpot_ms: Some(Reading::Value(17.5)),
            prefix_cache_hit_rate: None,
            preemptions: None,
        };
        let host = HostSample {
            cpu_pct: Reading::Value(12.5),
            cpu_per_core_pct: vec![10.0, 15.0],
            ram_used_bytes: 1 << 30,
            ram_total_bytes: 1 << 34,
            swap_used_bytes: 0,
            swap_total_bytes: 0,
            load: Reading::Value([0.5, 0.25, 0.125]),
            process: Some(ProcessSample {
                pid: 7,
                rss_bytes: Reading::Value(1 << 20),
                cpu_pct: Reading::NotSupported,
            }),
        };
        let servers = [
            ServerStatus::Scraped(Box::new(metrics)),
            ServerStatus::NotConfigured,
            ServerStatus::NoMetrics { url: "u".into() },
            ServerStatus::Failed { error: "e".into() },
        ];
        let gpus = [
            GpuStatus::Available {
                driver_version: Reading::Value("580.95.05".into()),
                cuda_driver_version: Reading::Value("13.0".into()),
                gpus: vec![gpu],
            },
            GpuStatus::Unavailable {
                reason: "NVML not available".into(),
            },
        ];
        for (gpu, server) in gpus.iter().cycle().zip(servers) {
            let sample = Sample {
                at: Utc::now(),
                elapsed_s: 1.5,
                gpu: gpu.clone(),
                host: host.clone(),
                server,
            };
            let json = serde_json::to_value(&sample).unwrap();
            let back: Sample = serde_json::from_str(&json.to_string()).unwrap();
            assert_eq!(serde_json::to_value(&back).unwrap(), json);
        }
    }
}
