//! Background work of the panel: a tokio runtime owned by `tui::run` on which launches run.
//! Nothing here blocks the UI: every result comes back as an [`Event`] on the loop's channel.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::{mpsc, oneshot};

use super::Event;
use crate::flags::FlagSet;
use crate::hosts::ssh::Tunnel;
use crate::launch::attach::AttachTarget;
use crate::launch::docker::{self, DockerTarget};
use crate::launch::engine::EngineTarget;
use crate::launch::preflight::{self, LaunchFinding};
use crate::launch::{Launch, LaunchEvent, LaunchOptions};
use crate::vocab::{LaunchSpec, TargetKind};

/// What the Launch screen asks to start.
#[derive(Debug, Clone, PartialEq)]
pub struct StartRequest {
    /// Docker, engine, or attach.
    pub kind: TargetKind,
    /// The URL to attach to (attach only).
    pub url: String,
    /// The flags to render (docker and engine).
    pub flags: FlagSet,
    /// Preset name, for labels and the log file.
    pub preset: String,
    /// Where the target's log file goes.
    pub runs_dir: PathBuf,
    /// Not ready after this long = failed (the start-up watchdog), docker and engine.
    pub startup_limit: Duration,
    /// Not ready after this long = failed, for an attach.
    pub attach_limit: Duration,
    /// The hosts.toml host whose Docker engine runs a Docker target (over SSH); `None`:
    /// this machine.
    pub host: Option<crate::hosts::Host>,
    /// Follow again the newest running cluster of the preset (a docker-cluster preset only),
    /// as `mxtune launch --preset P --reattach RUN_ID` does, instead of starting one.
    pub reattach: bool,
}

/// A target running on another host: the host, and the API port there (its `/metrics`,
/// as that host's monitor sees it).
#[derive(Debug, Clone, PartialEq)]
pub struct OnHost {
    /// The host.
    pub host: crate::hosts::Host,
    /// The target's API port on the host.
    pub port: u16,
}

/// One host of a running target that spans several, whose monitor the Live screen shows
/// in a panel of its own.
#[derive(Debug, Clone, PartialEq)]
pub struct HostWatch {
    /// The hosts.toml name, or `local` for this machine.
    pub name: String,
    /// What the target runs there, e.g. `Ray head, API`.
    pub role: String,
    /// The hosts.toml entry; `None`: this machine.
    pub host: Option<crate::hosts::Host>,
    /// The target's /metrics as that host sees it, on the host that serves the API.
    pub metrics_url: Option<String>,
}

/// The hosts of a two-node cluster to watch, head first: one entry per host, so a cluster
/// whose nodes share a host gives one. `api_there` is the API's address as the head's host
/// sees it.
pub fn cluster_watches(
    head: &crate::launch::cluster::NodePlan,
    worker: &crate::launch::cluster::NodePlan,
    api_there: &str,
) -> Vec<HostWatch> {
    let head_watch = |role: &str| HostWatch {
        name: head.host_name().to_string(),
        role: role.into(),
        host: head.host.clone(),
        metrics_url: Some(api_there.to_string()),
    };
    if worker.host == head.host {
        return vec![head_watch("Ray head and worker, API")];
    }
    vec![
        head_watch("Ray head, API"),
        HostWatch {
            name: worker.host_name().to_string(),
            role: "Ray worker".into(),
            host: worker.host.clone(),
            metrics_url: None,
        },
    ]
}

/// News about the launch, delivered as [`Event::Launch`].
#[derive(Debug)]
pub enum LaunchMsg {
    /// The target was started and is being followed.
    Started {
        /// `Target::describe`.
        describe: String,
        /// Run id of this launch.
        run_id: String,
        /// The target's log file, when it has one.
        log_path: Option<PathBuf>,
        /// The limit the follower applies from now on (the attach limit for an attach).
        startup_limit: Duration,
        /// The launch as rendered and started (docker and engine).
        spec: Option<Box<crate::vocab::LaunchSpec>>,
        /// The host it runs on, when not this machine (boxed: a host entry is large).
        on_host: Option<Box<OnHost>>,
        /// Every host it runs on, when more than one (a two-node cluster); empty otherwise.
        target_hosts: Vec<HostWatch>,
    },
    /// The launch's pre-flight findings (the checks `mxtune launch` runs, here or on the
    /// chosen host), sent before anything is started; empty when nothing was found. A
    /// blocking one is followed by `StartFailed`.
    Preflight(Vec<LaunchFinding>),
    /// Nothing was started; why.
    StartFailed(String),
    /// Something happened to the target.
    Event(LaunchEvent),
    /// The target was stopped on request; the outcome.
    Stopped(Result<String, String>),
}

