//! Telemetry of a remote host: `mxtune monitor --json` runs there over SSH and each line it
//! prints is read back into a [`Sample`], so every consumer sees a remote host exactly as
//! it sees this one.

use super::Host;
use super::ssh::{self, quote};
use crate::monitor::collector::DEFAULT_RATE_HZ;
use crate::monitor::{Sample, Summary, clamp_rate};
use anyhow::{Context, Result, anyhow, bail};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

/// What to ask the remote monitor for (the options of `mxtune monitor`).
#[derive(Debug, Clone, Default)]
pub struct RemoteMonitorArgs {
    /// Samples per second on the remote.
    pub rate: Option<f64>,
    /// The target's /metrics URL as seen from the remote host.
    pub url: Option<String>,
    /// A process on the remote host to watch.
    pub pid: Option<u32>,
    /// One sample, then the remote command ends.
    pub once: bool,
}

/// The remote command line for these arguments.
pub fn command_line(host: &Host, args: &RemoteMonitorArgs) -> String {
    let mut cmd = format!("{} monitor --json", host.mxtune);
    if args.once {
        cmd.push_str(" --once");
    }
    if let Some(r) = args.rate {
        cmd.push_str(&format!(" --rate {r}"));
    }
    if let Some(u) = &args.url {
        cmd.push_str(&format!(" --url {}", quote(u)));
    }
    if let Some(p) = args.pid {
        cmd.push_str(&format!(" --pid {p}"));
    }
    cmd
}

/// Reads one line of `mxtune monitor --json` back into a sample.
pub fn parse_line(host: &str, line: &str) -> Result<Sample> {
    serde_json::from_str(line).with_context(|| {
        let shown: String = line.chars().take(200).collect();
        format!(
            "host {host}: a line of `mxtune monitor --json` is not a sample (is the remote mxtune the same version?): {shown}"
        )
    })
}

/// A running `mxtune monitor --json` on a host; the ssh process ends when this is dropped.
pub struct RemoteMonitor {
    host: Host,
    /// Shared with [`RemoteRun::stop`], which kills it from another thread.
    child: Arc<Mutex<Child>>,
    lines: BufReader<ChildStdout>,
    /// The last lines ssh and the remote monitor wrote to stderr, for error messages.
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
}

/// Lines of the remote stderr kept for an error message.
const STDERR_TAIL: usize = 10;

impl RemoteMonitor {
    /// Checks the remote mxtune's version, then starts its monitor. Its stderr (notes such
    /// as a clamped rate, ssh's warnings) is kept for error messages and, with `echo`,
    /// printed on this process's stderr as it comes (not in the panel, where it would write
    /// over the screen).
    pub fn start(host: &Host, args: &RemoteMonitorArgs, echo: bool) -> Result<RemoteMonitor> {
        ssh::check_remote_mxtune(host)?;
        Self::spawn(host, args, echo)
    }

    /// Starts the remote monitor without checking the version (the caller did, once).
    fn spawn(host: &Host, args: &RemoteMonitorArgs, echo: bool) -> Result<RemoteMonitor> {
        let mut child = ssh::remote(host, &command_line(host, args))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot run ssh: is the OpenSSH client installed (`ssh` on PATH)?")?;
        let stdout = child.stdout.take().context("ssh's stdout")?;
        let stderr = child.stderr.take().context("ssh's stderr")?;
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let tail = stderr_tail.clone();
        // Ends when ssh closes its stderr, i.e. when ssh ends.
        std::thread::Builder::new()
            .name("host-monitor-stderr".into())
            .spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if echo {
                        crate::errln!("{line}");
                    }
                    if let Ok(mut t) = tail.lock() {
                        if t.len() == STDERR_TAIL {
                            t.pop_front();
                        }
                        t.push_back(line);
                    }
                }
            })
            .context("cannot start the thread reading the remote monitor's messages")?;
        Ok(RemoteMonitor {
            host: host.clone(),
            child: Arc::new(Mutex::new(child)),
            lines: BufReader::new(stdout),
            stderr_tail,
        })
    }

    /// What the remote end last said on stderr, on one line.
    fn said(&self) -> String {
        let t = self
            .stderr_tail
            .lock()
            .map(|t| t.iter().cloned().collect::<Vec<_>>().join(" / "))
            .unwrap_or_default();
        if t.is_empty() { "no message".into() } else { t }
    }

    /// The next sample; `None` when the remote monitor ended normally (after `--once`).
    pub fn next_sample(&mut self) -> Result<Option<Sample>> {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self
                .lines
                .read_line(&mut line)
                .with_context(|| format!("reading the monitor of host {}", self.host.name))?;
            if n == 0 {
                let status = self
                    .child
                    .lock()
                    .map_err(|_| anyhow!("the ssh of the remote monitor is poisoned"))?
                    .wait()
                    .context("waiting for ssh")?;
                // The stderr reader sees the end a moment after stdout does.
                std::thread::sleep(std::time::Duration::from_millis(50));
                return match status.code() {
                    Some(0) => Ok(None),
                    Some(255) => bail!(
                        "the SSH connection to host {} ({}) ended ({status}): {}",
                        self.host.name,
                        self.host.ssh,
                        self.said()
                    ),
                    _ => bail!(
                        "`mxtune monitor` on host {} ended ({status}): {}",
                        self.host.name,
                        self.said()
                    ),
                };
            }
            if !line.trim().is_empty() {
                return parse_line(&self.host.name, line.trim_end()).map(Some);
            }
        }
    }
}

