//! The follower: one task per launched target that turns its log lines and exit into
//! [`LaunchEvent`]s, phases, readiness, failures and the kernel-path verdict.

use super::logbuf::LogBuffer;
use super::ready::ReadyProbe;
use super::rules::LogRules;
use super::target::Target;
use super::verdict::{PathScanner, ValidationReport};
use super::{ExitInfo, LaunchEvent, LogStream, Phase};
use crate::vocab::PathCheck;
use crate::vocab::ProbeAnswer;
use anyhow::{Result, bail};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// Log lines quoted in a failure message.
pub const FAILURE_TAIL_LINES: usize = 50;

/// Start-up limit (the watchdog) unless told otherwise: sized for GB10, where JIT takes
/// 3–5 min and graph capture has hung for 40+ min.
pub const DEFAULT_STARTUP_LIMIT: Duration = Duration::from_secs(45 * 60);

/// Limit for an attached endpoint unless told otherwise: it is already running, so a minute
/// without a good answer means it is not serving, and waiting 45 minutes would hide that.
pub const DEFAULT_ATTACH_LIMIT: Duration = Duration::from_secs(60);

/// How long the log may be quiet before ready until a warning, unless told otherwise.
pub const DEFAULT_QUIET_WARNING: Duration = Duration::from_secs(5 * 60);

/// How a failure message caused by the watchdog begins; see [`fired_by_startup_limit`].
const LIMIT_FAILURE: &str = "not ready within the ";

/// Which watchdog limit a launch runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LimitKind {
    /// A target mxtune starts: sized for JIT and graph capture.
    Startup,
    /// An endpoint that already runs.
    Attach,
}

/// The failure message when the watchdog fires: the limit, where the start stood, and the
/// last probe's answer, which is usually the reason.
fn limit_failure(
    kind: LimitKind,
    limit: Duration,
    phase: Phase,
    last_probe: Option<&ProbeAnswer>,
) -> String {
    let probe = last_probe
        .map(ToString::to_string)
        .unwrap_or_else(|| "no probe finished yet".into());
    match kind {
        LimitKind::Startup => format!(
            "{LIMIT_FAILURE}start-up limit of {} s (phase: {phase}; last probe: {probe})",
            limit.as_secs()
        ),
        LimitKind::Attach => format!(
            "{LIMIT_FAILURE}attach limit of {} s (last probe: {probe})",
            limit.as_secs()
        ),
    }
}

/// Whether a [`LaunchEvent::Failed`] message says the watchdog (the start-up or attach
/// limit) fired, rather than a fatal log line or an early exit.
pub fn fired_by_startup_limit(message: &str) -> bool {
    message.starts_with(LIMIT_FAILURE)
}

/// How a launch is followed and stopped.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Run id (label `mxtune.run_id`, state file key).
    pub run_id: String,
    /// Preset name (label `mxtune.preset`).
    pub preset: String,
    /// Log file beside the run record; `None` keeps logs in memory only.
    pub log_path: Option<PathBuf>,
    /// Lines kept in memory.
    pub log_capacity: usize,
    /// Phase and fatal patterns.
    pub rules: LogRules,
    /// Not ready after this long = failed (Docker and engine targets).
    pub startup_limit: Duration,
    /// Not ready after this long = failed, for an attached endpoint.
    pub attach_limit: Duration,
    /// Warn when no log line arrived for this long before ready.
    pub quiet_warning: Duration,
    /// Pause between readiness probes.
    pub ready_poll: Duration,
    /// Timeout of one probe request (the first completion can be slow).
    pub probe_timeout: Duration,
    /// Time between SIGTERM and kill on stop.
    pub stop_grace: Duration,
    /// Keep the stopped container instead of removing it.
    pub keep: bool,
    /// Pull a missing image.
    pub allow_pull: bool,
    /// Bearer token for the target's API.
    pub api_key: Option<String>,
    /// The vLLM version a stock image's launch was rendered for: a start-up banner announcing
    /// another release is a warning.
    pub rendered_for_vllm: Option<String>,
    /// The hosts.toml host whose Docker engine runs the target (reached over SSH); `None`:
    /// this machine's engine (or `DOCKER_HOST`). Local-only steps (creating cache
    /// directories for mounts) are skipped on a remote host.
    pub remote_host: Option<String>,
    /// The target's API as reached from here when that is not its own host:port (a port
    /// forwarded over SSH); readiness is probed there.
    pub api_url: Option<String>,
}

