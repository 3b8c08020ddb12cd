//! Every command ends quietly when the reader of its output goes away
//! (`mxtune presets list | head -1`): exit 0, or 141 (killed by SIGPIPE, as a shell reports
//! it), and never a panic.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

/// Runs `mxtune args` with stdout (and, with `both`, stderr) a pipe whose reader is already
/// closed, so every write to it fails at once; returns the exit status and what it printed
/// on stderr when stderr stays readable.
fn with_closed_pipe(
    args: &[&str],
    both: bool,
    setup: impl Fn(&mut Command),
) -> (std::process::ExitStatus, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mxtune"));
    cmd.args(args).stdin(Stdio::null());
    setup(&mut cmd);
    if both {
        cmd.stderr(writer.try_clone().unwrap());
    }
    let o = cmd.stdout(writer).output().unwrap();
    (o.status, String::from_utf8_lossy(&o.stderr).into_owned())
}

fn assert_quiet(what: &str, status: std::process::ExitStatus, stderr: &str) {
    assert!(
        status.code() == Some(0) || status.signal() == Some(libc::SIGPIPE),
        "{what}: {status:?}\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    assert!(!stderr.contains("Broken pipe"), "{what}: {stderr}");
}

#[test]
fn printing_commands_end_with_their_reader() {
    let home = tempfile::tempdir().unwrap();
    let runs = tempfile::tempdir().unwrap();
    let env = |c: &mut Command| {
        c.env("HOME", home.path())
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("MXTUNE_PRESETS_DIR")
            .env("MXTUNE_RUNS_DIR", runs.path());
    };
    for args in [
        &["presets", "list"][..],
        &["presets", "show", "final"],
        &["presets", "docs"],
        &["runs", "list"],
        &["recipe", "export", "baseline"],
    ] {
        let (status, stderr) = with_closed_pipe(args, false, env);
        assert_quiet(&args.join(" "), status, &stderr);
        let (status, stderr) = with_closed_pipe(args, true, env);
        assert_quiet(&args.join(" "), status, &stderr);
    }
}

#[test]
fn commands_that_own_targets_finish_without_their_reader() {
    let runs = tempfile::tempdir().unwrap();
    // No Docker to reach: `stop --all` notes that on stderr and says "nothing to stop" on
    // stdout, both closed here; it must still finish normally.
    let (status, stderr) = with_closed_pipe(
        &["stop", "--all", "--runs-dir", runs.path().to_str().unwrap()],
        true,
        |c| {
            c.env("DOCKER_HOST", "unix:///nonexistent/docker.sock");
        },
    );
    assert_eq!(status.code(), Some(0), "{status:?} {stderr}");
    let (status, stderr) = with_closed_pipe(
        &["stop", "--all", "--runs-dir", runs.path().to_str().unwrap()],
        false,
        |c| {
            c.env("DOCKER_HOST", "unix:///nonexistent/docker.sock");
        },
    );
    assert_eq!(status.code(), Some(0), "{status:?} {stderr}");
    assert!(stderr.contains("containers not checked"), "{stderr}");
}
