//! Host CPU, memory, load and the watched process, through sysinfo.
//!
//! CPU percentages are differences between two refreshes, so the reader is primed once when
//! it is made and every later `read` reports the load since the previous one.

use super::reading::Reading;
use super::sample::{HostSample, ProcessSample};
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

/// Keeps the sysinfo state between samples.
pub struct HostReader {
    system: Result<System, String>,
    pid: Option<u32>,
}

impl HostReader {
    /// Primes CPU and process counters so the first `read` has a difference to report.
    pub fn new(pid: Option<u32>) -> Self {
        let system = System::new().map_err(|e| format!("sysinfo could not start: {e}"));
        let mut reader = HostReader { system, pid };
        reader.refresh();
        reader
    }

    fn refresh(&mut self) {
        let pid = self.pid;
        if let Ok(sys) = &mut self.system {
            sys.refresh_cpu_usage();
            sys.refresh_memory();
            if let Some(pid) = pid {
                sys.refresh_processes_specifics(
                    ProcessesToUpdate::Some(&[Pid::from_u32(pid)]),
                    true,
                    ProcessRefreshKind::nothing().with_memory().with_cpu(),
                );
            }
        }
    }

    /// Refreshes and reads the host figures.
    pub fn read(&mut self) -> HostSample {
        self.refresh();
        let load = match System::load_average() {
            Ok(l) => Reading::Value([l.one, l.five, l.fifteen]),
            Err(sysinfo::Error::Unsupported) => Reading::NotSupported,
            Err(e) => Reading::Error(format!("reading the load average: {e}")),
        };
        let sys = match &self.system {
            Ok(s) => s,
            Err(e) => {
                return HostSample {
                    cpu_pct: Reading::Error(e.clone()),
                    cpu_per_core_pct: Vec::new(),
                    ram_used_bytes: 0,
                    ram_total_bytes: 0,
                    swap_used_bytes: 0,
                    swap_total_bytes: 0,
                    load,
                    process: self.pid.map(|pid| ProcessSample {
                        pid,
                        rss_bytes: Reading::Error(e.clone()),
                        cpu_pct: Reading::Error(e.clone()),
                    }),
                };
            }
        };
        let process = self.pid.map(|pid| match sys.process(Pid::from_u32(pid)) {
            Some(p) => ProcessSample {
                pid,
                rss_bytes: Reading::Value(p.memory()),
                cpu_pct: Reading::Value(p.cpu_usage()),
            },
            None => {
                let gone = format!("process {pid} not found (exited, or not visible here)");
                ProcessSample {
                    pid,
                    rss_bytes: Reading::Error(gone.clone()),
                    cpu_pct: Reading::Error(gone),
                }
            }
        });
        HostSample {
            cpu_pct: Reading::Value(sys.global_cpu_usage()),
            cpu_per_core_pct: sys.cpus().iter().map(|c| c.usage()).collect(),
            ram_used_bytes: sys.total_memory().saturating_sub(sys.available_memory()),
            ram_total_bytes: sys.total_memory(),
            swap_used_bytes: sys.used_swap(),
            swap_total_bytes: sys.total_swap(),
            load,
            process,
        }
    }
}
