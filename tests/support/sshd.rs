//! A throwaway OpenSSH server on 127.0.0.1 standing in for a remote host: its own host key,
//! a user key for the current user, a client configuration naming both, all in a temporary
//! directory; the server is this test's child and ends with it.
//! Without sshd these tests skip with a message; `MXTUNE_TEST_SSHD=require` makes that fail.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";
/// The `Host` alias of the client configuration.
pub const ALIAS: &str = "mxtune-test-sshd";

/// A running sshd and the files to reach it.
pub struct Sshd {
    child: Child,
    /// The temporary directory holding keys, configurations and logs.
    pub dir: tempfile::TempDir,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    /// The client configuration (`ssh -F`) with the alias [`ALIAS`].
    pub client_config: PathBuf,
}

fn keygen(path: &Path) {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .output()
        .expect("run ssh-keygen");
    assert!(
        out.status.success(),
        "ssh-keygen: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn user_name() -> String {
    let out = Command::new("id").arg("-un").output().expect("run id -un");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Whether the tests must not skip for want of sshd.
fn required() -> bool {
    std::env::var("MXTUNE_TEST_SSHD").as_deref() == Ok("require")
}

/// Starts an sshd, or `None` with a visible skip message when OpenSSH's server or client is
/// missing (a failure with `MXTUNE_TEST_SSHD=require`).
pub fn sshd_or_skip(test: &str) -> Option<Sshd> {
    let missing = if !Path::new(SSHD).exists() {
        Some(format!(
            "{SSHD} is missing (apt-get install openssh-server)"
        ))
    } else if Command::new("ssh")
        .arg("-V")
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        Some("no ssh client (apt-get install openssh-client)".to_string())
    } else {
        None
    };
    if let Some(why) = missing {
        if required() {
            panic!("{test}: MXTUNE_TEST_SSHD=require but {why}");
        }
        eprintln!("SKIPPED {test}: {why}; set MXTUNE_TEST_SSHD=require to make this a failure");
        return None;
    }
    Some(Sshd::start(""))
}

impl Sshd {
    /// A server whose configuration ends with `extra` (sshd_config lines).
    pub fn with_config(extra: &str) -> Sshd {
        Sshd::start(extra)
    }

    fn start(extra: &str) -> Sshd {
        let dir = tempfile::Builder::new()
            .prefix("mxtune-sshd-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        keygen(&d.join("host_key"));
        keygen(&d.join("id_ed25519"));
        std::fs::copy(d.join("id_ed25519.pub"), d.join("authorized_keys")).unwrap();
        // sshd started by root wants its privilege-separation directory.
        if unsafe { libc::geteuid() } == 0 {
            let _ = std::fs::create_dir_all("/run/sshd");
        }
        let port = super::free_port();
        let config = format!(
            "ListenAddress 127.0.0.1\n\
             HostKey {d}/host_key\n\
             PidFile none\n\
             AuthorizedKeysFile {d}/authorized_keys\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             PubkeyAuthentication yes\n\
             UsePAM no\n\
             StrictModes no\n\
             PermitRootLogin prohibit-password\n\
             AllowTcpForwarding yes\n\
             AllowStreamLocalForwarding yes\n",
            d = d.display()
        );
        // sshd takes the first value it reads for a keyword: the extra lines go first.
        let config = format!("{extra}{config}");
        std::fs::write(d.join("sshd_config"), config).unwrap();
        let log = std::fs::File::create(d.join("sshd.log")).unwrap();
        let mut child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .arg("-p")
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start sshd");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "sshd exited at once ({status}): {}",
                    std::fs::read_to_string(d.join("sshd.log")).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "sshd did not listen within 10 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        let host_key = std::fs::read_to_string(d.join("host_key.pub")).unwrap();
        std::fs::write(
            d.join("known_hosts"),
            format!("[127.0.0.1]:{port} {host_key}"),
        )
        .unwrap();
        let client_config = d.join("ssh_config");
        std::fs::write(
            &client_config,
            format!(
                "Host {ALIAS}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {d}/id_ed25519\n  IdentitiesOnly yes\n  UserKnownHostsFile {d}/known_hosts\n  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n",
                user = user_name(),
                d = d.display()
            ),
        )
        .unwrap();
        Sshd {
            child,
            dir,
            port,
            client_config,
        }
    }

    /// A `[[host]]` entry reaching this server, with `mxtune` as the remote command.
    pub fn host_entry(&self, name: &str, mxtune: &str) -> String {
        format!(
            "[[host]]\nname = {name:?}\nssh = {ALIAS:?}\nssh_config = {:?}\nmxtune = {mxtune:?}\n",
            self.client_config.display().to_string()
        )
    }

    /// The library's view of the entry [`Sshd::host_entry`] writes.
    pub fn host(&self, name: &str, mxtune: &str) -> mxtune::hosts::Host {
        mxtune::hosts::Host {
            name: name.into(),
            ssh: ALIAS.into(),
            ssh_config: Some(self.client_config.clone()),
            docker_socket: mxtune::hosts::DEFAULT_DOCKER_SOCKET.into(),
            mxtune: mxtune.into(),
            nccl: Default::default(),
            defined_at: "test".into(),
        }
    }

    /// A configuration directory (for `XDG_CONFIG_HOME`) whose `mxtune/hosts.toml` holds
    /// `entries`.
    pub fn config_home(&self, entries: &str) -> PathBuf {
        let home = self.dir.path().join("config");
        std::fs::create_dir_all(home.join("mxtune")).unwrap();
        std::fs::write(home.join("mxtune/hosts.toml"), entries).unwrap();
        home
    }

    /// What sshd logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
