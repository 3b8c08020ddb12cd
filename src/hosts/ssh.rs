//! Reaching a host through the system's OpenSSH client: one-off commands, the remote mxtune's
//! version, and the tunnel that carries its Docker socket and the target's API port.
//!
//! Every `ssh` runs with `BatchMode=yes` (a password or host-key prompt would hang a panel;
//! it fails instead, and the message says what to do) and `ControlPath=none`, so a
//! `ControlMaster` in the user's configuration cannot take over the tunnel's forwards and
//! keep them alive after mxtune is gone. Keys, ports and jump hosts come from the user's
//! SSH configuration (or the entry's `ssh_config`).

use super::Host;
use anyhow::{Context, Result, bail};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Seconds ssh may take to connect before it gives up.
pub const CONNECT_TIMEOUT_S: u64 = 10;

/// `ssh` with mxtune's fixed options and the entry's configuration file, up to (not
/// including) the destination.
fn ssh_command(host: &Host) -> Command {
    let mut c = Command::new("ssh");
    c.args(["-o", "BatchMode=yes"])
        .args(["-o", &format!("ConnectTimeout={CONNECT_TIMEOUT_S}")])
        .args(["-o", "ControlPath=none"])
        .args(["-o", "ServerAliveInterval=15"])
        .args(["-o", "ServerAliveCountMax=3"]);
    if let Some(cfg) = &host.ssh_config {
        c.arg("-F").arg(cfg);
    }
    // ssh ends with the mxtune that started it, even one killed without a chance to clean
    // up (Linux: the parent-death signal; `pre_exec` runs in the child before exec).
    // SAFETY: prctl is async-signal-safe and touches only the child's own state.
    unsafe {
        c.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    c
}

/// `ssh -F FILE` when the entry names a configuration file, for the hints.
fn ssh_words(host: &Host) -> String {
    match &host.ssh_config {
        Some(cfg) => format!("ssh -F {}", cfg.display()),
        None => "ssh".to_string(),
    }
}

/// `ssh … -- DEST 'COMMAND'`: runs one command line on the host. `command` is given to the
/// remote shell as it is (so `~` in the entry's `mxtune` expands there); quote arguments
/// with [`quote`].
pub fn remote(host: &Host, command: &str) -> Command {
    let mut c = ssh_command(host);
    c.arg("-T").arg("--").arg(&host.ssh).arg(command);
    c.stdin(Stdio::null());
    c
}

/// One word quoted for the remote shell.
pub fn quote(word: &str) -> String {
    shell_words::quote(word).into_owned()
}

/// What to tell the operator when ssh itself failed (exit 255), from its stderr.
pub fn explain_ssh_failure(host: &Host, stderr: &str) -> String {
    let last = stderr
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("no message");
    let ssh = ssh_words(host);
    let hint = if stderr.contains("Host key verification failed") {
        format!(
            "the host key of {} is not known yet: run `{ssh} {}` once by hand and accept it",
            host.ssh, host.ssh
        )
    } else if stderr.contains("Permission denied") {
        format!(
            "log-in needs a key mxtune can use without asking (key in ssh-agent or an unencrypted key in your SSH config): check with `{ssh} -o BatchMode=yes {} true`",
            host.ssh
        )
    } else {
        format!(
            "check that `{ssh} -o BatchMode=yes {} true` works from this shell",
            host.ssh
        )
    };
    format!(
        "cannot reach host {} over ssh ({}): {last}; {hint}",
        host.name, host.ssh
    )
}

/// Runs `command` on the host and returns its stdout; a failure of ssh, or of the command,
/// is an error naming the host.
pub fn run(host: &Host, command: &str) -> Result<String> {
    let out = remote(host, command)
        .output()
        .context("cannot run ssh: is the OpenSSH client installed (`ssh` on PATH)?")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        Some(255) => bail!("{}", explain_ssh_failure(host, &stderr)),
        code => bail!(
            "`{command}` failed on host {} ({}): {}",
            host.name,
            code.map(|c| format!("exit {c}"))
                .unwrap_or_else(|| "killed".into()),
            stderr.trim()
        ),
    }
}

/// `mxtune X.Y.Z`, as `mxtune --version` prints it here.
pub fn local_version() -> String {
    format!("mxtune {}", env!("CARGO_PKG_VERSION"))
}

