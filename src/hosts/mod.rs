//! Remote hosts: `hosts.toml` in mxtune's configuration directory names the machines mxtune
//! may drive over SSH (`--host NAME`), how to reach each one's Docker engine and mxtune, and
//! the network interfaces NCCL should use there.
//!
//! mxtune never stores keys or passwords: the SSH destination is handed to the system's
//! OpenSSH client, so the user's own `~/.ssh/config`, keys and agent decide how to log in
//! (`ssh.rs`). Without a hosts file nothing changes: every command works on this machine.

pub mod cli;
pub mod monitor;
pub mod preflight;
pub mod ssh;

use crate::flags::preset::line_of;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use toml::Spanned;

/// The hosts file's name inside mxtune's configuration directory.
pub const HOSTS_FILE: &str = "hosts.toml";
/// The Docker engine's socket on a remote host when the entry names none.
pub const DEFAULT_DOCKER_SOCKET: &str = "/var/run/docker.sock";
/// The command that runs mxtune on a remote host when the entry names none.
pub const DEFAULT_REMOTE_MXTUNE: &str = "mxtune";

/// `$XDG_CONFIG_HOME/mxtune/hosts.toml`, else `~/.config/mxtune/hosts.toml`; `None` without
/// HOME or XDG_CONFIG_HOME.
pub fn hosts_path() -> Option<PathBuf> {
    crate::flags::preset::config_dir().map(|d| d.join(HOSTS_FILE))
}

/// The interfaces NCCL, Gloo and UCX should use on a host (for a multi-node target).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NcclInterfaces {
    /// `NCCL_SOCKET_IFNAME`, e.g. the ConnectX-7 port `enp1s0f1np1`.
    pub socket_ifname: Option<String>,
    /// `GLOO_SOCKET_IFNAME`.
    pub gloo_socket_ifname: Option<String>,
    /// `NCCL_IB_HCA`, e.g. `rocep1s0f1`.
    pub ib_hca: Option<String>,
    /// `UCX_NET_DEVICES`.
    pub ucx_net_devices: Option<String>,
    /// `VLLM_HOST_IP`: this host's address on the link between the nodes.
    pub host_ip: Option<String>,
}

impl NcclInterfaces {
    /// The environment variables these settings stand for, in a fixed order.
    pub fn env(&self) -> Vec<(&'static str, &str)> {
        [
            ("NCCL_SOCKET_IFNAME", &self.socket_ifname),
            ("GLOO_SOCKET_IFNAME", &self.gloo_socket_ifname),
            ("NCCL_IB_HCA", &self.ib_hca),
            ("UCX_NET_DEVICES", &self.ucx_net_devices),
            ("VLLM_HOST_IP", &self.host_ip),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
        .collect()
    }
}

/// One machine mxtune can drive over SSH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The name used with `--host`.
    pub name: String,
    /// The SSH destination (`user@host`, or a `Host` alias of the user's SSH config).
    pub ssh: String,
    /// An SSH client configuration file to use instead of `~/.ssh/config` (`ssh -F`).
    pub ssh_config: Option<PathBuf>,
    /// The Docker engine's Unix socket on the host, reached through an SSH tunnel.
    pub docker_socket: String,
    /// The command line that runs mxtune on the host (its remote shell expands it).
    pub mxtune: String,
    /// Interfaces for NCCL and friends.
    pub nccl: NcclInterfaces,
    /// The hosts file and the line of this entry's `name`, for messages.
    pub defined_at: String,
}

/// A hosts file's entries, in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hosts {
    /// The file they came from.
    pub file: PathBuf,
    /// The entries.
    pub hosts: Vec<Host>,
}

/// A hosts file that cannot be used: the file, the line when known, what is wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct HostsError {
    /// The file at fault.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// What is wrong and what to do.
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostsDoc {
    #[serde(default)]
    host: Vec<HostDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostDoc {
    name: Spanned<String>,
    ssh: Spanned<String>,
    ssh_config: Option<Spanned<String>>,
    docker: Option<Spanned<String>>,
    mxtune: Option<Spanned<String>>,
    #[serde(default)]
    nccl: NcclInterfaces,
}

fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(path),
    }
}