enum Cmd {
    Stop(Option<oneshot::Sender<()>>),
    Detach,
}

/// News about the benchmark started from the Bench screen, delivered as [`Event::Bench`].
#[derive(Debug)]
pub enum BenchMsg {
    /// Progress, as `mxtune bench` sees it.
    Progress(crate::bench::workload::BenchEvent),
    /// The benchmark ended (finished, cancelled, or could not run); the record is final.
    Done(Result<Box<crate::bench::cli::BenchOutcome>, String>),
}

/// News about the matrix or quick A/B started from the Bench screen, delivered as
/// [`Event::Matrix`].
#[derive(Debug)]
pub enum MatrixMsg {
    /// Progress, as `mxtune matrix` / `mxtune ab` print it.
    Progress(crate::matrix::progress::MatrixEvent),
    /// The matrix ended (done, cancelled: resumable, or could not run).
    MatrixDone(Result<crate::matrix::cli::MatrixOutcome, String>),
    /// The A/B ended (done, cancelled, or could not run).
    AbDone(Result<Box<crate::matrix::ab::AbOutcome>, String>),
}

/// A benchmark, matrix or A/B in progress: its cancel and a signal that its records are final.
struct Job {
    cancel: crate::bench::workload::Cancel,
    done: oneshot::Receiver<()>,
}

impl Job {
    /// A new job, the watch its task checks, and the sender it fires when its records are
    /// final.
    fn start() -> (
        Self,
        crate::bench::workload::CancelWatch,
        oneshot::Sender<()>,
    ) {
        let (cancel, watch) = crate::bench::workload::Cancel::new();
        let (done_tx, done) = oneshot::channel();
        (Self { cancel, done }, watch, done_tx)
    }

    /// Cancel it and wait (at most `limit`) until its records are saved.
    fn abort_and_wait(self, rt: &tokio::runtime::Runtime, limit: Duration, reason: &str) {
        self.cancel.cancel_because(reason);
        let _ = rt.block_on(async { tokio::time::timeout(limit, self.done).await });
    }
}

/// The runtime and the handle of the launch in progress.
pub struct Background {
    rt: tokio::runtime::Runtime,
    tx: Sender<Event>,
    launch: Option<mpsc::UnboundedSender<Cmd>>,
    /// This machine's collectors: one, or none while only other hosts are watched.
    monitors: Vec<crate::monitor::Monitor>,
    /// The stop flags of the threads reading other hosts' monitors, while they run.
    host_monitors: Vec<Arc<AtomicBool>>,
    bench: Option<Job>,
    matrix: Option<Job>,
}

impl std::fmt::Debug for Background {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Background")
            .field("launch", &self.launch.is_some())
            .field("bench", &self.bench.is_some())
            .field("matrix", &self.matrix.is_some())
            .finish()
    }
}

/// How long an exit waits for a cancelled benchmark to save its record.
const BENCH_SAVE_LIMIT: Duration = Duration::from_secs(10);

/// How long an exit waits for a cancelled matrix or A/B to stop its target and save its
/// records and state (the stop's grace time plus a little).
const MATRIX_SAVE_LIMIT: Duration = Duration::from_secs(45);

/// How long a stop waits between SIGTERM and kill.
const STOP_GRACE: Duration = Duration::from_secs(30);

