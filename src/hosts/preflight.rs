//! Launch's pre-flight host checks measured on a remote host: `mxtune preflight --spec -
//! --json` runs there over SSH with the rendered spec on stdin, so the port, mounts, GPU
//! processes, compilers and unified memory are those of the machine the target runs on.

use super::Host;
use super::ssh;
use crate::launch::preflight::{Finding, Severity};
use crate::vocab::LaunchSpec;
use anyhow::{Context, Result, bail};
use std::io::Write;
use std::process::Stdio;

/// The host's findings, each message prefixed with the host's name. When they cannot be
/// had (no mxtune there, another version, ssh failed), one warning saying so and what to do:
/// the launch goes on, as it did before remote checks existed.
pub fn host_checks(host: &Host, spec: &LaunchSpec, check_gpu: bool) -> Vec<Finding> {
    match run(host, spec, check_gpu) {
        Ok(findings) => findings
            .into_iter()
            .map(|f| Finding {
                severity: f.severity,
                message: format!("on host {}: {}", host.name, f.message),
            })
            .collect(),
        Err(e) => vec![Finding::warning(format!(
            "host {}: port, mounts, GPU processes, compilers and memory are not checked there: {e:#}",
            host.name
        ))],
    }
}

fn run(host: &Host, spec: &LaunchSpec, check_gpu: bool) -> Result<Vec<Finding>> {
    ssh::check_remote_mxtune(host)?;
    // Missing caches are created there as the SSH user, as a local launch creates them here
    // (else the Docker daemon would, owned by root).
    let mut command = format!(
        "{} preflight --spec - --json --create-writable-mounts",
        host.mxtune
    );
    if !check_gpu {
        command.push_str(" --no-gpu");
    }
    let json = serde_json::to_vec(spec).context("writing the launch spec as JSON")?;
    let mut child = ssh::remote(host, &command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run ssh: is the OpenSSH client installed (`ssh` on PATH)?")?;
    let mut stdin = child.stdin.take().context("ssh's stdin")?;
    // The spec is small (a few KiB), far below a pipe's buffer, so writing before reading
    // cannot deadlock. A write that fails means ssh already ended: its exit status below
    // says why better than the broken pipe would.
    let _ = stdin.write_all(&json);
    drop(stdin);
    let out = child.wait_with_output().context("waiting for ssh")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0 | 2) => {}
        Some(255) => bail!("{}", ssh::explain_ssh_failure(host, &stderr)),
        _ => bail!(
            "`mxtune preflight` failed there ({}): {}",
            out.status,
            stderr.trim()
        ),
    }
    let findings: Vec<Finding> = serde_json::from_str(stdout.trim()).with_context(|| {
        format!(
            "`mxtune preflight --json` there printed something else than findings: {}",
            stdout.trim()
        )
    })?;
    if out.status.code() == Some(2) && !findings.iter().any(|f| f.severity == Severity::Error) {
        bail!("`mxtune preflight` there exited 2 without a blocking finding");
    }
    Ok(findings)
}
