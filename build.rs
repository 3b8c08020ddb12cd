//! Embeds the git commit the binary is built from as `MXTUNE_BUILD_COMMIT`, so figures the
//! binary records name their source even on a machine without git or a checkout: the
//! `MXTUNE_GIT_SHA` environment variable when set (CI's override, as `record::env` reads
//! it), else `git rev-parse HEAD` with `-dirty` when tracked files differ from it, else
//! `unknown`.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=MXTUNE_GIT_SHA");
    let commit = match std::env::var("MXTUNE_GIT_SHA") {
        Ok(sha) if !sha.trim().is_empty() => sha.trim().to_string(),
        _ => git_commit().unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rustc-env=MXTUNE_BUILD_COMMIT={commit}");
    // A new commit moves HEAD or the branch it names; staging moves the index; an edit to
    // what the binary is built from changes `-dirty`. Git's own paths, asked of git, hold in
    // a linked worktree too (there `.git` is a file). Only existing paths are named: cargo
    // would rerun this script on every build for a missing one.
    let mut watch: Vec<PathBuf> = [
        "build.rs",
        "Cargo.toml",
        "Cargo.lock",
        "src",
        "engine-kernels",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    for what in ["HEAD", "index", "packed-refs"] {
        watch.extend(git(&["rev-parse", "--git-path", what]).map(PathBuf::from));
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.extend(git(&["rev-parse", "--git-path", &branch]).map(PathBuf::from));
    }
    for p in watch.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}

/// `git rev-parse HEAD`, with `-dirty` when tracked files have changes; None without git or
/// outside a repository.
fn git_commit() -> Option<String> {
    let sha = git(&["rev-parse", "HEAD"])?;
    // `--no-optional-locks`: this status must not rewrite the index it is watched by.
    let status = Command::new("git")
        .args([
            "--no-optional-locks",
            "status",
            "--porcelain",
            "--untracked-files=no",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    Some(if status.stdout.is_empty() {
        sha
    } else {
        format!("{sha}-dirty")
    })
}

/// The trimmed standard output of a successful git command.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}