impl Background {
    /// A runtime whose results go to `tx`.
    pub fn new(tx: Sender<Event>) -> anyhow::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tui-bg")
            .enable_all()
            .build()
            .context("cannot start the background runtime")?;
        Ok(Background {
            rt,
            tx,
            launch: None,
            monitors: Vec::new(),
            host_monitors: Vec::new(),
            bench: None,
            matrix: None,
        })
    }

    /// (Re)start the monitor, watching `metrics_url` when given; samples arrive as
    /// [`Event::Sample`]. One sample a second: enough for charts of 30 s to 30 min, and
    /// cheap enough for an idle panel.
    pub fn watch(&mut self, metrics_url: Option<String>) {
        self.stop_monitors();
        self.watch_local(metrics_url, |r| match r {
            Ok(s) => Event::Sample(s),
            Err(e) => Event::MonitorError(e),
        });
    }

    /// Watch another host instead: `mxtune monitor --json` runs there over SSH (checked to be
    /// this version first) and each sample arrives as [`Event::Sample`], as this machine's
    /// do; `metrics_url` is as seen from that host. Its failure arrives as
    /// [`Event::MonitorError`].
    pub fn watch_host(&mut self, host: &crate::hosts::Host, metrics_url: String) {
        self.stop_monitors();
        self.watch_remote(host, Some(metrics_url), |r| match r {
            Ok(s) => Event::Sample(s),
            Err(e) => Event::MonitorError(e),
        });
    }

    /// Watch every host of a target that spans several, each with its own monitor (this
    /// machine's collector, or `mxtune monitor --json` over SSH); the `i`th host's samples
    /// arrive as [`Event::HostSample`] and its failure as [`Event::HostMonitorError`], so one
    /// host's failure leaves the others watched.
    pub fn watch_hosts(&mut self, hosts: &[HostWatch]) {
        self.stop_monitors();
        for (i, w) in hosts.iter().enumerate() {
            let event = move |r: Result<Box<crate::monitor::Sample>, String>| match r {
                Ok(sample) => Event::HostSample { host: i, sample },
                Err(error) => Event::HostMonitorError { host: i, error },
            };
            match &w.host {
                None => self.watch_local(w.metrics_url.clone(), event),
                Some(h) => self.watch_remote(h, w.metrics_url.clone(), event),
            }
        }
    }

    /// Starts this machine's collector; `event` turns each sample, or the failure to start,
    /// into the loop's event.
    fn watch_local(
        &mut self,
        metrics_url: Option<String>,
        event: impl Fn(Result<Box<crate::monitor::Sample>, String>) -> Event + Send + 'static,
    ) {
        let config = crate::monitor::MonitorConfig {
            rate_hz: 1.0,
            metrics_url,
            pid: None,
        };
        let mut m = match crate::monitor::Monitor::start(config) {
            Ok(m) => m,
            Err(e) => {
                let _ = self.tx.send(event(Err(format!("{e:#}"))));
                return;
            }
        };
        let (fwd_tx, mut fwd_rx) = mpsc::channel(1);
        std::mem::swap(&mut m.samples, &mut fwd_rx);
        drop(fwd_tx);
        let tx = self.tx.clone();
        // Dropping the collector ends its thread and, with it, this forwarder.
        let spawned = std::thread::Builder::new()
            .name("tui-samples".into())
            .spawn(move || {
                while let Some(s) = fwd_rx.blocking_recv() {
                    if tx.send(event(Ok(Box::new(s)))).is_err() {
                        break;
                    }
                }
            });
        match spawned {
            Ok(_) => self.monitors.push(m),
            Err(e) => {
                let _ = self.tx.send(Event::MonitorError(format!(
                    "cannot start the sample thread: {e}"
                )));
            }
        }
    }

    /// Starts `mxtune monitor --json` on `host` over SSH, read on a thread of its own;
    /// `event` turns each sample, or the failure, into the loop's event.
    fn watch_remote(
        &mut self,
        host: &crate::hosts::Host,
        metrics_url: Option<String>,
        event: impl Fn(Result<Box<crate::monitor::Sample>, String>) -> Event + Send + 'static,
    ) {
        let stop = Arc::new(AtomicBool::new(false));
        self.host_monitors.push(stop.clone());
        let tx = self.tx.clone();
        let name = host.name.clone();
        let host = host.clone();
        let args = crate::hosts::monitor::RemoteMonitorArgs {
            rate: Some(1.0),
            url: metrics_url,
            pid: None,
            once: false,
        };
        let err_tx = self.tx.clone();
        let spawned = std::thread::Builder::new()
            .name("tui-host-samples".into())
            .spawn(move || {
                let mut m = match crate::hosts::monitor::RemoteMonitor::start(&host, &args, false) {
                    Ok(m) => m,
                    Err(e) => {
                        if !stop.load(Ordering::Relaxed) {
                            let _ = tx.send(event(Err(format!("{e:#}"))));
                        }
                        return;
                    }
                };
                // A sample a second: the flag is seen within a second of a stop, and a
                // sample read after it is not passed on. Dropping `m` ends its ssh.
                loop {
                    let next = m.next_sample();
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let (ev, failed) = match next {
                        Ok(Some(s)) => (event(Ok(Box::new(s))), false),
                        Ok(None) => return,
                        Err(e) => (event(Err(format!("{e:#}"))), true),
                    };
                    if tx.send(ev).is_err() || failed {
                        return;
                    }
                }
            });
        if let Err(e) = spawned {
            let _ = err_tx.send(Event::MonitorError(format!(
                "cannot start the thread reading host {name}'s monitor: {e}"
            )));
        }
    }

    /// Ends every collector and remote monitor.
    fn stop_monitors(&mut self) {
        self.monitors.clear();
        for stop in self.host_monitors.drain(..) {
            stop.store(true, Ordering::Relaxed);
        }
    }

    /// Run a benchmark through the same code as `mxtune bench` ([`crate::bench::cli::execute`]);
    /// progress and the outcome arrive as [`BenchMsg`]s. One at a time: a running one is
    /// cancelled first.
    pub fn bench(&mut self, args: crate::bench::cli::BenchArgs) {
        self.cancel_bench("replaced by a new benchmark");
        let (job, watch, done_tx) = Job::start();
        self.bench = Some(job);
        let tx = self.tx.clone();
        self.rt.spawn(async move {
            let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
            let fwd_tx = tx.clone();
            let forward = tokio::spawn(async move {
                while let Some(ev) = ev_rx.recv().await {
                    if fwd_tx.send(Event::Bench(BenchMsg::Progress(ev))).is_err() {
                        break;
                    }
                }
            });
            let out = crate::bench::cli::execute(&args, Some(ev_tx), watch).await;
            // Every progress event goes out before the outcome.
            let _ = forward.await;
            let _ = done_tx.send(());
            let _ = tx.send(Event::Bench(BenchMsg::Done(
                out.map(Box::new).map_err(|e| format!("{e:#}")),
            )));
        });
    }

    /// Cancel the running benchmark (at once: the batch in flight is dropped); `Done`
    /// arrives when its record is final.
    pub fn cancel_bench(&mut self, reason: &str) {
        if let Some(b) = &self.bench {
            b.cancel.cancel_because(reason);
        }
    }

    /// Cancel the running benchmark and wait until its record is saved (as `aborted`):
    /// used before the panel exits, so nothing is lost on quit, SIGTERM or SIGHUP.
    pub fn abort_bench_and_wait(&mut self, reason: &str) {
        if let Some(job) = self.bench.take() {
            job.abort_and_wait(&self.rt, BENCH_SAVE_LIMIT, reason);
        }
    }

    fn matrix_progress(&self) -> crate::matrix::progress::Progress {
        let tx = self.tx.clone();
        crate::matrix::progress::Progress::new(move |e| {
            let _ = tx.send(Event::Matrix(MatrixMsg::Progress(e)));
        })
    }

    /// Run (or resume) a matrix through the same code as `mxtune matrix`
    /// ([`crate::matrix::cli::execute`]); progress and the outcome arrive as [`MatrixMsg`]s.
    /// One matrix or A/B at a time: a running one is cancelled first.
    pub fn matrix(&mut self, args: crate::matrix::cli::MatrixArgs) {
        self.cancel_matrix("replaced by a new matrix");
        let (job, watch, done_tx) = Job::start();
        self.matrix = Some(job);
        let tx = self.tx.clone();
        let progress = self.matrix_progress();
        self.rt.spawn(async move {
            let out = crate::matrix::cli::execute(&args, &progress, &watch).await;
            let _ = done_tx.send(());
            let _ = tx.send(Event::Matrix(MatrixMsg::MatrixDone(
                out.map_err(|e| format!("{e:#}")),
            )));
        });
    }

    /// Run an A/B through the same code as `mxtune ab` ([`crate::matrix::ab::execute`]).
    pub fn ab(&mut self, args: crate::matrix::cli::AbArgs) {
        self.cancel_matrix("replaced by a new A/B");
        let (job, watch, done_tx) = Job::start();
        self.matrix = Some(job);
        let tx = self.tx.clone();
        let progress = self.matrix_progress();
        self.rt.spawn(async move {
            let out = crate::matrix::ab::execute(&args, &progress, &watch).await;
            let _ = done_tx.send(());
            let _ = tx.send(Event::Matrix(MatrixMsg::AbDone(
                out.map(Box::new).map_err(|e| format!("{e:#}")),
            )));
        });
    }

    /// Cancel the running matrix or A/B: its target is stopped, its records saved as
    /// `aborted` and (a matrix) its state left resumable; `*Done` arrives when that is over.
    pub fn cancel_matrix(&mut self, reason: &str) {
        if let Some(m) = &self.matrix {
            m.cancel.cancel_because(reason);
        }
    }

    /// Cancel the running matrix or A/B and wait until it has stopped its target and saved
    /// its records: used before the panel exits.
    pub fn abort_matrix_and_wait(&mut self, reason: &str) {
        if let Some(job) = self.matrix.take() {
            job.abort_and_wait(&self.rt, MATRIX_SAVE_LIMIT, reason);
        }
    }

    /// Start a target; progress arrives as `LaunchMsg`s.
    pub fn start(&mut self, req: StartRequest) {
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        self.launch = Some(cmd_tx);
        let tx = self.tx.clone();
        self.rt.spawn(async move {
            let run_id = ulid::Ulid::generate().to_string();
            let (ev_tx, ev_rx) = mpsc::unbounded_channel();
            match start(&req, &run_id, ev_tx, &tx).await {
                Ok(Started {
                    launch,
                    log_path,
                    startup_limit,
                    spec,
                    tunnel,
                    reattached,
                }) => {
                    let mut on_host = match (&req.host, &tunnel) {
                        (Some(host), Some(t)) => t.port.map(|(_, port)| {
                            Box::new(OnHost {
                                host: host.clone(),
                                port,
                            })
                        }),
                        _ => None,
                    };
                    let mut target_hosts = Vec::new();
                    if let (crate::launch::Target::Cluster(c), Some(spec)) = (&launch.target, &spec)
                    {
                        let api_there =
                            format!("http://{}:{}", docker::connect_host(&spec.host), spec.port);
                        target_hosts = cluster_watches(&c.head.plan, &c.worker.plan, &api_there);
                        // Both nodes on one host: the single-host view, of that host.
                        if target_hosts.len() == 1 {
                            on_host = target_hosts.pop().and_then(|w| w.host).map(|host| {
                                Box::new(OnHost {
                                    host,
                                    port: spec.port,
                                })
                            });
                        }
                    }
                    let describe = match &on_host {
                        Some(o) => format!("{} on host {}", launch.target.describe(), o.host.name),
                        None => launch.target.describe(),
                    };
                    let _ = tx.send(Event::Launch(LaunchMsg::Started {
                        describe,
                        run_id: reattached.unwrap_or(run_id),
                        log_path,
                        startup_limit,
                        spec: spec.map(Box::new),
                        on_host,
                        target_hosts,
                    }));
                    // The tunnel carries the follower's Docker and API traffic: it ends
                    // with the follower (stop, detach, or the panel going away).
                    follow(launch, ev_rx, cmd_rx, tx).await;
                    drop(tunnel);
                }
                Err(e) => {
                    let _ = tx.send(Event::Launch(LaunchMsg::StartFailed(format!("{e:#}"))));
                }
            }
        });
    }

    /// Ask the running target to stop; `Stopped` arrives when it has.
    pub fn stop(&mut self) {
        if let Some(cmd) = self.launch.take() {
            let _ = cmd.send(Cmd::Stop(None));
        }
    }

    /// Stop the running target and wait for it (at most the grace time plus a little):
    /// used when the operator quits and chose to stop it.
    pub fn stop_and_wait(&mut self) {
        if let Some(cmd) = self.launch.take() {
            let (done_tx, done_rx) = oneshot::channel();
            if cmd.send(Cmd::Stop(Some(done_tx))).is_ok() {
                let _ = self.rt.block_on(async {
                    tokio::time::timeout(STOP_GRACE + Duration::from_secs(10), done_rx).await
                });
            }
        }
    }

    /// Stop following but leave the target running (quit with "leave it running").
    pub fn detach(&mut self) {
        if let Some(cmd) = self.launch.take() {
            let _ = cmd.send(Cmd::Detach);
        }
    }
}

