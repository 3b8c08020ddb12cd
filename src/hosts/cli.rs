//! `mxtune hosts list` and `mxtune hosts check NAME`.

use super::ssh::{self, Tunnel};
use super::{Host, Hosts, hosts_path};
use anyhow::{Context, Result};
use std::process::ExitCode;
use std::time::Instant;

/// Arguments of `mxtune hosts`.
#[derive(Debug, clap::Args)]
pub struct HostsArgs {
    #[command(subcommand)]
    command: HostsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum HostsCommand {
    /// Every host of ~/.config/mxtune/hosts.toml: name, SSH destination, Docker socket, mxtune, NCCL interfaces.
    List,
    /// Whether a host answers over SSH, its Docker engine answers through the tunnel, and it
    /// runs this mxtune version.
    Check {
        /// The host's name in hosts.toml.
        name: String,
    },
}

/// Runs `mxtune hosts …`.
pub fn run(args: HostsArgs) -> Result<ExitCode> {
    match args.command {
        HostsCommand::List => list(),
        HostsCommand::Check { name } => {
            let host = super::find(&name)?;
            check(&host)
        }
    }
}

fn list() -> Result<ExitCode> {
    let Some(path) = hosts_path() else {
        crate::outln!(
            "no hosts: neither HOME nor XDG_CONFIG_HOME is set, so there is no ~/.config/mxtune/hosts.toml"
        );
        return Ok(ExitCode::SUCCESS);
    };
    if !path.exists() {
        crate::outln!(
            "no hosts file {}: everything runs on this machine (to add one, see docs/multi-host.md)",
            path.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let hosts = Hosts::load(&path)?;
    if hosts.hosts.is_empty() {
        crate::outln!("{}: no [[host]] entries", path.display());
        return Ok(ExitCode::SUCCESS);
    }
    crate::outln!("hosts from {}:", path.display());
    for h in &hosts.hosts {
        crate::outln!(
            "{}  ssh {}{}  docker unix://{}  mxtune `{}`",
            h.name,
            h.ssh,
            h.ssh_config
                .as_ref()
                .map(|c| format!(" (-F {})", c.display()))
                .unwrap_or_default(),
            h.docker_socket,
            h.mxtune
        );
        let env = h.nccl.env();
        if !env.is_empty() {
            let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            crate::outln!("    nccl: {}", shown.join(" "));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One check's outcome line.
fn report(what: &str, result: &Result<String>) {
    match result {
        Ok(detail) => crate::outln!("  {what}: ok ({detail})"),
        Err(e) => crate::outln!("  {what}: FAILED: {e:#}"),
    }
}

/// `hosts check`: ssh, then Docker through the tunnel and the remote mxtune's version.
/// Exit 0 when all pass, 1 otherwise.
pub fn check(host: &Host) -> Result<ExitCode> {
    crate::outln!("host {} ({}, {}):", host.name, host.ssh, host.defined_at);
    let started = Instant::now();
    let ssh_ok = ssh::run(host, "true").map(|_| {
        format!(
            "logged in as {} in {:.1} s",
            host.ssh,
            started.elapsed().as_secs_f64()
        )
    });
    report("ssh", &ssh_ok);
    if ssh_ok.is_err() {
        crate::outln!("  docker: not checked (no ssh)");
        crate::outln!("  mxtune: not checked (no ssh)");
        return Ok(ExitCode::FAILURE);
    }
    let docker = tokio::runtime::Runtime::new()
        .context("cannot start the async runtime")?
        .block_on(check_docker(host));
    report("docker", &docker);
    let mxtune = ssh::check_remote_mxtune(host).map(|v| format!("{v}, as here"));
    report("mxtune", &mxtune);
    Ok(if docker.is_ok() && mxtune.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn check_docker(host: &Host) -> Result<String> {
    let tunnel = Tunnel::open(host, None).await?;
    let d = crate::launch::docker::connect_tunnel(&tunnel, &host.docker_socket).await?;
    let v = d
        .version()
        .await
        .with_context(|| format!("asking host {}'s Docker engine its version", host.name))?;
    Ok(format!(
        "Docker {} (API {}) at unix://{} over ssh",
        v.version.unwrap_or_default(),
        v.api_version.unwrap_or_default(),
        host.docker_socket
    ))
}