impl LaunchOptions {
    /// Defaults sized for GB10 ([`DEFAULT_STARTUP_LIMIT`], [`DEFAULT_ATTACH_LIMIT`],
    /// [`DEFAULT_QUIET_WARNING`]).
    pub fn new(run_id: &str, preset: &str) -> Result<Self> {
        Ok(Self {
            run_id: run_id.to_string(),
            preset: preset.to_string(),
            log_path: None,
            log_capacity: 10_000,
            rules: LogRules::builtin()?,
            startup_limit: DEFAULT_STARTUP_LIMIT,
            attach_limit: DEFAULT_ATTACH_LIMIT,
            quiet_warning: DEFAULT_QUIET_WARNING,
            ready_poll: Duration::from_secs(1),
            probe_timeout: Duration::from_secs(120),
            stop_grace: Duration::from_secs(30),
            keep: false,
            allow_pull: false,
            api_key: None,
            rendered_for_vllm: None,
            remote_host: None,
            api_url: None,
        })
    }
}

/// What a target's log pump sends to the follower.
#[derive(Debug)]
pub enum SourceMsg {
    /// One log line.
    Line(LogStream, String),
    /// An event to pass through (e.g. a warning from the log pump).
    Event(LaunchEvent),
    /// The target cannot become ready, for a reason the source knows (e.g. a cluster's
    /// worker never joined); ignored once the target is ready or already failed.
    Fail(String),
    /// The target is gone; sent after its last line.
    Exited(ExitInfo),
}

/// Where a launch stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// Not ready yet; the current phase.
    Starting(Phase),
    /// Readiness probes passed.
    Ready(ReadyInfo),
    /// Failed (fatal log line, start-up limit, exit before ready); the message has the last lines.
    Failed(String),
    /// Gone after having been ready (or stopped).
    Exited(ExitInfo),
}

/// What readiness established.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadyInfo {
    /// Base URL of the API.
    pub url: String,
    /// Model that answered.
    pub model: String,
    /// Seconds from start to ready.
    pub startup_s: f64,
}

#[derive(Debug)]
struct Shared {
    logs: Mutex<LogBuffer>,
    scanner: Mutex<PathScanner>,
    history: Mutex<History>,
}

/// A start-up phase as the follower saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseSeen {
    /// The phase.
    pub phase: Phase,
    /// When it began.
    pub at: chrono::DateTime<chrono::Utc>,
    /// The last readiness probe answer while it was the current phase.
    pub last_probe: Option<ProbeAnswer>,
}

/// Phases with the time each began, and warnings, for the run record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// Phases in the order they began.
    pub phases: Vec<PhaseSeen>,
    /// Every warning event.
    pub warnings: Vec<String>,
    /// Seconds from start to ready.
    pub startup_s: Option<f64>,
    /// The vLLM version the target's start-up banner announced, as printed.
    pub vllm_version: Option<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves data that is still usable for logs.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A launched target being followed.
#[derive(Debug)]
pub struct Launch {
    /// The target itself (stop, facts).
    pub target: Target,
    shared: Arc<Shared>,
    status: watch::Receiver<Status>,
    task: tokio::task::JoinHandle<()>,
    limit: Duration,
}