/// A started launch and what it needs while it is followed.
struct Started {
    launch: Launch,
    log_path: Option<PathBuf>,
    startup_limit: Duration,
    spec: Option<LaunchSpec>,
    /// The SSH tunnel to the host, for a launch on another host.
    tunnel: Option<Tunnel>,
    /// The run id of the cluster followed again, for a re-attach.
    reattached: Option<String>,
}

/// Shows the pre-flight findings on the Launch screen; an error when one blocks the launch.
fn report_preflight(tx: &Sender<Event>, findings: Vec<LaunchFinding>) -> anyhow::Result<()> {
    let blocked = preflight::blocked(&findings);
    let _ = tx.send(Event::Launch(LaunchMsg::Preflight(findings)));
    if blocked {
        anyhow::bail!("{}", preflight::BLOCKED);
    }
    Ok(())
}

/// Starts the requested target after the pre-flight `mxtune launch` runs (shared code in
/// [`crate::launch::preflight`]): on this machine, on the chosen host over SSH, or on both
/// hosts of a two-node cluster. Its findings go to `tx` before anything is started.
async fn start(
    req: &StartRequest,
    run_id: &str,
    events: mpsc::UnboundedSender<LaunchEvent>,
    tx: &Sender<Event>,
) -> anyhow::Result<Started> {
    let mut opts = LaunchOptions::new(run_id, &req.preset)?;
    opts.startup_limit = req.startup_limit;
    opts.attach_limit = req.attach_limit;
    let log_path = req.runs_dir.join(format!("{run_id}.target.log"));
    if req.kind == TargetKind::Attach {
        let launch = AttachTarget::attach(&req.url, "", &opts, events)?;
        let startup_limit = launch.startup_limit();
        return Ok(Started {
            launch,
            log_path: None,
            startup_limit,
            spec: None,
            tunnel: None,
            reattached: None,
        });
    }
    let mut spec = crate::flags::render(&req.flags, req.kind)?;
    let blocking: Vec<String> = crate::flags::rules::evaluate(&req.flags, req.kind, None)
        .into_iter()
        .filter(|f| f.blocks())
        .map(|f| f.to_string())
        .collect();
    // A re-attach starts nothing, so the rules (about starting) do not stop it, as with the CLI.
    if !blocking.is_empty() && !req.reattach {
        anyhow::bail!(
            "the rules block this launch (fix on the Flags screen): {}",
            blocking.join("; ")
        );
    }
    opts.log_path = Some(log_path.clone());
    let mut tunnel = None;
    let mut reattached = None;
    let launch = match (req.kind, &req.host) {
        (TargetKind::DockerCluster, Some(h)) => anyhow::bail!(
            "a docker-cluster preset names its own two hosts under [cluster]; press h until the host reads this machine (not {})",
            h.name
        ),
        (TargetKind::DockerCluster, None) if req.reattach => {
            let cluster = spec.cluster.clone().context(
                "the rendered preset has no [cluster] section: the docker-cluster target needs cluster.head and cluster.worker",
            )?;
            let plan = crate::launch::cluster::ClusterPlan::from_hosts_file(&cluster)?;
            let engines = crate::launch::cluster::ClusterEngines::connect(&plan, &spec).await?;
            // In the names of the vLLM release the head's image carries, as it was launched.
            spec = crate::launch::dialect::render_for_launch(
                &req.flags,
                req.kind,
                Some(&engines.head),
            )
            .await?;
            let runs = engines.running_clusters(&plan, &req.preset).await?;
            let Some(run) = runs.first().cloned() else {
                anyhow::bail!(
                    "no running cluster of preset {} has its Ray head on host {}: l launches one (`docker ps --filter label={}=head` on that host lists the Ray heads there)",
                    req.preset,
                    plan.head.host_name(),
                    crate::launch::cluster::LABEL_ROLE
                );
            };
            for other in &runs[1..] {
                let _ = events.send(LaunchEvent::Warning {
                    message: format!(
                        "cluster run {other} of preset {} is running too; re-attached to the newest, {run} (stop the other with `mxtune stop --cluster {} {other}`, or follow it with `mxtune launch --preset {} --reattach {other}`)",
                        req.preset, req.preset, req.preset
                    ),
                });
            }
            reattached = Some(run.clone());
            crate::launch::cluster::ClusterTarget::reattach_on(
                engines,
                plan,
                &spec,
                &run,
                Some(&req.runs_dir),
                &opts,
                events,
            )
            .await?
        }
        (TargetKind::DockerCluster, None) => {
            let cluster = spec.cluster.clone().context(
                "the rendered preset has no [cluster] section: the docker-cluster target needs cluster.head and cluster.worker",
            )?;
            let plan = crate::launch::cluster::ClusterPlan::from_hosts_file(&cluster)?;
            report_preflight(tx, preflight::cluster_checks(&plan, &spec).await?)?;
            let engines = crate::launch::cluster::ClusterEngines::connect(&plan, &spec).await?;
            if let Some(c) = &spec.container {
                engines.check_image(&plan, &c.image, false).await?;
            }
            // Rendered again in the names of the vLLM release the head's image carries.
            spec = crate::launch::dialect::render_for_launch(
                &req.flags,
                req.kind,
                Some(&engines.head),
            )
            .await?;
            crate::launch::cluster::ClusterTarget::launch_on(engines, plan, &spec, &opts, events)
                .await?
        }
        (TargetKind::Docker, host) => {
            let mut findings = preflight::checks_on(host.as_ref(), &spec, true).await?;
            let connected = match host {
                None => docker::connect().await.map(|d| (d, None)),
                Some(h) => {
                    match Tunnel::open(h, Some((docker::connect_host(&spec.host), spec.port))).await
                    {
                        Ok(t) => docker::connect_tunnel(&t, &h.docker_socket)
                            .await
                            .map(|d| (d, Some(t))),
                        Err(e) => Err(e),
                    }
                }
            };
            let (d, t) = match connected {
                Ok(c) => c,
                Err(e) => {
                    // The host's findings still count (a blocking one says more than
                    // the unreachable Docker engine).
                    let findings = findings.into_iter().map(LaunchFinding::single).collect();
                    report_preflight(tx, findings)?;
                    return Err(e);
                }
            };
            if let Some(c) = &spec.container {
                findings.extend(preflight::check_image(&d, &c.image, host.as_ref(), None).await);
            }
            report_preflight(
                tx,
                findings.into_iter().map(LaunchFinding::single).collect(),
            )?;
            if let (Some(h), Some(t)) = (host, t) {
                opts.remote_host = Some(h.name.clone());
                opts.api_url = t.url();
                tunnel = Some(t);
            }
            // Rendered again in the names of the vLLM release the image carries.
            let port = spec.port;
            spec =
                crate::launch::dialect::render_for_launch(&req.flags, req.kind, Some(&d)).await?;
            if tunnel.is_some() && spec.port != port {
                anyhow::bail!(
                    "rendering for the image's vLLM release moved the API port from {port} to {}: give the port in the preset",
                    spec.port
                );
            }
            DockerTarget::launch(d, &spec, &opts, events).await?
        }
        (_, Some(h)) => anyhow::bail!(
            "host {} runs Docker targets only: press t for docker, or h for this machine",
            h.name
        ),
        _ => {
            // A CPU engine needs no GPU, so nobody else on it matters.
            let findings =
                preflight::checks_on(None, &spec, !preflight::runs_on_cpu(&spec)).await?;
            report_preflight(
                tx,
                findings.into_iter().map(LaunchFinding::single).collect(),
            )?;
            EngineTarget::launch(None, &spec, &opts, Some(&req.runs_dir), events).await?
        }
    };
    let startup_limit = launch.startup_limit();
    Ok(Started {
        launch,
        log_path: Some(log_path),
        startup_limit,
        spec: Some(spec),
        tunnel,
        reattached,
    })
}

