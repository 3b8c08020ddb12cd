//! Choosing where a GPU's memory figures come from.
//!
//! On a discrete GPU NVML reports device memory. On GB10 (DGX Spark) the GPU shares the
//! LPDDR5x with the CPU and NVML answers NOT_SUPPORTED for device memory; the honest figure
//! is then the system's (MemTotal − MemAvailable from /proc/meminfo), next to the per-process
//! GPU memory NVML still lists. The choice is a pure function so it is tested without a GB10.

use super::reading::Reading;
use super::sample::{GpuMemory, GpuProcess, MemorySource};
use anyhow::{Context, Result, anyhow};

/// Device memory as NVML reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Allocated bytes.
    pub used: u64,
    /// Installed bytes.
    pub total: u64,
}

/// The two /proc/meminfo lines the unified view needs, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    /// `MemTotal`.
    pub total: u64,
    /// `MemAvailable`.
    pub available: u64,
}

/// Parses /proc/meminfo text (values in kB) into `MemInfo`.
pub fn parse_meminfo(text: &str) -> Result<MemInfo> {
    let field = |key: &str| -> Result<u64> {
        let line = text
            .lines()
            .find(|l| l.split(':').next() == Some(key))
            .ok_or_else(|| anyhow!("/proc/meminfo has no `{key}` line"))?;
        let kb = line
            .split(':')
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .ok_or_else(|| anyhow!("/proc/meminfo `{key}` line has no value: {line:?}"))?;
        let kb: u64 = kb
            .parse()
            .with_context(|| format!("/proc/meminfo `{key}` value {kb:?} is not a number"))?;
        Ok(kb * 1024)
    };
    Ok(MemInfo {
        total: field("MemTotal")?,
        available: field("MemAvailable")?,
    })
}

/// Reads and parses /proc/meminfo.
pub fn read_meminfo() -> Result<MemInfo> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .context("reading /proc/meminfo for the unified-memory figures")?;
    parse_meminfo(&text)
}

/// Sums the per-process GPU memory; `n/a` when no process reports a figure.
pub fn process_total(processes: &Reading<Vec<GpuProcess>>) -> Reading<u64> {
    match processes {
        Reading::Value(list) => {
            let known: Vec<u64> = list.iter().filter_map(|p| p.used_bytes.get()).collect();
            if known.is_empty() && !list.is_empty() {
                Reading::NotSupported
            } else {
                Reading::Value(known.iter().sum())
            }
        }
        Reading::NotSupported => Reading::NotSupported,
        Reading::Error(e) => Reading::Error(e.clone()),
    }
}

/// Picks the memory source: device memory when NVML answers, unified system memory when
/// NVML says NOT_SUPPORTED, and the device error as-is when the query failed otherwise.
/// `meminfo` is only consulted for the unified case, so a caller may read it lazily.
pub fn choose_memory(
    device: Reading<DeviceMemory>,
    meminfo: impl FnOnce() -> Result<MemInfo>,
    processes: &Reading<Vec<GpuProcess>>,
) -> GpuMemory {
    let process_bytes = process_total(processes);
    match device {
        Reading::Value(m) => GpuMemory {
            source: MemorySource::Device,
            used_bytes: Reading::Value(m.used),
            total_bytes: Reading::Value(m.total),
            process_bytes,
        },
        Reading::Error(e) => GpuMemory {
            source: MemorySource::Device,
            used_bytes: Reading::Error(e.clone()),
            total_bytes: Reading::Error(e),
            process_bytes,
        },
        Reading::NotSupported => match meminfo() {
            Ok(info) => GpuMemory {
                source: MemorySource::Unified,
                used_bytes: Reading::Value(info.total.saturating_sub(info.available)),
                total_bytes: Reading::Value(info.total),
                process_bytes,
            },
            Err(e) => {
                let msg = format!("{e:#}");
                GpuMemory {
                    source: MemorySource::Unified,
                    used_bytes: Reading::Error(msg.clone()),
                    total_bytes: Reading::Error(msg),
                    process_bytes,
                }
            }
        },
    }
}