/// Checks that the host runs the same mxtune as this one (`mxtune --version` there), and
/// returns what it printed. Missing, not mxtune, or another version are errors saying what
/// to do.
pub fn check_remote_mxtune(host: &Host) -> Result<String> {
    let command = format!("{} --version", host.mxtune);
    let out = remote(host, &command)
        .output()
        .context("cannot run ssh: is the OpenSSH client installed (`ssh` on PATH)?")?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {}
        Some(255) => bail!("{}", explain_ssh_failure(host, &stderr)),
        Some(126 | 127) => bail!(
            "mxtune is not installed on host {} (`{}` is not a command there: {}): install the same mxtune there (docs/multi-host.md) or set mxtune = \"/path/to/mxtune\" for this host in {}",
            host.name,
            host.mxtune,
            stderr.trim(),
            host.defined_at
        ),
        code => bail!(
            "`{command}` failed on host {} (exit {}): {}",
            host.name,
            code.map(|c| c.to_string())
                .unwrap_or_else(|| "by signal".into()),
            stderr.trim()
        ),
    }
    let local = local_version();
    if !stdout.starts_with("mxtune ") {
        bail!(
            "`{command}` on host {} printed {stdout:?}, which is not mxtune's version line: point mxtune = \"…\" of this host ({}) at mxtune",
            host.name,
            host.defined_at
        );
    }
    if stdout != local {
        bail!(
            "host {} runs {stdout}, this is {local}: the two ends must be the same version; install this one there (docs/multi-host.md)",
            host.name
        );
    }
    Ok(stdout)
}

/// A free TCP port on 127.0.0.1 (bound, then released for ssh to bind).
fn free_local_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")
        .context("cannot find a free local port for the SSH tunnel")?
        .local_addr()?
        .port())
}

/// An `ssh -N` process forwarding a host's Docker socket to a local socket, and optionally
/// one of its TCP ports to a local port. It lives as long as this value: dropping it ends
/// ssh and removes the local socket and its directory.
pub struct Tunnel {
    child: Child,
    dir: PathBuf,
    /// The host's name, for messages.
    pub host: String,
    /// The local end of the host's Docker socket.
    pub docker_socket: PathBuf,
    /// The forwarded port: (local port on 127.0.0.1, the host's port).
    pub port: Option<(u16, u16)>,
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnel")
            .field("host", &self.host)
            .field("docker_socket", &self.docker_socket)
            .field("port", &self.port)
            .finish()
    }
}

