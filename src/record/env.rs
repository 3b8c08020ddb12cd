//! Environment capture on the machine mxtune runs on: host facts (sysinfo, /proc, uname)
//! and git state of source trees. GPU facts come from the monitor (NVML); container facts
//! (pip freeze, in-container git SHAs) from the launcher.

use super::schema::{HostFacts, SourceRepo};
use std::path::Path;
use std::process::Command;
use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};

/// Host name, OS, kernel, CPU and RAM of this machine. Facts that cannot be read stay `None`.
pub fn capture_host() -> HostFacts {
    let sys = System::new_with_specifics(
        RefreshKind::nothing()
            .with_memory(MemoryRefreshKind::everything())
            .with_cpu(CpuRefreshKind::nothing()),
    )
    .ok();
    let uname = uname();
    let cpu_model = sys
        .as_ref()
        .and_then(|s| s.cpus().first().map(|c| c.brand().trim().to_string()))
        .filter(|b| !b.is_empty())
        .or_else(cpu_model_from_proc);
    HostFacts {
        hostname: System::host_name().ok(),
        os: System::long_os_version().ok(),
        kernel: System::kernel_version()
            .ok()
            .or_else(|| uname.as_ref().map(|u| u.release.clone())),
        uname: uname.as_ref().map(|u| u.line()),
        arch: Some(System::cpu_arch()).filter(|a| !a.is_empty()),
        cpu_model,
        cpu_cores: System::physical_core_count().ok(),
        cpu_threads: std::thread::available_parallelism().ok().map(|n| n.get()),
        ram_total_bytes: sys.as_ref().map(|s| s.total_memory()).filter(|&b| b > 0),
        swap_total_bytes: sys.as_ref().map(|s| s.total_swap()),
    }
}

/// `model name` from /proc/cpuinfo, or the ARM implementer/part pair where no model name
/// is given (aarch64 kernels, e.g. the DGX Spark's Grace cores).
fn cpu_model_from_proc() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let field = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    field("model name").or_else(|| {
        let imp = field("CPU implementer")?;
        let part = field("CPU part")?;
        Some(format!("ARM implementer {imp} part {part}"))
    })
}

struct Uname {
    sysname: String,
    release: String,
    version: String,
    machine: String,
}

impl Uname {
    fn line(&self) -> String {
        format!(
            "{} {} {} {}",
            self.sysname, self.release, self.version, self.machine
        )
    }
}

fn uname() -> Option<Uname> {
    // SAFETY: `utsname` is plain old data; uname(2) fills it and returns 0 on success.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    Some(Uname {
        sysname: field(&u.sysname),
        release: field(&u.release),
        version: field(&u.version),
        machine: field(&u.machine),
    })
}

/// Git commit, branch and dirty state of a checkout; `error` says why when it cannot be read.
pub fn capture_source_repo(name: &str, path: &Path) -> SourceRepo {
    let mut repo = SourceRepo {
        name: name.to_string(),
        path: path.display().to_string(),
        ..SourceRepo::default()
    };
    match git(path, &["rev-parse", "HEAD"]) {
        Ok(sha) => repo.sha = Some(sha),
        Err(e) => {
            repo.error = Some(e);
            return repo;
        }
    }
    repo.branch = git(path, &["symbolic-ref", "--short", "-q", "HEAD"])
        .ok()
        .filter(|b| !b.is_empty());
    match git(path, &["status", "--porcelain", "--untracked-files=no"]) {
        Ok(out) => repo.dirty = Some(!out.is_empty()),
        Err(e) => repo.error = Some(e),
    }
    repo
}

fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(|e| {
            format!(
                "cannot run git in {}: {e} (is git installed?)",
                dir.display()
            )
        })?;
    if !out.status.success() {
        return Err(format!(
            "git {} in {} failed: {}",
            args.join(" "),
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The commit this binary was built from, embedded at compile time by `build.rs`:
/// `MXTUNE_GIT_SHA` when set, else `git rev-parse HEAD` (`-dirty` when tracked files had
/// changes), else `unknown` (built without git). Holds on a machine without git.
pub const BUILD_COMMIT: &str = env!("MXTUNE_BUILD_COMMIT");

/// The git commit mxtune was built from: `MXTUNE_GIT_SHA` at build time (CI sets it), else
/// the commit of the checkout the running executable was built in (`target/…/mxtune`),
/// marked `-dirty` when that tree has uncommitted changes. `None` for an installed binary.
pub fn mxtune_git_sha() -> Option<String> {
    if let Some(sha) = option_env!("MXTUNE_GIT_SHA") {
        return Some(sha.to_string());
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let top = git(dir, &["rev-parse", "--show-toplevel"]).ok()?;
    let top = Path::new(&top);
    // Only trust a work tree that is an mxtune source tree, not any repo the binary sits in.
    let manifest = std::fs::read_to_string(top.join("Cargo.toml")).ok()?;
    if !manifest.contains("name = \"mxtune\"") {
        return None;
    }
    let repo = capture_source_repo("mxtune", top);
    let sha = repo.sha?;
    Some(if repo.dirty == Some(true) {
        format!("{sha}-dirty")
    } else {
        sha
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_facts_on_this_machine() {
        let h = capture_host();
        assert!(h.hostname.is_some());
        assert!(h.kernel.as_deref().is_some_and(|k| !k.is_empty()));
        assert!(h.uname.as_deref().is_some_and(|u| u.starts_with("Linux")));
        assert!(h.cpu_threads.is_some_and(|n| n >= 1));
        assert!(h.ram_total_bytes.is_some_and(|b| b > 0));
    }

    #[test]
    fn source_repo_error_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let r = capture_source_repo("vllm", dir.path());
        assert!(r.sha.is_none());
        let err = r.error.unwrap();
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
    }
}
