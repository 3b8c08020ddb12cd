//! Pre-flight checks before a launch: port free, image present or pullable, mounts exist,
//! nobody else on the GPU, no leftover JIT compilers, enough unified memory.
//! Each check is a small function over its inputs, so it is tested without a GPU.

use super::docker::{connect_host, docker_host};
use crate::vocab::{LaunchSpec, Mount};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Leftover processes of these names are a known cause of OOM on the Spark.
pub const COMPILER_NAMES: &[&str] = &["ptxas", "nvcc", "cicc", "nvlink", "fatbinary"];

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Blocks the launch.
    Error,
    /// The operator decides.
    Warning,
}

/// One pre-flight result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// Blocks or asks.
    pub severity: Severity,
    /// What is wrong and what to do.
    pub message: String,
}

impl Finding {
    fn error(message: String) -> Self {
        Self {
            severity: Severity::Error,
            message,
        }
    }
    /// A finding that is printed and lets the launch go on.
    pub fn warning(message: String) -> Self {
        Self {
            severity: Severity::Warning,
            message,
        }
    }
}

/// A process using the GPU (from NVML).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    /// Process id.
    pub pid: u32,
    /// Its command name.
    pub name: String,
    /// GPU memory it uses, when the driver says.
    pub used_bytes: Option<u64>,
}

/// A process found by scanning /proc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    /// Process id.
    pub pid: u32,
    /// Command name.
    pub name: String,
    /// Resident memory.
    pub rss_bytes: Option<u64>,
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Error when something already listens on the port the target needs.
pub fn check_port(host: &str, port: u16) -> Option<Finding> {
    let bind_host = match host {
        "" => "127.0.0.1",
        h => h,
    };
    match std::net::TcpListener::bind((bind_host, port)) {
        Ok(_) => None,
        Err(e) => Some(Finding::error(format!(
            "port {port} on {} is not free ({e}): stop what listens there (`ss -ltnp 'sport = :{port}'`) or choose another port",
            connect_host(bind_host)
        ))),
    }
}

/// Missing bind-mount sources: an error for a read-only mount (a source tree or model the
/// container needs), a warning for a writable one (a cache: mxtune creates it at launch, owned
/// by the operator rather than by the Docker daemon's root).
pub fn check_mounts(mounts: &[Mount]) -> Vec<Finding> {
    mounts
        .iter()
        .filter(|m| !Path::new(&m.host).exists())
        .map(|m| {
            if m.read_only {
                Finding::error(format!(
                    "mount source {} (read-only at {} in the container) does not exist: create it or fix the preset",
                    m.host, m.container
                ))
            } else {
                Finding::warning(format!(
                    "mount source {} (for {} in the container) does not exist: mxtune creates it empty",
                    m.host, m.container
                ))
            }
        })
        .collect()
}

/// Creates missing writable mount sources (caches), as [`check_mounts`] announced.
pub fn create_writable_mounts(mounts: &[Mount]) -> Result<()> {
    for m in mounts
        .iter()
        .filter(|m| !m.read_only && !Path::new(&m.host).exists())
    {
        std::fs::create_dir_all(&m.host).with_context(|| {
            format!("cannot create mount source {} for {}", m.host, m.container)
        })?;
    }
    Ok(())
}

/// Warning listing processes that already hold the GPU.
pub fn check_gpu_processes(procs: &[GpuProcess]) -> Option<Finding> {
    if procs.is_empty() {
        return None;
    }
    let list = procs
        .iter()
        .map(|p| match p.used_bytes {
            Some(b) => format!("{} (pid {}, {:.1} GiB)", p.name, p.pid, b as f64 / GIB),
            None => format!("{} (pid {})", p.name, p.pid),
        })
        .collect::<Vec<_>>()
        .join(", ");
    Some(Finding::warning(format!(
        "the GPU is already in use by {list}: a second server will compete for memory; stop them or launch anyway"
    )))
}

