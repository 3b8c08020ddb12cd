//! A memory probe for the stress level: GPU memory in use, read through the monitor (device
//! memory, or the unified system memory on GB10), so `bench` and `matrix` can check that the
//! target's memory is the same before and after a stress run.

use anyhow::{Result, anyhow};

use super::collector::{MonitorConfig, sample_once};
use super::sample::GpuStatus;
use crate::bench::levels::MemoryProbe;

/// Reads the memory in use of one GPU (NVML index) through a fresh monitor sample.
#[derive(Debug, Clone)]
pub struct GpuMemoryProbe {
    index: u32,
    what: String,
}

impl GpuMemoryProbe {
    /// A probe for the first GPU whose memory NVML (or /proc/meminfo on unified-memory
    /// machines) can read; `Err` with the reason when there is none, e.g. no NVIDIA driver.
    pub fn detect() -> Result<Self> {
        let sample = sample_once(&MonitorConfig::default())?;
        match sample.gpu {
            GpuStatus::Unavailable { reason } => Err(anyhow!(reason)),
            GpuStatus::Available { gpus, .. } => gpus
                .iter()
                .find(|g| g.memory.used_bytes.get().is_some())
                .map(|g| GpuMemoryProbe {
                    index: g.index,
                    what: format!(
                        "GPU {} ({}) memory in use, {:?} memory",
                        g.index, g.name, g.memory.source
                    ),
                })
                .ok_or_else(|| anyhow!("no GPU reports the memory in use")),
        }
    }
}

impl MemoryProbe for GpuMemoryProbe {
    fn used_bytes(&self) -> Result<u64> {
        let sample = sample_once(&MonitorConfig::default())?;
        match sample.gpu {
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