impl Launch {
    /// Starts following `target`: lines from `source`, readiness from `probe`.
    pub fn follow(
        target: Target,
        source: mpsc::Receiver<SourceMsg>,
        probe: ReadyProbe,
        checks: &[PathCheck],
        opts: &LaunchOptions,
        events: mpsc::UnboundedSender<LaunchEvent>,
    ) -> Result<Self> {
        let shared = Arc::new(Shared {
            logs: Mutex::new(LogBuffer::new(opts.log_capacity, opts.log_path.as_deref())?),
            scanner: Mutex::new(PathScanner::new(checks)),
            history: Mutex::new(History {
                phases: vec![PhaseSeen {
                    phase: Phase::Starting,
                    at: chrono::Utc::now(),
                    last_probe: None,
                }],
                ..History::default()
            }),
        });
        let (status_tx, status) = watch::channel(Status::Starting(Phase::Starting));
        let (limit_kind, limit) = match &target {
            Target::Attach(_) => (LimitKind::Attach, opts.attach_limit),
            _ => (LimitKind::Startup, opts.startup_limit),
        };
        let follower = Follower {
            shared: shared.clone(),
            rules: opts.rules.clone(),
            events,
            status: status_tx,
            started: Instant::now(),
            limit_kind,
            limit,
            quiet_warning: opts.quiet_warning,
            url: probe.base_url().to_string(),
            rendered_for_vllm: opts.rendered_for_vllm.clone(),
        };
        let task = tokio::spawn(follower.run(source, probe, opts.ready_poll));
        Ok(Self {
            target,
            shared,
            status,
            task,
            limit,
        })
    }

    /// The watchdog's limit for this launch: the attach limit for an attached endpoint,
    /// else the start-up limit.
    pub fn startup_limit(&self) -> Duration {
        self.limit
    }

    /// The current status.
    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// Waits until the target is ready, or fails with the reason (exit code, fatal line,
    /// start-up limit, with the last log lines).
    pub async fn wait_ready(&mut self) -> Result<ReadyInfo> {
        loop {
            let now = self.status.borrow_and_update().clone();
            match now {
                Status::Ready(info) => return Ok(info),
                Status::Failed(msg) => bail!("{} failed: {msg}", self.target.describe()),
                Status::Exited(exit) => bail!(
                    "{} exited ({exit}) before it was ready; last lines:\n{}",
                    self.target.describe(),
                    self.tail(FAILURE_TAIL_LINES).join("\n")
                ),
                Status::Starting(_) => {}
            }
            if self.status.changed().await.is_err() {
                bail!(
                    "{}: the follower stopped before the target was ready",
                    self.target.describe()
                );
            }
        }
    }

    /// The last `n` log lines.
    pub fn tail(&self, n: usize) -> Vec<String> {
        lock(&self.shared.logs).tail(n)
    }

    /// Log lines seen so far (including those no longer in memory).
    pub fn lines_seen(&self) -> u64 {
        lock(&self.shared.logs).total()
    }

    /// The kernel-path report over every line seen so far.
    pub fn report(&self) -> ValidationReport {
        lock(&self.shared.scanner).report()
    }

    /// Phases, warnings and start-up time so far.
    pub fn history(&self) -> History {
        lock(&self.shared.history).clone()
    }

    /// Stops the target (SIGTERM, grace, kill, remove unless `keep`) and ends following.
    pub async fn stop(mut self, grace: Duration, keep: bool) -> Result<String> {
        let outcome = self.target.stop(grace, keep).await;
        // Let the follower record the exit, but never hang on it; an attached endpoint
        // does not exit at all.
        if matches!(self.target, Target::Attach(_))
            || tokio::time::timeout(Duration::from_secs(5), &mut self.task)
                .await
                .is_err()
        {
            self.task.abort();
        }
        outcome
    }

    /// Stops following but leaves the target running (headless `launch` exits this way).
    pub fn detach(self) -> Target {
        self.task.abort();
        self.target
    }
}

struct Follower {
    shared: Arc<Shared>,
    rules: LogRules,
    events: mpsc::UnboundedSender<LaunchEvent>,
    status: watch::Sender<Status>,
    started: Instant,
    limit_kind: LimitKind,
    limit: Duration,
    quiet_warning: Duration,
    url: String,
    rendered_for_vllm: Option<String>,
}

