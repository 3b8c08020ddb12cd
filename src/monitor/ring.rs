//! Fixed-capacity history for charts: memory stays flat however long a run lasts.

use super::sample::{GpuStatus, Sample, ServerStatus};
use serde::Serialize;
use std::collections::VecDeque;

/// A ring buffer: pushing beyond capacity drops the oldest entry.
#[derive(Debug, Clone)]
pub struct Ring<T> {
    items: VecDeque<T>,
    capacity: usize,
}

impl<T> Ring<T> {
    /// Allocates all `capacity` slots up front (at least one), so memory never grows later.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Ring {
            items: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Appends, dropping the oldest entry when full.
    pub fn push(&mut self, item: T) {
        if self.items.len() == self.capacity {
            self.items.pop_front();
        }
        self.items.push_back(item);
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when nothing was pushed yet.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The most entries it will ever hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Slots allocated (never above what `new` reserved, which is what keeps memory flat).
    pub fn allocated(&self) -> usize {
        self.items.capacity()
    }

    /// Oldest to newest.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + ExactSizeIterator {
        self.items.iter()
    }

    /// The newest entry.
    pub fn latest(&self) -> Option<&T> {
        self.items.back()
    }
}

/// The charted figures of one sample (first GPU; a GB10 has one), compact on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct ChartPoint {
    /// Seconds since the monitor started.
    pub elapsed_s: f64,
    /// GPU utilisation, percent.
    pub gpu_util_pct: Option<f64>,
    /// GPU (or unified) memory in use, bytes.
    pub gpu_mem_used_bytes: Option<u64>,
    /// SM clock, MHz.
    pub sm_mhz: Option<f64>,
    /// Power draw, watts.
    pub power_w: Option<f64>,
    /// Temperature, °C.
    pub temperature_c: Option<f64>,
    /// Host CPU, percent.
    pub cpu_pct: Option<f64>,
    /// Watched process RSS, bytes.
    pub process_rss_bytes: Option<u64>,
    /// Server-side generation tok/s.
    pub generation_tok_s: Option<f64>,
    /// Server-side prompt tok/s.
    pub prompt_tok_s: Option<f64>,
}

impl ChartPoint {
    /// Extracts the charted figures from a sample.
    pub fn from_sample(s: &Sample) -> Self {
        let mut p = ChartPoint {
            elapsed_s: s.elapsed_s,
            cpu_pct: s.host.cpu_pct.get().map(f64::from),
            process_rss_bytes: s.host.process.as_ref().and_then(|p| p.rss_bytes.get()),
            ..ChartPoint::default()
        };
        if let GpuStatus::Available { gpus, .. } = &s.gpu
            && let Some(g) = gpus.first()
        {
            p.gpu_util_pct = g.utilization_gpu_pct.get().map(f64::from);
            p.gpu_mem_used_bytes = g.memory.used_bytes.get();
            p.sm_mhz = g.clocks.sm_mhz.get().map(f64::from);
            p.power_w = g.power_w.get();
            p.temperature_c = g.temperature_c.get().map(f64::from);
        }
        if let ServerStatus::Scraped(m) = &s.server {
            p.generation_tok_s = m.generation_tok_s.get();
            p.prompt_tok_s = m.prompt_tok_s.get();
        }
        p
    }
}

/// Chart history: the last `capacity` points, one per sample.
pub type History = Ring<ChartPoint>;

/// Sizes a history to hold `window_s` seconds at `rate_hz`.
pub fn history_for(window_s: f64, rate_hz: f64) -> History {
    Ring::new((window_s * rate_hz).ceil().max(1.0) as usize)
}
