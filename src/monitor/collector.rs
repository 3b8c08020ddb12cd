//! The collector thread: one thread owns NVML, sysinfo and the /metrics client, samples at
//! a fixed rate and sends each `Sample` on a channel; the run summary is kept beside it.
//!
//! Sending never blocks: a consumer that falls behind (a frozen view, a slow terminal) loses
//! samples from its channel, not from the summary.

use super::host::HostReader;
use super::nvml::GpuReader;
use super::prom::ServerReader;
use super::sample::{Sample, ServerStatus};
use super::summary::Summary;
use anyhow::{Context, Result, anyhow};
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Default sample rate, Hz.
pub const DEFAULT_RATE_HZ: f64 = 4.0;
/// Slowest allowed rate, Hz.
pub const MIN_RATE_HZ: f64 = 1.0;
/// Fastest allowed rate, Hz (NVML and /proc reads cost more than they tell above this).
pub const MAX_RATE_HZ: f64 = 20.0;
/// Samples the channel holds before new ones are dropped for a slow consumer.
pub const CHANNEL_CAPACITY: usize = 256;
/// Window over which server tok/s are averaged, seconds.
pub const RATE_WINDOW_S: f64 = 1.0;

/// Clamps a requested rate to 1–20 Hz; a non-number gives the default.
pub fn clamp_rate(hz: f64) -> f64 {
    if hz.is_nan() {
        DEFAULT_RATE_HZ
    } else {
        hz.clamp(MIN_RATE_HZ, MAX_RATE_HZ)
    }
}

/// What to watch and how often.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// Samples per second (clamped to 1–20).
    pub rate_hz: f64,
    /// The target's `/metrics` URL (a bare `http://host:port` gets `/metrics` appended).
    pub metrics_url: Option<String>,
    /// The target process (or the container's main process) to report RSS/CPU for.
    pub pid: Option<u32>,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            rate_hz: DEFAULT_RATE_HZ,
            metrics_url: None,
            pid: None,
        }
    }
}

impl MonitorConfig {
    /// Time between samples.
    pub fn period(&self) -> Duration {
        Duration::from_secs_f64(1.0 / clamp_rate(self.rate_hz))
    }
}

/// The readers one sample needs, owned by the collector thread.
struct Collector {
    gpu: GpuReader,
    host: HostReader,
    server: Option<ServerReader>,
    start: Instant,
}

impl Collector {
    fn new(config: &MonitorConfig) -> Result<Self> {
        let server = config
            .metrics_url
            .as_deref()
            .map(|url| ServerReader::new(url, RATE_WINDOW_S))
            .transpose()?;
        let mut c = Collector {
            gpu: GpuReader::new(),
            host: HostReader::new(config.pid),
            server,
            start: Instant::now(),
        };
        // A first scrape so the first sample already has a rate to report.
        if let Some(s) = &mut c.server {
            s.read(0.0);
        }
        Ok(c)
    }

    fn sample(&mut self) -> Sample {
        let elapsed_s = self.start.elapsed().as_secs_f64();
        let at = chrono::Utc::now();
        let gpu = self.gpu.read();
        let host = self.host.read();
        let server = match &mut self.server {
            Some(s) => s.read(elapsed_s),
            None => ServerStatus::NotConfigured,
        };
        Sample {
            at,
            elapsed_s,
            gpu,
            host,
            server,
        }
    }
}

/// Takes one sample: readers start, wait one period (CPU % and tok/s need two readings),
/// then read. For `--once` and for capturing the environment of a run record.
pub fn sample_once(config: &MonitorConfig) -> Result<Sample> {
    let config = config.clone();
    let period = config.period();
    // NVML blocks; keep it off the caller's thread as everywhere else.
    std::thread::Builder::new()
        .name("mxtune-monitor".to_string())
        .spawn(move || -> Result<Sample> {
            let mut c = Collector::new(&config)?;
            std::thread::sleep(period);
            Ok(c.sample())
        })
        .context("starting the monitor thread")?
        .join()
        .map_err(|_| anyhow!("the monitor thread panicked"))?
}

/// A running collector: samples arrive on `samples`; `stop` returns the run summary.
pub struct Monitor {
    /// Samples as they are taken.
    pub samples: mpsc::Receiver<Sample>,
    stop: Option<std_mpsc::Sender<()>>,
    thread: Option<JoinHandle<Summary>>,
}

impl Monitor {
    /// Starts the collector thread. Fails only on a bad configuration (e.g. an invalid URL);
    /// a missing GPU or server shows up inside the samples instead.
    pub fn start(config: MonitorConfig) -> Result<Monitor> {
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        let (stop_tx, stop_rx) = std_mpsc::channel::<()>();
        let (ready_tx, ready_rx) = std_mpsc::channel::<Result<()>>();
        let thread = std::thread::Builder::new()
            .name("mxtune-monitor".to_string())
            .spawn(move || run(config, tx, stop_rx, ready_tx))
            .context("starting the monitor thread")?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Monitor {
                samples: rx,
                stop: Some(stop_tx),
                thread: Some(thread),
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(anyhow!(
                "the monitor thread ended before it started sampling"
            )),
        }
    }

    /// Stops sampling and returns the summary of everything sampled.
    pub fn stop(mut self) -> Result<Summary> {
        self.stop.take();
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| anyhow!("the monitor thread panicked")),
            None => Err(anyhow!("the monitor was already stopped")),
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        // Closing the stop channel ends the thread; waiting keeps NVML shutdown orderly.
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(
    config: MonitorConfig,
    tx: mpsc::Sender<Sample>,
    stop: std_mpsc::Receiver<()>,
    ready: std_mpsc::Sender<Result<()>>,
) -> Summary {
    let mut summary = Summary::new(Some(clamp_rate(config.rate_hz)));
    let mut collector = match Collector::new(&config) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(e));
            return summary;
        }
    };
    let _ = ready.send(Ok(()));
    let period = config.period();
    let mut next = Instant::now() + period;
    loop {
        let wait = next.saturating_duration_since(Instant::now());
        match stop.recv_timeout(wait) {
            Err(std_mpsc::RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(std_mpsc::RecvTimeoutError::Disconnected) => return summary,
        }
        let sample = collector.sample();
        summary.add(&sample);
        if tx.try_send(sample).is_err() {
            summary.dropped_samples += 1;
        }
        // Fixed ticks; a slow sample skips the ticks it overran instead of bursting.
        next += period;
        let now = Instant::now();
        while next <= now {
            next += period;
        }
    }
}