impl Follower {
    fn emit(&self, e: LaunchEvent) {
        match &e {
            LaunchEvent::Phase { phase } => lock(&self.shared.history).phases.push(PhaseSeen {
                phase: *phase,
                at: chrono::Utc::now(),
                last_probe: None,
            }),
            LaunchEvent::Probe { answer } => {
                if let Some(p) = lock(&self.shared.history).phases.last_mut() {
                    p.last_probe = Some(answer.clone());
                }
            }
            LaunchEvent::Warning { message } => {
                lock(&self.shared.history).warnings.push(message.clone())
            }
            LaunchEvent::Ready { startup_s, .. } => {
                lock(&self.shared.history).startup_s = Some(*startup_s)
            }
            _ => {}
        }
        // Nobody listening is fine: the headless CLI may only watch the status.
        let _ = self.events.send(e);
    }

    fn set(&self, s: Status) {
        self.status.send_replace(s);
    }

    fn is_ready(&self) -> bool {
        matches!(*self.status.borrow(), Status::Ready(_))
    }

    fn is_terminal(&self) -> bool {
        matches!(*self.status.borrow(), Status::Failed(_) | Status::Exited(_))
    }

    fn fail(&self, message: String) {
        let tail = lock(&self.shared.logs).tail(FAILURE_TAIL_LINES);
        let full = if self.limit_kind == LimitKind::Attach {
            // An attached endpoint has no log here; saying so on every failure is noise.
            message
        } else if tail.is_empty() {
            format!("{message} (no log lines)")
        } else {
            format!(
                "{message}; last {} log lines:\n{}",
                tail.len(),
                tail.join("\n")
            )
        };
        self.emit(LaunchEvent::Failed {
            message: full.clone(),
        });
        self.set(Status::Failed(full));
    }

    /// Keeps the first vLLM version a start-up line announces, and warns when it is not the
    /// release the launch was rendered for.
    fn note_banner(&self, line: &str) {
        if lock(&self.shared.history).vllm_version.is_some() {
            return;
        }
        let Some(seen) = super::dialect::banner_version(line) else {
            return;
        };
        lock(&self.shared.history).vllm_version = Some(seen.to_string());
        let rendered = self
            .rendered_for_vllm
            .as_deref()
            .and_then(crate::flags::versions::VllmVersion::parse);
        if let Some(r) = rendered
            && !crate::flags::versions::same_names(&r, &seen)
        {
            self.emit(LaunchEvent::Warning {
                message: format!(
                    "the image announces vLLM {seen}, but the launch was rendered for vLLM {r}, which says some names differently: they may be ignored or refused (see \"vLLM versions\" in docs/flags.md)"
                ),
            });
        }
    }

    fn on_line(&self, stream: LogStream, line: String, phase: &mut Phase) {
        let file_error = {
            let mut logs = lock(&self.shared.logs);
            logs.push(stream, &line);
            logs.take_file_error()
        };
        if let Some(e) = file_error {
            self.emit(LaunchEvent::Warning { message: e });
        }
        self.note_banner(&line);
        let unknown = self.rules.unknown_env(&line);
        let new_evidence = lock(&self.shared.scanner).scan(&line, unknown);
        let fatal = self.rules.fatal_match(&line).map(str::to_string);
        let new_phase = self.rules.phase_of(&line);
        self.emit(LaunchEvent::Log { stream, line });
        // The ready probe can win the race against the log pipe: a kernel-path line read
        // after the verdict was shown refreshes it.
        if new_evidence && self.is_ready() {
            let report = lock(&self.shared.scanner).report();
            self.emit(LaunchEvent::Verdict { report });
        }
        if let Some(p) = new_phase
            && p > *phase
            && !self.is_ready()
            && !self.is_terminal()
        {
            *phase = p;
            self.set(Status::Starting(p));
            self.emit(LaunchEvent::Phase { phase: p });
        }
        if let Some(pattern) = fatal
            && !self.is_terminal()
        {
            self.fail(format!("fatal log line (pattern {pattern:?})"));
        }
    }