impl Hosts {
    /// Parses a hosts file's text; `file` is only used in messages and `defined_at`.
    pub fn parse(file: &Path, text: &str) -> Result<Hosts, HostsError> {
        let err = |offset: Option<usize>, message: String| HostsError {
            file: file.to_path_buf(),
            line: offset.map(|o| line_of(text, o)),
            message,
        };
        let doc: HostsDoc = toml::from_str(text).map_err(|e| {
            err(
                e.span().map(|s| s.start),
                format!(
                    "{} (each machine is a [[host]] table with name and ssh; see docs/multi-host.md)",
                    e.message().trim()
                ),
            )
        })?;
        let mut hosts: Vec<Host> = Vec::new();
        for h in doc.host {
            let at = h.name.span().start;
            let name = h.name.get_ref().trim().to_string();
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
            {
                return Err(err(
                    Some(at),
                    format!(
                        "host name {:?} must be letters, digits, '.', '_' or '-' (it is typed after --host)",
                        h.name.get_ref()
                    ),
                ));
            }
            if let Some(first) = hosts.iter().find(|o| o.name == name) {
                return Err(err(
                    Some(at),
                    format!(
                        "host {name:?} is defined twice (first at {}): rename or remove one",
                        first.defined_at
                    ),
                ));
            }
            let dest = h.ssh.get_ref().trim();
            if dest.is_empty() || dest.starts_with('-') || dest.contains(char::is_whitespace) {
                return Err(err(
                    Some(h.ssh.span().start),
                    format!(
                        "ssh = {:?} is not an SSH destination: give user@host or a Host alias of your ~/.ssh/config (port and key go there, not here)",
                        h.ssh.get_ref()
                    ),
                ));
            }
            let docker_socket = match &h.docker {
                None => DEFAULT_DOCKER_SOCKET.to_string(),
                Some(d) => match d.get_ref().strip_prefix("unix://") {
                    Some(p) if p.starts_with('/') => p.to_string(),
                    _ => {
                        return Err(err(
                            Some(d.span().start),
                            format!(
                                "docker = {:?}: give the Docker engine's Unix socket on that host as unix:///PATH (default unix://{DEFAULT_DOCKER_SOCKET}); mxtune reaches it through SSH. For a tcp:// engine, set DOCKER_HOST and leave out --host",
                                d.get_ref()
                            ),
                        ));
                    }
                },
            };
            let mxtune = match &h.mxtune {
                None => DEFAULT_REMOTE_MXTUNE.to_string(),
                Some(m) if m.get_ref().trim().is_empty() => {
                    return Err(err(
                        Some(m.span().start),
                        format!(
                            "mxtune = \"\": give the command that runs mxtune on that host (default {DEFAULT_REMOTE_MXTUNE}, e.g. ~/.cargo/bin/mxtune)"
                        ),
                    ));
                }
                Some(m) => m.get_ref().trim().to_string(),
            };
            let ssh_config = match &h.ssh_config {
                None => None,
                Some(c) if c.get_ref().trim().is_empty() => {
                    return Err(err(
                        Some(c.span().start),
                        "ssh_config = \"\": give the path of an SSH client configuration file, or leave the key out to use ~/.ssh/config".into(),
                    ));
                }
                Some(c) => Some(expand_home(c.get_ref().trim())),
            };
            hosts.push(Host {
                name,
                ssh: dest.to_string(),
                ssh_config,
                docker_socket,
                mxtune,
                nccl: h.nccl,
                defined_at: format!("{}:{}", file.display(), line_of(text, at)),
            });
        }
        Ok(Hosts {
            file: file.to_path_buf(),
            hosts,
        })
    }

    /// Reads and parses a hosts file.
    pub fn load(file: &Path) -> Result<Hosts, HostsError> {
        let text = std::fs::read_to_string(file).map_err(|e| HostsError {
            file: file.to_path_buf(),
            line: None,
            message: format!("cannot read the hosts file: {e}"),
        })?;
        Self::parse(file, &text)
    }

    /// The user's hosts file ([`hosts_path`]), or `None` when there is none.
    pub fn load_user() -> Result<Option<Hosts>, HostsError> {
        match hosts_path() {
            Some(p) if p.exists() => Self::load(&p).map(Some),
            _ => Ok(None),
        }
    }

    /// The entry called `name`.
    pub fn get(&self, name: &str) -> Result<&Host, HostsError> {
        self.hosts.iter().find(|h| h.name == name).ok_or_else(|| {
            let known: Vec<&str> = self.hosts.iter().map(|h| h.name.as_str()).collect();
            HostsError {
                file: self.file.clone(),
                line: None,
                message: if known.is_empty() {
                    format!("no host named {name:?}: the file has no [[host]] entries (see docs/multi-host.md)")
                } else {
                    format!(
                        "no host named {name:?}; the hosts are: {} (`mxtune hosts list`)",
                        known.join(", ")
                    )
                },
            }
        })
    }
}

/// The host a `--host NAME` option names, from the user's hosts file, with an error saying
/// where the file should be when there is none.
pub fn find(name: &str) -> anyhow::Result<Host> {
    find_for(name, &format!("--host {name}"))
}