/// One sample of the host (`mxtune monitor --json --once` there, `args.once` implied) for a
/// caller that checked the remote version already with [`ssh::check_remote_mxtune`] and
/// samples again and again (a matrix's cool-down), so each sample costs one ssh, not two.
pub fn sample_once(host: &Host, args: &RemoteMonitorArgs) -> Result<Sample> {
    let args = RemoteMonitorArgs {
        once: true,
        ..args.clone()
    };
    RemoteMonitor::spawn(host, &args, false)?
        .next_sample()?
        .with_context(|| {
            format!(
                "`mxtune monitor --once` on host {} ended without a sample",
                host.name
            )
        })
}

/// The stress level's GPU memory probe on a host: each reading is one sample of its own
/// monitor (the version checked already, as for [`sample_once`]).
pub fn memory_probe(host: &Host) -> Result<crate::monitor::probe::GpuMemoryProbe> {
    let h = host.clone();
    crate::monitor::probe::GpuMemoryProbe::detect_with(
        &format!(" on host {}", host.name),
        Box::new(move || sample_once(&h, &RemoteMonitorArgs::default())),
    )
}

impl Drop for RemoteMonitor {
    fn drop(&mut self) {
        if let Ok(mut c) = self.child.lock() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A host's monitor running for the length of a measurement, every sample folded into a
/// run summary on its own thread: for a target on a host, what the local [`Monitor`] is for
/// one here (the record's `resources`).
///
/// [`Monitor`]: crate::monitor::Monitor
pub struct RemoteRun {
    child: Arc<Mutex<Child>>,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<(Summary, Option<anyhow::Error>)>>,
}

impl RemoteRun {
    /// Starts `mxtune monitor --json` on the host (its version checked already, as for
    /// [`sample_once`]) and returns once its first sample is in, so that even a short
    /// measurement has one; an error when it ends or fails before that.
    pub fn start(host: &Host, args: &RemoteMonitorArgs) -> Result<RemoteRun> {
        let args = RemoteMonitorArgs {
            once: false,
            ..args.clone()
        };
        let mut monitor = RemoteMonitor::spawn(host, &args, false)?;
        let child = monitor.child.clone();
        let stopping = Arc::new(AtomicBool::new(false));
        let stopped = stopping.clone();
        let rate = args.rate.map(clamp_rate).unwrap_or(DEFAULT_RATE_HZ);
        let (first_tx, first_rx) = mpsc::channel::<Result<()>>();
        let name = host.name.clone();
        let thread = std::thread::Builder::new()
            .name("host-monitor-run".into())
            .spawn(move || {
                let mut summary = Summary::new(Some(rate));
                let mut first = Some(first_tx);
                loop {
                    match monitor.next_sample() {
                        Ok(Some(s)) => {
                            summary.add(&s);
                            if let Some(tx) = first.take() {
                                let _ = tx.send(Ok(()));
                            }
                        }
                        Ok(None) => {
                            let e = anyhow!("`mxtune monitor` on host {name} ended by itself");
                            return match first.take() {
                                Some(tx) => {
                                    let _ = tx.send(Err(e));
                                    (summary, None)
                                }
                                None => (summary, Some(e)),
                            };
                        }
                        // Killed by `stop`: the end of the run, not a failure.
                        Err(_) if stopped.load(Ordering::SeqCst) => return (summary, None),
                        Err(e) => {
                            return match first.take() {
                                Some(tx) => {
                                    let _ = tx.send(Err(e));
                                    (summary, None)
                                }
                                None => (summary, Some(e)),
                            };
                        }
                    }
                }
            })
            .context("cannot start the thread reading the remote monitor")?;
        match first_rx.recv() {
            Ok(Ok(())) => Ok(RemoteRun {
                child,
                stopping,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(anyhow!(
                    "the thread reading the monitor of host {} ended before its first sample",
                    host.name
                ))
            }
        }
    }

    /// Ends the remote monitor and returns the summary of its samples, with the error that
    /// ended it early, if one did (the samples before it are kept).
    pub fn stop(mut self) -> (Summary, Option<anyhow::Error>) {
        self.end()
    }

    fn end(&mut self) -> (Summary, Option<anyhow::Error>) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Ok(mut c) = self.child.lock() {
            let _ = c.kill();
        }
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(done)) => done,
            Some(Err(_)) => (
                Summary::default(),
                Some(anyhow!("the thread reading the remote monitor panicked")),
            ),
            None => (Summary::default(), None),
        }
    }
}

impl Drop for RemoteRun {
    /// A measurement that ends early (an error) still ends the remote monitor and its ssh.
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_quotes_the_url() {
        let host = Host {
            name: "h".into(),
            ssh: "h".into(),
            ssh_config: None,
            docker_socket: "/var/run/docker.sock".into(),
            mxtune: "~/.cargo/bin/mxtune".into(),
            nccl: Default::default(),
            defined_at: "f:1".into(),
        };
        let args = RemoteMonitorArgs {
            rate: Some(2.0),
            url: Some("http://127.0.0.1:8000/metrics?a=1&b=2".into()),
            pid: Some(42),
            once: true,
        };
        assert_eq!(
            command_line(&host, &args),
            "~/.cargo/bin/mxtune monitor --json --once --rate 2 --url 'http://127.0.0.1:8000/metrics?a=1&b=2' --pid 42"
        );
    }

    #[test]
    fn a_line_that_is_no_sample_names_the_host() {
        let e = format!("{:#}", parse_line("spark2", "{\"at\": 1}").unwrap_err());
        assert!(
            e.contains("host spark2") && e.contains("same version"),
            "{e}"
        );
    }
}