impl Tunnel {
    /// Opens the tunnel and waits until ssh has logged in and listens locally. `port`: an
    /// address and TCP port as seen on the host to forward as well (the target's API).
    pub async fn open(host: &Host, port: Option<(&str, u16)>) -> Result<Tunnel> {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        remove_stale_dirs(Path::new("/tmp"));
        // /tmp, not $TMPDIR: a Unix socket path must stay under ~100 bytes.
        let dir = PathBuf::from(format!(
            "/tmp/mxtune-ssh-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir)
            .with_context(|| format!("cannot create {} for the SSH tunnel", dir.display()))?;
        // Only this user may talk to the forwarded Docker socket.
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        let docker_socket = dir.join("docker.sock");
        let log = dir.join("ssh.log");
        let result = Self::spawn(host, port, &dir, &docker_socket, &log);
        let (child, port) = match result {
            Ok(x) => x,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let mut tunnel = Tunnel {
            child,
            dir,
            host: host.name.clone(),
            docker_socket,
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(CONNECT_TIMEOUT_S + 10);
        loop {
            if let Some(status) = tunnel.child.try_wait().context("waiting for ssh")? {
                let stderr = std::fs::read_to_string(&log).unwrap_or_default();
                if status.code() == Some(255) && !stderr.contains("forward") {
                    bail!("{}", explain_ssh_failure(host, &stderr));
                }
                bail!(
                    "the SSH tunnel to host {} ({}) ended at once ({status}): {}",
                    host.name,
                    host.ssh,
                    stderr.trim()
                );
            }
            if tunnel.docker_socket.exists() {
                return Ok(tunnel);
            }
            if Instant::now() > deadline {
                bail!(
                    "the SSH tunnel to host {} ({}) did not come up within {} s: {}",
                    host.name,
                    host.ssh,
                    CONNECT_TIMEOUT_S + 10,
                    std::fs::read_to_string(&log).unwrap_or_default().trim()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn spawn(
        host: &Host,
        port: Option<(&str, u16)>,
        dir: &Path,
        docker_socket: &Path,
        log: &Path,
    ) -> Result<(Child, Option<(u16, u16)>)> {
        let log_file = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let mut c = ssh_command(host);
        // ExitOnForwardFailure: a forward that cannot be set up ends ssh, so it is an error
        // here and never a tunnel that silently carries nothing.
        c.args(["-N", "-T", "-o", "ExitOnForwardFailure=yes"]);
        c.arg("-L").arg(format!(
            "{}:{}",
            docker_socket.display(),
            host.docker_socket
        ));
        let forwarded = match port {
            Some((addr, remote)) => {
                let local = free_local_port()?;
                let addr = if addr.contains(':') {
                    format!("[{addr}]")
                } else {
                    addr.to_string()
                };
                c.arg("-L")
                    .arg(format!("127.0.0.1:{local}:{addr}:{remote}"));
                Some((local, remote))
            }
            None => None,
        };
        c.arg("--").arg(&host.ssh);
        // ssh's messages go to a file: a pipe nobody reads would fill up and stall the
        // tunnel (ssh logs every refused connection while a target starts).
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file));
        let child = c
            .spawn()
            .context("cannot run ssh: is the OpenSSH client installed (`ssh` on PATH)?")?;
        Ok((child, forwarded))
    }

    /// The local URL of the forwarded port.
    pub fn url(&self) -> Option<String> {
        self.port.map(|(l, _)| format!("http://127.0.0.1:{l}"))
    }

    /// The directory holding the local socket (removed when the tunnel is dropped).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The ssh process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines ssh logged (e.g. `open failed: administratively prohibited` when the
    /// host's sshd forbids forwarding), on one line; empty when it said nothing.
    pub fn ssh_said(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("ssh.log")).unwrap_or_default();
        let lines: Vec<&str> = log
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        lines[lines.len().saturating_sub(3)..].join(" / ")
    }
}

/// Removes the tunnel directories of mxtune processes that are gone (killed before their
/// tunnel was dropped; their ssh ended with them): this user's `mxtune-ssh-PID-N` only.
fn remove_stale_dirs(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("mxtune-ssh-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        use std::os::unix::fs::MetadataExt;
        let ours = e.metadata().is_ok_and(|m| m.is_dir() && m.uid() == me);
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if ours && gone {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Host {
        Host {
            name: "spark2".into(),
            ssh: "me@spark2".into(),
            ssh_config: Some("/cfg/ssh".into()),
            docker_socket: "/var/run/docker.sock".into(),
            mxtune: "mxtune".into(),
            nccl: Default::default(),
            defined_at: "hosts.toml:2".into(),
        }
    }

    #[test]
    fn remote_command_ends_options_before_the_destination() {
        let c = remote(&host(), "mxtune --version");
        let args: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(c.get_program(), "ssh");
        assert!(args.windows(2).any(|w| w == ["-o", "BatchMode=yes"]));
        assert!(args.windows(2).any(|w| w == ["-o", "ControlPath=none"]));
        assert!(args.windows(2).any(|w| w == ["-F", "/cfg/ssh"]));
        assert_eq!(
            &args[args.len() - 3..],
            ["--", "me@spark2", "mxtune --version"]
        );
    }

    #[test]
    fn ssh_failures_say_what_to_do() {
        let m = explain_ssh_failure(&host(), "Host key verification failed.\n");
        assert!(
            m.contains("run `ssh -F /cfg/ssh me@spark2` once by hand"),
            "{m}"
        );
        let m = explain_ssh_failure(&host(), "me@spark2: Permission denied (publickey).\n");
        assert!(m.contains("ssh-agent"), "{m}");
        let m = explain_ssh_failure(&host(), "ssh: connect to host spark2 port 22: No route\n");
        assert!(m.contains("No route") && m.contains("host spark2"), "{m}");
    }

    #[test]
    fn quoting_keeps_urls_as_one_word() {
        assert_eq!(quote("http://a:1/x?y=1&z"), "'http://a:1/x?y=1&z'");
        assert_eq!(quote("plain"), "plain");
    }
}