/// The host `name` from the user's hosts file; `asked_by` begins the messages (what named it).
pub fn find_for(name: &str, asked_by: &str) -> anyhow::Result<Host> {
    let Some(path) = hosts_path() else {
        anyhow::bail!(
            "{asked_by}: neither HOME nor XDG_CONFIG_HOME is set, so there is no ~/.config/mxtune/{HOSTS_FILE}"
        );
    };
    if !path.exists() {
        anyhow::bail!(
            "{asked_by}: there is no hosts file {}: create it with a [[host]] entry (name = {name:?}, ssh = \"user@host\"); see docs/multi-host.md",
            path.display()
        );
    }
    let hosts = Hosts::load(&path)?;
    Ok(hosts.get(name)?.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Hosts, HostsError> {
        Hosts::parse(Path::new("/cfg/hosts.toml"), text)
    }

    #[test]
    fn full_entry_and_defaults() {
        let h = parse(
            r#"
[[host]]
name = "spark2"
ssh = "me@spark2"
docker = "unix:///run/docker.sock"
mxtune = "~/.cargo/bin/mxtune"
[host.nccl]
socket_ifname = "enp1s0f1np1"
host_ip = "192.168.200.12"

[[host]]
name = "spark3"
ssh = "spark3"
"#,
        )
        .unwrap();
        assert_eq!(h.hosts.len(), 2);
        let a = &h.hosts[0];
        assert_eq!(a.name, "spark2");
        assert_eq!(a.ssh, "me@spark2");
        assert_eq!(a.docker_socket, "/run/docker.sock");
        assert_eq!(a.mxtune, "~/.cargo/bin/mxtune");
        assert_eq!(a.defined_at, "/cfg/hosts.toml:3");
        assert_eq!(
            a.nccl.env(),
            vec![
                ("NCCL_SOCKET_IFNAME", "enp1s0f1np1"),
                ("VLLM_HOST_IP", "192.168.200.12")
            ]
        );
        let b = &h.hosts[1];
        assert_eq!(b.docker_socket, DEFAULT_DOCKER_SOCKET);
        assert_eq!(b.mxtune, DEFAULT_REMOTE_MXTUNE);
        assert_eq!(b.ssh_config, None);
        assert!(b.nccl.env().is_empty());
        assert_eq!(h.get("spark3").unwrap().ssh, "spark3");
        let e = h.get("spark9").unwrap_err().to_string();
        assert!(e.contains("spark2, spark3"), "{e}");
    }

    #[test]
    fn empty_file_has_no_hosts() {
        assert!(parse("").unwrap().hosts.is_empty());
        let e = parse("").unwrap().get("x").unwrap_err().to_string();
        assert!(e.contains("no [[host]] entries"), "{e}");
    }

    #[test]
    fn errors_name_file_line_and_what_to_do() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "[[host]]\nname = \"a\"\n",
                "/cfg/hosts.toml:1:",
                "missing field `ssh`",
            ),
            (
                "[[host]]\nname = \"a\"\nssh = \"a\"\nsshh = \"b\"\n",
                "/cfg/hosts.toml:4:",
                "unknown field `sshh`",
            ),
            (
                "[[host]]\nname = \"a b\"\nssh = \"a\"\n",
                "/cfg/hosts.toml:2:",
                "letters, digits",
            ),
            (
                "[[host]]\nname = \"a\"\nssh = \"-oProxyCommand=x\"\n",
                "/cfg/hosts.toml:3:",
                "is not an SSH destination",
            ),
            (
                "[[host]]\nname = \"a\"\nssh = \"a\"\ndocker = \"tcp://a:2375\"\n",
                "/cfg/hosts.toml:4:",
                "set DOCKER_HOST and leave out --host",
            ),
            (
                "[[host]]\nname = \"a\"\nssh = \"a\"\n[[host]]\nname = \"a\"\nssh = \"b\"\n",
                "/cfg/hosts.toml:5:",
                "defined twice (first at /cfg/hosts.toml:2)",
            ),
            (
                "[[host]]\nname = \"a\"\nssh = \"a\"\n[host.nccl]\nib = \"x\"\n",
                "/cfg/hosts.toml:5:",
                "unknown field `ib`",
            ),
            (
                "[[host]]\nname = \"a\"\nssh = \"a\"\nmxtune = \" \"\n",
                "/cfg/hosts.toml:4:",
                "the command that runs mxtune",
            ),
            ("[host]\nname = 1\n", "/cfg/hosts.toml:1:", "[[host]]"),
        ];
        for (text, at, what) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.starts_with(at), "{text:?}: {e}");
            assert!(e.contains(what), "{text:?}: {e}");
        }
    }
}
