//! The GPU's SM clock and throttle reasons while `engine profile` times its steps.
//!
//! A decode step's kernels that are bound by their instructions (the MXFP4 GEMV's decode, the
//! MoE at 16 tokens) run as fast as the SM clock, and an H200 lowers that clock under a long
//! memory-bound load (Nsight Compute read 1.71–1.75 GHz during the lm_head against 1.98 at
//! most: docs/perf.md run 444). Two runs of the same binary on two machines can then differ by
//! the clock alone; `engine profile` prints what NVML saw during its timed graph steps so that
//! a figure carries its clock with it. A thread of its own samples NVML (its calls are driver
//! round trips), so the timed thread only launches and waits.

use crate::record::stats::percentile_sorted;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::Clock;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the watch reads the clock: a batch-1 step is ~1.5–2 ms, so a few samples a step.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(2);

/// What the watch saw.
#[derive(Debug, Clone, PartialEq)]
pub enum ClockReport {
    /// NVML could not be read; the reason, in the operator's words.
    Unavailable(String),
    /// The samples taken while the watch ran.
    Seen(ClockSamples),
}

/// SM clock readings (MHz) and, per throttle reason NVML named, in how many samples it was
/// active.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClockSamples {
    pub sm_mhz: Vec<u32>,
    pub max_sm_mhz: Option<u32>,
    pub reasons: BTreeMap<String, usize>,
    /// Samples whose throttle reasons could not be read.
    pub reasons_unread: usize,
}

impl ClockReport {
    /// The median SM clock of the samples, MHz (None without any).
    pub fn median_mhz(&self) -> Option<f64> {
        let ClockReport::Seen(s) = self else {
            return None;
        };
        if s.sm_mhz.is_empty() {
            return None;
        }
        let mut v: Vec<f64> = s.sm_mhz.iter().copied().map(f64::from).collect();
        v.sort_by(f64::total_cmp);
        Some(percentile_sorted(&v, 50.0))
    }