/// Compiler processes (ptxas, nvcc, cicc, …) under `proc_root` (normally `/proc`).
pub fn scan_compilers(proc_root: &Path) -> Vec<ProcInfo> {
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut found: Vec<ProcInfo> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(e.path().join("comm"))
                .ok()?
                .trim()
                .to_string();
            if !COMPILER_NAMES.contains(&name.as_str()) {
                return None;
            }
            let rss_bytes = std::fs::read_to_string(e.path().join("status"))
                .ok()
                .and_then(|s| vm_rss_bytes(&s));
            Some(ProcInfo {
                pid,
                name,
                rss_bytes,
            })
        })
        .collect();
    found.sort_by_key(|p| p.pid);
    found
}

/// Resident memory in bytes from the text of a `/proc/<pid>/status` file (its `VmRSS` line).
pub(crate) fn vm_rss_bytes(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// This process's resident memory in bytes (Linux; `None` elsewhere).
pub(crate) fn own_rss_bytes() -> Option<u64> {
    vm_rss_bytes(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// Warning listing leftover compilers.
pub fn check_compilers(procs: &[ProcInfo]) -> Option<Finding> {
    if procs.is_empty() {
        return None;
    }
    let list = procs
        .iter()
        .map(|p| match p.rss_bytes {
            Some(b) => format!("{} (pid {}, {:.1} GiB RSS)", p.name, p.pid, b as f64 / GIB),
            None => format!("{} (pid {})", p.name, p.pid),
        })
        .collect::<Vec<_>>()
        .join(", ");
    Some(Finding::warning(format!(
        "leftover JIT compiler processes: {list}; orphaned compilers have caused OOM on the Spark: kill them if no build is running"
    )))
}

fn meminfo_bytes(meminfo: &str, key: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// On unified memory the server takes `utilization × MemTotal` from the same pool the OS
/// uses: warn with numbers when MemAvailable is smaller. Page cache counts as available in
/// theory but is not always freed in time, so it is named as the explicit way out.
pub fn check_unified_memory(meminfo: &str, utilization: f64) -> Option<Finding> {
    let total = meminfo_bytes(meminfo, "MemTotal")?;
    let available = meminfo_bytes(meminfo, "MemAvailable")?;
    let free = meminfo_bytes(meminfo, "MemFree").unwrap_or(available);
    let cached = meminfo_bytes(meminfo, "Cached").unwrap_or(0);
    let wanted = (total as f64 * utilization) as u64;
    if wanted <= free {
        return None;
    }
    if wanted <= available {
        return Some(Finding::warning(format!(
            "gpu-memory-utilization {utilization} wants {:.1} GiB of {:.1} GiB unified memory; only {:.1} GiB is free, the rest is page cache ({:.1} GiB): drop it explicitly with `--drop-page-cache` (or `sync; echo 1 | sudo tee /proc/sys/vm/drop_caches`) if the launch runs out of memory",
            wanted as f64 / GIB,
            total as f64 / GIB,
            free as f64 / GIB,
            cached as f64 / GIB
        )));
    }
    Some(Finding::warning(format!(
        "gpu-memory-utilization {utilization} wants {:.1} GiB of {:.1} GiB unified memory but only {:.1} GiB is available ({:.1} GiB page cache): lower the utilization or stop other processes",
        wanted as f64 / GIB,
        total as f64 / GIB,
        available as f64 / GIB,
        cached as f64 / GIB
    )))
}

/// The `--gpu-memory-utilization` value in an argv, if any.
pub fn gpu_memory_utilization(argv: &[String]) -> Option<f64> {
    argv.iter().enumerate().find_map(|(i, a)| {
        if let Some(v) = a.strip_prefix("--gpu-memory-utilization=") {
            v.parse().ok()
        } else if a == "--gpu-memory-utilization" {
            argv.get(i + 1)?.parse().ok()
        } else {
            None
        }
    })
}

/// Whether this machine's GPU shares system memory (GB10 / Grace-class: aarch64 with the
/// NVIDIA driver loaded). Discrete GPUs get no unified-memory check.
pub fn is_unified_memory_machine() -> bool {
    cfg!(target_arch = "aarch64") && Path::new("/proc/driver/nvidia/version").exists()
}

/// Processes on any GPU, from NVML.
pub fn nvml_compute_processes() -> Result<Vec<GpuProcess>> {
    let nvml =
        nvml_wrapper::Nvml::init().context("NVML is not available (no NVIDIA driver here?)")?;
    let count = nvml.device_count().context("NVML: cannot count GPUs")?;
    let mut out = Vec::new();
    for i in 0..count {
        let dev = nvml
            .device_by_index(i)
            .with_context(|| format!("NVML: cannot open GPU {i}"))?;
        let procs = dev
            .running_compute_processes()
            .with_context(|| format!("NVML: cannot list processes on GPU {i}"))?;
        for p in procs {
            let name = std::fs::read_to_string(format!("/proc/{}/comm", p.pid))
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "?".into());
            let used_bytes = match p.used_gpu_memory {
                nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
                nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
            };
            out.push(GpuProcess {
                pid: p.pid,
                name,
                used_bytes,
            });
        }
    }
    Ok(out)
}

/// Drops the page cache (explicit operator action only; needs root).
pub fn drop_page_cache() -> Result<()> {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "1")
        .context("cannot write /proc/sys/vm/drop_caches (needs root): run `sync; echo 1 | sudo tee /proc/sys/vm/drop_caches`")
}

/// The host-side checks for a spec (port, mounts, GPU processes, compilers, unified
/// memory). They describe this machine, so a Docker target on a remote daemon skips them
/// with a warning. The image check needs Docker and lives in the CLI flow.
pub fn host_checks(spec: &LaunchSpec, check_gpu: bool) -> Vec<Finding> {
    if spec.container.is_some() && !docker_host().starts_with("unix://") {
        return vec![Finding::warning(format!(
            "DOCKER_HOST={} is another machine: port, mounts, GPU processes, compilers and memory are not checked from here",
            docker_host()
        ))];
    }
    let mut out = Vec::new();
    let bind = match spec.container.as_ref().map(|c| c.network) {
        Some(crate::vocab::NetworkMode::Bridge) => "127.0.0.1",
        _ => spec.host.as_str(),
    };
    out.extend(check_port(bind, spec.port));
    if let Some(c) = &spec.container {
        out.extend(check_mounts(&c.mounts));
    }
    if check_gpu {
        match nvml_compute_processes() {
            Ok(procs) => out.extend(check_gpu_processes(&procs)),
            Err(e) => out.push(Finding::warning(format!(
                "cannot check GPU processes: {e:#}"
            ))),
        }
    }
    out.extend(check_compilers(&scan_compilers(Path::new("/proc"))));
    if is_unified_memory_machine()
        && let Some(util) = gpu_memory_utilization(&spec.argv)
    {
        match std::fs::read_to_string("/proc/meminfo") {
            Ok(m) => out.extend(check_unified_memory(&m, util)),
            Err(e) => out.push(Finding::warning(format!("cannot read /proc/meminfo: {e}"))),
        }
    }
    out
}

// ---- The pre-flight of a launch, as `mxtune launch` and the panel's launch both run it ----

/// What `mxtune launch` prints after a blocking finding, and the panel shows.
pub const BLOCKED: &str = "pre-flight failed: nothing was started";

/// A finding of a launch's pre-flight, with the node of a two-node cluster it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchFinding {
    /// `head` or `worker` for a two-node cluster; `None` for a single target.
    pub node: Option<&'static str>,
    /// The finding (a host's are prefixed `on host NAME:`).
    pub finding: Finding,
}

impl LaunchFinding {
    /// A finding of a single target.
    pub fn single(finding: Finding) -> Self {
        Self {
            node: None,
            finding,
        }
    }

    /// Whether it blocks the launch.
    pub fn blocks(&self) -> bool {
        self.finding.severity == Severity::Error
    }

    /// The line `mxtune launch` prints: `pre-flight Error: …`, `pre-flight Warning (worker): …`.
    pub fn line(&self) -> String {
        match self.node {
            Some(node) => format!(
                "pre-flight {:?} ({node}): {}",
                self.finding.severity, self.finding.message
            ),
            None => format!(
                "pre-flight {:?}: {}",
                self.finding.severity, self.finding.message
            ),
        }
    }
}

/// Whether any finding blocks the launch.
pub fn blocked(findings: &[LaunchFinding]) -> bool {
    findings.iter().any(LaunchFinding::blocks)
}

/// Whether the spec runs the bundled engine on the CPU: then nobody else on the GPU matters.
pub fn runs_on_cpu(spec: &LaunchSpec) -> bool {
    spec.argv
        .windows(2)
        .any(|w| w[0] == "--device" && w[1] == "cpu")
}

/// [`host_checks`] on this machine (`host` = `None`), or on a hosts.toml host through
/// `mxtune preflight` over SSH ([`crate::hosts::preflight::host_checks`]). Both run on a
/// blocking thread: the remote one waits for ssh, the local one binds ports and reads /proc.
pub async fn checks_on(
    host: Option<&crate::hosts::Host>,
    spec: &LaunchSpec,
    check_gpu: bool,
) -> Result<Vec<Finding>> {
    let (host, spec) = (host.cloned(), spec.clone());
    tokio::task::spawn_blocking(move || match host {
        None => host_checks(&spec, check_gpu),
        Some(h) => crate::hosts::preflight::host_checks(&h, &spec, check_gpu),
    })
    .await
    .context("the pre-flight task")
}

/// The checks of a two-node cluster: the head's host with the API port, then the worker's
/// host (when another one) without it, each finding tagged with its node.
pub async fn cluster_checks(
    plan: &super::cluster::ClusterPlan,
    spec: &LaunchSpec,
) -> Result<Vec<LaunchFinding>> {
    let tag = |node: &'static str| {
        move |finding| LaunchFinding {
            node: Some(node),
            finding,
        }
    };
    let mut out: Vec<LaunchFinding> = checks_on(plan.head.host.as_ref(), spec, true)
        .await?
        .into_iter()
        .map(tag("head"))
        .collect();
    if plan.worker.host != plan.head.host {
        // The worker serves no API: its checks leave the port out (port 0 always binds).
        let mut worker_spec = spec.clone();
        worker_spec.port = 0;
        out.extend(
            checks_on(plan.worker.host.as_ref(), &worker_spec, true)
                .await?
                .into_iter()
                .map(tag("worker")),
        );
    }
    Ok(out)
}