    async fn run(self, mut source: mpsc::Receiver<SourceMsg>, probe: ReadyProbe, poll: Duration) {
        // Every probe's outcome comes back as it happens: the screen shows why a start is
        // stuck while it is stuck, not only when the limit fires.
        let (probe_tx, mut probes) = mpsc::channel::<Result<String, ProbeAnswer>>(4);
        // An attached endpoint is probed at once: it may be up already, and an early
        // "connection refused" tells the operator the probes are running. A target mxtune
        // started is first given one poll interval, so that the lines it logged on its way up
        // are read before a ready answer computes the verdict from them.
        let probe_at_once = self.limit_kind == LimitKind::Attach;
        let probe_task = tokio::spawn(async move {
            if !probe_at_once {
                tokio::time::sleep(poll).await;
            }
            loop {
                let outcome = probe.check().await;
                let ready = outcome.is_ok();
                if probe_tx.send(outcome).await.is_err() || ready {
                    return;
                }
                tokio::time::sleep(poll).await;
            }
        });
        let mut last_probe: Option<ProbeAnswer> = None;
        let mut probes_open = true;
        let mut phase = Phase::Starting;
        let mut last_line = Instant::now();
        let mut quiet_warned = false;
        let mut source_open = true;
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                msg = source.recv(), if source_open => match msg {
                    Some(SourceMsg::Line(stream, line)) => {
                        last_line = Instant::now();
                        quiet_warned = false;
                        self.on_line(stream, line, &mut phase);
                    }
                    Some(SourceMsg::Event(e)) => self.emit(e),
                    Some(SourceMsg::Fail(message)) => {
                        if !self.is_ready() && !self.is_terminal() {
                            self.fail(message);
                        }
                    }
                    Some(SourceMsg::Exited(exit)) => {
                        if !self.is_ready() && !self.is_terminal() {
                            self.fail(format!("exited before it was ready ({exit})"));
                        }
                        self.emit(LaunchEvent::Phase { phase: Phase::Exited });
                        self.emit(LaunchEvent::Exited { exit: exit.clone() });
                        if !matches!(*self.status.borrow(), Status::Failed(_)) {
                            self.set(Status::Exited(exit));
                        }
                        break;
                    }
                    None => source_open = false,
                },
                outcome = probes.recv(), if probes_open && !self.is_ready() && !self.is_terminal() => {
                    let model = match outcome {
                        Some(Ok(model)) => model,
                        Some(Err(answer)) => {
                            last_probe = Some(answer.clone());
                            self.emit(LaunchEvent::Probe { answer });
                            continue;
                        }
                        None => {
                            probes_open = false;
                            continue;
                        }
                    };
                    // Lines already delivered count towards the verdict.
                    while let Ok(SourceMsg::Line(stream, line)) = source.try_recv() {
                        self.on_line(stream, line, &mut phase);
                    }
                    let startup_s = self.started.elapsed().as_secs_f64();
                    let url = self.url.clone();
                    self.set(Status::Ready(ReadyInfo { url: url.clone(), model, startup_s }));
                    self.emit(LaunchEvent::Phase { phase: Phase::Ready });
                    self.emit(LaunchEvent::Ready { url, startup_s });
                    let report = lock(&self.shared.scanner).report();
                    for w in report.warnings() {
                        self.emit(LaunchEvent::Warning { message: w });
                    }
                    self.emit(LaunchEvent::Verdict { report });
                }
                _ = tick.tick() => {
                    if self.is_ready() || self.is_terminal() {
                        continue;
                    }
                    if self.started.elapsed() > self.limit {
                        self.fail(limit_failure(self.limit_kind, self.limit, phase, last_probe.as_ref()));
                    // An attached endpoint has no log that could be quiet.
                    } else if self.limit_kind != LimitKind::Attach
                        && !quiet_warned
                        && last_line.elapsed() > self.quiet_warning
                    {
                        quiet_warned = true;
                        self.emit(LaunchEvent::Warning {
                            message: format!(
                                "no log line for {} s (phase: {phase}); JIT and graph capture can be slow, but graph capture has hung before",
                                last_line.elapsed().as_secs()
                            ),
                        });
                    }
                }
            }
        }
        probe_task.abort();
    }
}
