//! A memory probe for the stress level: GPU memory in use, read through the monitor (device
//! memory, or the unified system memory on GB10), so `bench` and `matrix` can check that the
//! target's memory is the same before and after a stress run.

use anyhow::{Result, anyhow};

use super::collector::{MonitorConfig, sample_once};
use super::sample::{GpuStatus, Sample};
use crate::bench::levels::MemoryProbe;

/// Where a probe's samples come from: this machine's monitor, or a host's over SSH.
pub type SampleSource = Box<dyn Fn() -> Result<Sample> + Send + Sync>;

/// Reads the memory in use of one GPU (NVML index) through a fresh monitor sample.
pub struct GpuMemoryProbe {
    index: u32,
    what: String,
    source: SampleSource,
}

impl std::fmt::Debug for GpuMemoryProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuMemoryProbe")
            .field("index", &self.index)
            .field("what", &self.what)
            .finish()
    }
}

impl GpuMemoryProbe {
    /// A probe for the first GPU whose memory NVML (or /proc/meminfo on unified-memory
    /// machines) can read; `Err` with the reason when there is none, e.g. no NVIDIA driver.
    pub fn detect() -> Result<Self> {
        Self::detect_with("", Box::new(|| sample_once(&MonitorConfig::default())))
    }

    /// [`detect`](Self::detect) on the samples of `source` (e.g. a host's own `mxtune
    /// monitor`); `place` ends the description (e.g. ` on host spark2`).
    pub fn detect_with(place: &str, source: SampleSource) -> Result<Self> {
        match source()?.gpu {
            GpuStatus::Unavailable { reason } => Err(anyhow!(reason)),
            GpuStatus::Available { gpus, .. } => gpus
                .iter()
                .find(|g| g.memory.used_bytes.get().is_some())
                .map(|g| (g.index, g.name.to_string(), g.memory.source))
                .map(|(index, name, memory)| GpuMemoryProbe {
                    index,
                    what: format!("GPU {index} ({name}) memory in use, {memory:?} memory{place}"),
                    source,
                })
                .ok_or_else(|| anyhow!("no GPU reports the memory in use{place}")),
        }
    }
}

impl MemoryProbe for GpuMemoryProbe {
    fn used_bytes(&self) -> Result<u64> {
        match (self.source)()?.gpu {
            GpuStatus::Unavailable { reason } => Err(anyhow!(reason)),
            GpuStatus::Available { gpus, .. } => gpus
                .iter()
                .find(|g| g.index == self.index)
                .and_then(|g| g.memory.used_bytes.get())
                .ok_or_else(|| anyhow!("GPU {} no longer reports its memory in use", self.index)),
        }
    }

    fn describe(&self) -> String {
        self.what.clone()
    }
}