/// Error when the image is not on the Docker engine that runs the target (this machine's,
/// or `host`'s); `pull_option` names the launch's option that pulls it, when it has one.
pub async fn check_image(
    docker: &bollard::Docker,
    image: &str,
    host: Option<&crate::hosts::Host>,
    pull_option: Option<&str>,
) -> Option<Finding> {
    if docker.inspect_image(image).await.is_ok() {
        return None;
    }
    let on = host
        .map(|h| format!("host {}", h.name))
        .unwrap_or_else(docker_host);
    let pull = match pull_option {
        Some(o) => format!("`docker pull {image}` or {o}"),
        None => format!("`docker pull {image}`"),
    };
    Some(Finding::error(format!(
        "image {image} is not present on {on}: pull it ({pull}) or build it there"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_in_use_is_an_error() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let f = check_port("127.0.0.1", port).unwrap();
        assert_eq!(f.severity, Severity::Error);
        assert!(f.message.contains(&port.to_string()));
        drop(l);
        assert_eq!(check_port("127.0.0.1", port), None);
    }

    #[test]
    fn missing_mounts_and_gpu_processes_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let ok = Mount {
            host: dir.path().display().to_string(),
            container: "/a".into(),
            read_only: true,
        };
        let bad = Mount {
            host: "/nonexistent/mxtune/x".into(),
            container: "/b".into(),
            read_only: true,
        };
        let cache = Mount {
            host: dir.path().join("jit/torch").display().to_string(),
            container: "/c".into(),
            read_only: false,
        };
        let f = check_mounts(&[ok, bad, cache.clone()]);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].severity, Severity::Error);
        assert!(f[0].message.contains("/nonexistent/mxtune/x") && f[0].message.contains("/b"));
        assert_eq!(f[1].severity, Severity::Warning);
        create_writable_mounts(std::slice::from_ref(&cache)).unwrap();
        assert!(Path::new(&cache.host).is_dir());
        assert!(check_mounts(&[cache]).is_empty());
        assert_eq!(check_gpu_processes(&[]), None);
        let w = check_gpu_processes(&[GpuProcess {
            pid: 7,
            name: "python3".into(),
            used_bytes: Some(3 << 30),
        }])
        .unwrap();
        assert!(
            w.message.contains("python3 (pid 7, 3.0 GiB)"),
            "{}",
            w.message
        );
    }

    #[test]
    fn resident_memory_is_read_from_the_status_text() {
        assert_eq!(vm_rss_bytes("Name:\tx\nVmRSS:\t  1024 kB\n"), Some(1 << 20));
        assert_eq!(vm_rss_bytes("Name:\tx\n"), None);
        if cfg!(target_os = "linux") {
            assert!(own_rss_bytes().is_some_and(|b| b > 0));
        }
    }

    #[test]
    fn compilers_are_found_in_a_proc_tree() {
        let dir = tempfile::tempdir().unwrap();
        for (pid, name) in [(10, "ptxas"), (11, "bash"), (12, "cicc")] {
            let d = dir.path().join(pid.to_string());
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("comm"), format!("{name}\n")).unwrap();
            std::fs::write(d.join("status"), "Name:\tx\nVmRSS:\t  2097152 kB\n").unwrap();
        }
        std::fs::create_dir(dir.path().join("self")).unwrap();
        let found = scan_compilers(dir.path());
        assert_eq!(
            found.iter().map(|p| p.pid).collect::<Vec<_>>(),
            vec![10, 12]
        );
        assert_eq!(found[0].rss_bytes, Some(2 << 30));
        assert!(
            check_compilers(&found)
                .unwrap()
                .message
                .contains("ptxas (pid 10, 2.0 GiB RSS)")
        );
    }

    #[test]
    fn unified_memory_warns_with_numbers() {
        let m = "MemTotal:       125829120 kB\nMemFree:         20971520 kB\nMemAvailable:   104857600 kB\nCached:          83886080 kB\n";
        assert_eq!(check_unified_memory(m, 0.1), None);
        let w = check_unified_memory(m, 0.7).unwrap();
        assert!(
            w.message.contains("84.0 GiB of 120.0 GiB")
                && w.message.contains("page cache (80.0 GiB)"),
            "{}",
            w.message
        );
        let w = check_unified_memory(m, 0.9).unwrap();
        assert!(
            w.message.contains("only 100.0 GiB is available"),
            "{}",
            w.message
        );
        let argv: Vec<String> = ["vllm", "serve", "m", "--gpu-memory-utilization", "0.85"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(gpu_memory_utilization(&argv), Some(0.85));
        assert_eq!(
            gpu_memory_utilization(&["--gpu-memory-utilization=0.5".to_string()]),
            Some(0.5)
        );
        assert_eq!(gpu_memory_utilization(&[]), None);
    }
}