    /// One line for `engine profile`'s output: the median, lowest and highest SM clock
    /// against the device's maximum, and the throttle reasons seen (with how often).
    pub fn line(&self, during: &str) -> String {
        let s = match self {
            ClockReport::Unavailable(why) => return format!("SM clock {during}: {why}"),
            ClockReport::Seen(s) => s,
        };
        let Some(median) = self.median_mhz() else {
            return format!("SM clock {during}: no sample was taken (the steps ended first)");
        };
        let n = s.sm_mhz.len();
        let (lo, hi) = (s.sm_mhz.iter().min(), s.sm_mhz.iter().max());
        let max = s
            .max_sm_mhz
            .map_or(String::new(), |m| format!(" (the device's maximum {m})"));
        let reasons = if s.reasons.is_empty() {
            "none".to_string()
        } else {
            s.reasons
                .iter()
                .map(|(r, k)| format!("{r} in {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let unread = if s.reasons_unread > 0 {
            format!("; {} sample(s) without them", s.reasons_unread)
        } else {
            String::new()
        };
        format!(
            "SM clock {during} (NVML every {} ms, n={n}): median {median:.0} MHz, lowest {}, \
             highest {}{max}; throttle reasons: {reasons}{unread}",
            SAMPLE_PERIOD.as_millis(),
            lo.copied().unwrap_or_default(),
            hi.copied().unwrap_or_default(),
        )
    }
}

/// A sampling thread; [`ClockWatch::finish`] stops it and returns what it saw (dropped
/// unfinished, on an error of the timed steps, it is told to stop).
pub struct ClockWatch {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<ClockReport>>,
}

impl ClockWatch {
    /// Starts sampling the GPU at PCI bus id `pci` (`None`: NVML's device 0, for a host with
    /// one GPU) every [`SAMPLE_PERIOD`].
    pub fn start(pci: Option<String>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || sample(pci, &flag));
        ClockWatch {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops the thread and returns its report.
    pub fn finish(mut self) -> ClockReport {
        self.stop.store(true, Ordering::Relaxed);
        let joined = self.handle.take().map(JoinHandle::join);
        match joined {
            Some(Ok(report)) => report,
            _ => ClockReport::Unavailable("the clock sampling thread panicked".to_string()),
        }
    }
}

impl Drop for ClockWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn sample(pci: Option<String>, stop: &AtomicBool) -> ClockReport {
    let nvml = match Nvml::init() {
        Ok(n) => n,
        Err(e) => {
            return ClockReport::Unavailable(crate::monitor::nvml::unavailable_reason(&e));
        }
    };
    let device = match &pci {
        Some(id) => nvml.device_by_pci_bus_id(id.as_str()),
        None => nvml.device_by_index(0),
    };
    let device = match device {
        Ok(d) => d,
        Err(e) => {
            let which = pci.map_or("GPU 0".to_string(), |id| format!("the GPU at PCI {id}"));
            return ClockReport::Unavailable(format!("NVML could not open {which}: {e}"));
        }
    };
    let mut s = ClockSamples {
        max_sm_mhz: device.max_clock_info(Clock::SM).ok(),
        ..ClockSamples::default()
    };
    let mut clock_err = None;
    // At least one sample, however short the timed steps were.
    loop {
        match device.clock_info(Clock::SM) {
            Err(e) => clock_err = Some(e.to_string()),
            Ok(mhz) => {
                s.sm_mhz.push(mhz);
                match device.current_throttle_reasons() {
                    Ok(r) => {
                        for name in crate::monitor::nvml::throttle_reason_names(r) {
                            if name != "gpu_idle" {
                                *s.reasons.entry(name).or_default() += 1;
                            }
                        }
                    }
                    Err(_) => s.reasons_unread += 1,
                }
            }
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        std::thread::sleep(SAMPLE_PERIOD);
    }
    match clock_err {
        Some(e) if s.sm_mhz.is_empty() => {
            ClockReport::Unavailable(format!("NVML could not read the SM clock: {e}"))
        }
        _ => ClockReport::Seen(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(mhz: &[u32], reasons: &[(&str, usize)]) -> ClockReport {
        ClockReport::Seen(ClockSamples {
            sm_mhz: mhz.to_vec(),
            max_sm_mhz: Some(1980),
            reasons: reasons.iter().map(|(r, k)| (r.to_string(), *k)).collect(),
            reasons_unread: 0,
        })
    }

    #[test]
    fn the_line_gives_the_median_range_and_reasons() {
        let l = seen(&[1755, 1980, 1980, 1710], &[("sw_power_cap", 3)]).line("during x");
        assert!(
            l.starts_with("SM clock during x (NVML every 2 ms, n=4)"),
            "{l}"
        );
        assert!(
            l.contains("median 1868 MHz, lowest 1710, highest 1980 (the device's maximum 1980)"),
            "{l}"
        );
        assert!(l.ends_with("throttle reasons: sw_power_cap in 3"), "{l}");
        let l = seen(&[1980, 1965, 1980], &[]).line("during x");
        assert!(
            l.contains("median 1980 MHz, lowest 1965") && l.ends_with("none"),
            "{l}"
        );
        assert_eq!(seen(&[1830, 1815], &[]).median_mhz(), Some(1822.5));
        assert_eq!(seen(&[], &[]).median_mhz(), None);
        assert_eq!(ClockReport::Unavailable("x".into()).median_mhz(), None);
    }

    #[test]
    fn no_samples_and_no_nvml_say_so() {
        assert!(seen(&[], &[]).line("d").contains("no sample was taken"));
        let l = ClockReport::Unavailable("NVML not available: x".into()).line("d");
        assert_eq!(l, "SM clock d: NVML not available: x");
    }

    #[test]
    fn a_watch_dropped_unfinished_is_told_to_stop() {
        let w = ClockWatch::start(None);
        let flag = w.stop.clone();
        drop(w);
        assert!(flag.load(Ordering::Relaxed));
    }

    #[test]
    fn a_watch_reports_whatever_the_machine_has() {
        // Here without a GPU NVML is missing and the reason names it; on a GPU machine the
        // watch takes at least one sample.
        let r = ClockWatch::start(None).finish();
        match &r {
            ClockReport::Unavailable(why) => assert!(why.contains("NVML"), "{why}"),
            ClockReport::Seen(s) => assert!(!s.sm_mhz.is_empty(), "{r:?}"),
        }
    }
}