async fn follow(
    launch: Launch,
    mut events: mpsc::UnboundedReceiver<LaunchEvent>,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    tx: Sender<Event>,
) {
    loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(ev) => {
                    if tx.send(Event::Launch(LaunchMsg::Event(ev))).is_err() {
                        return;
                    }
                }
                // The follower ended (target gone); keep the handle for a later stop.
                None => {
                    let cmd = cmds.recv().await;
                    finish(launch, cmd, &tx).await;
                    return;
                }
            },
            cmd = cmds.recv() => {
                finish(launch, cmd, &tx).await;
                return;
            }
        }
    }
}

async fn finish(launch: Launch, cmd: Option<Cmd>, tx: &Sender<Event>) {
    match cmd {
        Some(Cmd::Stop(done)) => {
            let out = launch.stop(STOP_GRACE, false).await;
            let _ = tx.send(Event::Launch(LaunchMsg::Stopped(
                out.map_err(|e| format!("{e:#}")),
            )));
            if let Some(done) = done {
                let _ = done.send(());
            }
        }
        // Detach, or the panel went away: the target keeps running (`mxtune stop` finds it).
        Some(Cmd::Detach) | None => {
            launch.detach();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::cluster::{NodePlan, Role};

    fn node(role: Role, host: Option<&str>) -> NodePlan {
        NodePlan {
            role,
            host: host.map(|n| crate::hosts::Host {
                name: n.into(),
                ssh: format!("me@{n}"),
                ssh_config: None,
                docker_socket: crate::hosts::DEFAULT_DOCKER_SOCKET.into(),
                mxtune: crate::hosts::DEFAULT_REMOTE_MXTUNE.into(),
                nccl: Default::default(),
                defined_at: "hosts.toml:1".into(),
            }),
            ip: "192.168.200.11".into(),
            env: Default::default(),
        }
    }

    #[test]
    fn a_cluster_on_two_hosts_is_watched_on_both_with_the_api_on_the_head() {
        let api = "http://127.0.0.1:8000";
        let w = cluster_watches(
            &node(Role::Head, None),
            &node(Role::Worker, Some("spark2")),
            api,
        );
        assert_eq!(w.len(), 2);
        assert_eq!(
            (w[0].name.as_str(), w[0].role.as_str(), w[0].host.is_none()),
            ("local", "Ray head, API", true)
        );
        assert_eq!(w[0].metrics_url.as_deref(), Some(api));
        assert_eq!(w[1].name, "spark2");
        assert_eq!(w[1].role, "Ray worker");
        assert_eq!(
            w[1].host.as_ref().map(|h| h.ssh.as_str()),
            Some("me@spark2")
        );
        assert_eq!(w[1].metrics_url, None);
        // The head elsewhere: its host's own view of the API.
        let w = cluster_watches(
            &node(Role::Head, Some("spark1")),
            &node(Role::Worker, Some("spark2")),
            api,
        );
        assert_eq!(
            (w[0].name.as_str(), w[1].name.as_str()),
            ("spark1", "spark2")
        );
        assert!(w[0].host.is_some());
    }

    #[test]
    fn a_cluster_on_one_host_is_one_host_to_watch() {
        let w = cluster_watches(
            &node(Role::Head, None),
            &node(Role::Worker, None),
            "http://127.0.0.1:8000",
        );
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].name, "local");
        assert_eq!(w[0].role, "Ray head and worker, API");
        let w = cluster_watches(
            &node(Role::Head, Some("spark2")),
            &node(Role::Worker, Some("spark2")),
            "http://127.0.0.1:8000",
        );
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].name, "spark2");
    }
}
