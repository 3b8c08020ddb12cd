//! The engine target: `mxtune serve …` (or another engine binary) as a child process in its
//! own process group. Its stdout/stderr go to the log file, which the follower tails: so the
//! engine keeps running (and logging) after a headless `mxtune launch` exits, and a later
//! mxtune can stop it from the state file.

use super::docker::connect_host;
use super::follow::{Launch, LaunchOptions, SourceMsg};
use super::logbuf::LineSplitter;
use super::ready::ReadyProbe;
use super::state::{self, EngineRecord};
use super::target::{Target, TargetFacts};
use super::{ExitInfo, LaunchEvent, LogStream};
use crate::vocab::LaunchSpec;
use anyhow::{Context, Result, bail};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// A running engine child.
#[derive(Debug)]
pub struct EngineTarget {
    /// Process id (also its process group id).
    pub pid: u32,
    /// Program that was started.
    pub program: PathBuf,
    /// Base URL of the API.
    pub url: String,
    /// File receiving the engine's stdout and stderr.
    pub log_path: PathBuf,
    state_dir: Option<PathBuf>,
    run_id: String,
    exited: watch::Receiver<Option<ExitInfo>>,
}

/// The program to run for `argv[0]`: `mxtune` means this very binary.
pub fn resolve_program(argv0: &str, program: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = program {
        return Ok(p.to_path_buf());
    }
    if argv0 == "mxtune" {
        return std::env::current_exe()
            .context("cannot find the running mxtune binary to start `mxtune serve`");
    }
    Ok(PathBuf::from(argv0))
}

impl EngineTarget {
    /// Starts the engine described by `spec.argv` (argv[0] replaced by `program` when given)
    /// and follows it. `state_dir` (the runs directory) gets a record so `mxtune stop` finds it.
    pub async fn launch(
        program: Option<&Path>,
        spec: &LaunchSpec,
        opts: &LaunchOptions,
        state_dir: Option<&Path>,
        events: mpsc::UnboundedSender<LaunchEvent>,
    ) -> Result<Launch> {
        let Some((argv0, args)) = spec.argv.split_first() else {
            bail!("the launch spec has an empty argv: nothing to start");
        };
        let program = resolve_program(argv0, program)?;
        let log_path = opts
            .log_path
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join(format!("mxtune-{}.log", opts.run_id)));
        if let Some(dir) = log_path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create log directory {}", dir.display()))?;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("cannot open engine log file {}", log_path.display()))?;
        let start_offset = log.metadata().map(|m| m.len()).unwrap_or(0);
        let log_err = log
            .try_clone()
            .with_context(|| format!("cannot reuse log file {}", log_path.display()))?;
        let mut cmd = std::process::Command::new(&program);
        cmd.args(args)
            .envs(&spec.env)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log_err)
            // Its own group, so stop reaches every process the engine forks (compilers too).
            .process_group(0);
        let mut child = tokio::process::Command::from(cmd)
            .spawn()
            .with_context(|| {
                format!(
                    "cannot start engine {} (argv {:?})",
                    program.display(),
                    spec.argv
                )
            })?;
        let pid = child
            .id()
            .context("engine exited before its pid could be read")?;
        let (exit_tx, exited) = watch::channel(None);
        tokio::spawn(async move {
            let exit = match child.wait().await {
                Ok(status) => ExitInfo {
                    code: status.code().map(i64::from),
                    signal: status.signal(),
                    ..Default::default()
                },
                Err(e) => ExitInfo {
                    detail: Some(format!("waiting for the engine failed: {e}")),
                    ..Default::default()
                },
            };
            exit_tx.send_replace(Some(exit));
        });
        let url = format!("http://{}:{}", connect_host(&spec.host), spec.port);
        if let Some(dir) = state_dir {
            state::add(
                dir,
                EngineRecord {
                    run_id: opts.run_id.clone(),
                    pid,
                    start_ticks: state::proc_start_ticks(pid),
                    program: program.display().to_string(),
                    url: url.clone(),
                    log_path: log_path.display().to_string(),
                },
            )?;
        }
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(tail_log(log_path.clone(), start_offset, exited.clone(), tx));
        let probe = ReadyProbe::new(
            &url,
            &spec.served_model_name,
            opts.api_key.clone(),
            opts.probe_timeout,
        )?;
        let target = EngineTarget {
            pid,
            program,
            url,
            log_path,
            state_dir: state_dir.map(Path::to_path_buf),
            run_id: opts.run_id.clone(),
            exited,
        };
        // The engine writes the log file itself; the buffer must not write it a second time.
        let mut follow_opts = opts.clone();
        follow_opts.log_path = None;
        Launch::follow(
            Target::Engine(target),
            rx,
            probe,
            &spec.checks,
            &follow_opts,
            events,
        )
    }

    /// SIGTERM to the process group, up to `grace` for it to exit, then SIGKILL.
    pub async fn stop(&mut self, grace: Duration) -> Result<String> {
        if self.exited.borrow().is_some() {
            self.forget();
            return Ok(format!("engine process {} had already exited", self.pid));
        }
        signal_group(self.pid, libc::SIGTERM)?;
        let mut exited = self.exited.clone();
        let waited = tokio::time::timeout(grace, exited.wait_for(Option::is_some))
            .await
            .is_ok();
        let how = if waited {
            "stopped (SIGTERM)"
        } else {
            signal_group(self.pid, libc::SIGKILL)?;
            let _ = tokio::time::timeout(Duration::from_secs(10), exited.wait_for(Option::is_some))
                .await;
            "killed (SIGKILL after the grace period)"
        };
        self.forget();
        Ok(format!("engine process {} {how}", self.pid))
    }

    fn forget(&self) {
        if let Some(dir) = &self.state_dir {
            // The record only helps a later `mxtune stop`; a stale one is checked before use.
            let _ = state::remove(dir, &self.run_id);
        }
    }

    /// Facts for the run record.
    pub fn facts(&self) -> TargetFacts {
        TargetFacts {
            kind: "engine".into(),
            name: format!("pid {}", self.pid),
            url: self.url.clone(),
            pid: Some(self.pid),
            program: Some(self.program.display().to_string()),
            ..Default::default()
        }
    }
}

