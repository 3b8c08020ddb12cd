//! `mxtune monitor`: a compact line per second, or JSON for scripts.

use super::collector::{Monitor, MonitorConfig, clamp_rate, sample_once};
use super::reading::Reading;
use super::sample::{GpuStatus, MemorySource, Sample, ServerStatus};
use anyhow::{Context, Result};
use std::io::Write;
use std::process::ExitCode;

/// Arguments of `mxtune monitor`.
#[derive(clap::Args, Debug, Clone)]
pub struct MonitorArgs {
    /// Samples per second (1–20; values outside are clamped).
    #[arg(long, default_value_t = super::collector::DEFAULT_RATE_HZ)]
    pub rate: f64,
    /// The target's /metrics URL (http://host:port gets /metrics appended).
    #[arg(long)]
    pub url: Option<String>,
    /// Report RSS and CPU of this process (the target, or a container's main process).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Take one sample and exit.
    #[arg(long)]
    pub once: bool,
    /// Print JSON (one object per line) instead of the compact line.
    #[arg(long)]
    pub json: bool,
    /// Watch this host of ~/.config/mxtune/hosts.toml instead: `mxtune monitor --json` runs
    /// there over SSH (same version needed); --url and --pid are as seen from that host.
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
}

/// Runs `mxtune monitor` until interrupted (or once).
pub fn run(args: MonitorArgs) -> Result<ExitCode> {
    let rate_hz = clamp_rate(args.rate);
    if rate_hz != args.rate {
        eprintln!(
            "mxtune monitor: --rate {} is outside 1–20 Hz; using {rate_hz}",
            args.rate
        );
    }
    if let Some(name) = &args.host {
        return run_remote(name, &args, rate_hz);
    }
    let config = MonitorConfig {
        rate_hz,
        metrics_url: args.url,
        pid: args.pid,
    };
    let mut out = std::io::stdout().lock();
    if args.once {
        let sample = sample_once(&config)?;
        print(&mut out, &sample, args.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut monitor = Monitor::start(config)?;
    // One line per second whatever the rate: print when the whole second changes.
    let mut last_second: Option<u64> = None;
    while let Some(sample) = monitor.samples.blocking_recv() {
        let second = sample.elapsed_s.floor() as u64;
        if last_second != Some(second) {
            last_second = Some(second);
            print(&mut out, &sample, args.json)?;
        }
    }
    monitor.stop()?;
    Ok(ExitCode::SUCCESS)
}

/// `monitor --host NAME`: the host's own monitor, read back sample by sample and printed
/// as here.
fn run_remote(name: &str, args: &MonitorArgs, rate_hz: f64) -> Result<ExitCode> {
    let host = crate::hosts::find(name)?;
    let remote = crate::hosts::monitor::RemoteMonitorArgs {
        rate: Some(rate_hz),
        url: args.url.clone(),
        pid: args.pid,
        once: args.once,
    };
    let mut monitor = crate::hosts::monitor::RemoteMonitor::start(&host, &remote, true)?;
    let mut out = std::io::stdout().lock();
    while let Some(sample) = monitor.next_sample()? {
        print(&mut out, &sample, args.json)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print(out: &mut impl Write, sample: &Sample, json: bool) -> Result<()> {
    if json {
        serde_json::to_writer(&mut *out, sample).context("writing the sample as JSON")?;
        writeln!(out).context("writing to stdout")?;
    } else {
        writeln!(out, "{}", line(sample)).context("writing to stdout")?;
    }
    out.flush().context("writing to stdout")
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn gib(r: &Reading<u64>) -> String {
    r.show(|b| format!("{:.1}", *b as f64 / GIB))
}

/// The compact one-line view of a sample.
pub fn line(s: &Sample) -> String {
    let mut parts = vec![s.at.format("%H:%M:%S").to_string()];
    match &s.gpu {
        GpuStatus::Unavailable { reason } => parts.push(format!("GPU: {reason}")),
        GpuStatus::Available { gpus, .. } if gpus.is_empty() => {
            parts.push("GPU: NVML sees no GPU".to_string())
        }
        GpuStatus::Available { gpus, .. } => {
            for g in gpus {
                let unified = if g.memory.source == MemorySource::Unified {
                    " unified"
                } else {
                    ""
                };
                let throttle = g.throttle_reasons.show(|r| {
                    if r.is_empty() {
                        "-".to_string()
                    } else {
                        r.join(",")
                    }
                });
                parts.push(format!(
                    "gpu{} {}% mem{unified} {}/{} GiB sm {}/{} MHz mem {} MHz {}/{} W {}°C {} thr {}",
                    g.index,
                    g.utilization_gpu_pct.show(|v| v.to_string()),
                    gib(&g.memory.used_bytes),
                    gib(&g.memory.total_bytes),
                    g.clocks.sm_mhz.show(|v| v.to_string()),
                    g.max_clocks.sm_mhz.show(|v| v.to_string()),
                    g.clocks.mem_mhz.show(|v| v.to_string()),
                    g.power_w.show(|v| format!("{v:.0}")),
                    g.power_limit_w.show(|v| format!("{v:.0}")),
                    g.temperature_c.show(|v| v.to_string()),
                    g.pstate.show(|v| v.clone()),
                    throttle,
                ));
            }
        }
    }
    let h = &s.host;
    parts.push(format!(
        "cpu {}% ram {:.1}/{:.1} GiB load {}",
        h.cpu_pct.show(|v| format!("{v:.0}")),
        h.ram_used_bytes as f64 / GIB,
        h.ram_total_bytes as f64 / GIB,
        h.load.show(|l| format!("{:.2}", l[0])),
    ));
    if let Some(p) = &h.process {
        parts.push(format!(
            "pid {} rss {} MiB cpu {}%",
            p.pid,
            p.rss_bytes
                .show(|b| format!("{:.0}", *b as f64 / (1024.0 * 1024.0))),
            p.cpu_pct.show(|v| format!("{v:.0}"))
        ));
    }
    match &s.server {
        ServerStatus::NotConfigured => {}
        ServerStatus::NoMetrics { url } => parts.push(format!("server n/a (no {url})")),
        ServerStatus::Failed { error } => parts.push(format!("server error: {error}")),
        ServerStatus::Scraped(m) => {
            let mut server = format!(
                "gen {} tok/s prompt {} tok/s run {} wait {} kv {} accept {} len {}",
                m.generation_tok_s.show(|v| format!("{v:.1}")),
                m.prompt_tok_s.show(|v| format!("{v:.1}")),
                m.running.show(|v| format!("{v:.0}")),
                m.waiting.show(|v| format!("{v:.0}")),
                m.kv_cache_usage.show(|v| format!("{:.0}%", v * 100.0)),
                m.spec_acceptance_rate
                    .show(|v| format!("{:.0}%", v * 100.0)),
                m.spec_mean_acceptance_length.show(|v| format!("{v:.2}")),
            );
            // Only servers that export these series get them on the line.
            if let Some(r) = &m.tpot_ms {
                server.push_str(&format!(" tpot {} ms", r.show(|v| format!("{v:.1}"))));
            }
            if let Some(r) = &m.prefix_cache_hit_rate {
                server.push_str(&format!(
                    " prefix hits {}",
                    r.show(|v| format!("{:.0}%", v * 100.0))
                ));
            }
            if let Some(r) = &m.preemptions {
                server.push_str(&format!(" preempted {}", r.show(|v| format!("{v:.0}"))));
            }
            parts.push(server);
        }
    }
    parts.join(" | ")
}