/// Sends `signal` to the process group led by `pid`.
pub fn signal_group(pid: u32, signal: i32) -> Result<()> {
    let pgid = libc::pid_t::try_from(pid).context("pid out of range")?;
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
    let rc = unsafe { libc::kill(-pgid, signal) };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        return Ok(());
    }
    Err(err).with_context(|| format!("cannot send signal {signal} to process group {pid}"))
}

/// Follows the engine's log file from `offset` until the engine exited and the file is drained.
async fn tail_log(
    path: PathBuf,
    offset: u64,
    mut exited: watch::Receiver<Option<ExitInfo>>,
    tx: mpsc::Sender<SourceMsg>,
) {
    let mut file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) => {
            let _ = tx
                .send(SourceMsg::Event(LaunchEvent::Warning {
                    message: format!("cannot read engine log {}: {e}", path.display()),
                }))
                .await;
            let exit = exited
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|e| e.clone())
                .unwrap_or_default();
            let _ = tx.send(SourceMsg::Exited(exit)).await;
            return;
        }
    };
    if let Err(e) = file.seek(SeekFrom::Start(offset)) {
        let _ = tx
            .send(SourceMsg::Event(LaunchEvent::Warning {
                message: format!("cannot seek in engine log {}: {e}", path.display()),
            }))
            .await;
    }
    let mut splitter = LineSplitter::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // Read the exit status before draining, so no line written before the exit is lost.
        let exit = exited.borrow().clone();
        loop {
            match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    for line in splitter.feed(&buf[..n]) {
                        if tx
                            .send(SourceMsg::Line(LogStream::Combined, line))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                }
                Err(e) => {
                    let _ = tx
                        .send(SourceMsg::Event(LaunchEvent::Warning {
                            message: format!("reading engine log {} failed: {e}", path.display()),
                        }))
                        .await;
                    break;
                }
            }
        }
        if let Some(exit) = exit {
            if let Some(line) = splitter.finish() {
                let _ = tx.send(SourceMsg::Line(LogStream::Combined, line)).await;
            }
            let _ = tx.send(SourceMsg::Exited(exit)).await;
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = exited.changed() => {}
        }
    }
}
