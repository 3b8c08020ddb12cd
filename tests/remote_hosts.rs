//! Remote hosts over SSH without a second machine: a throwaway sshd on 127.0.0.1 stands in
//! for the remote host, the real `mxtune` binary runs on both ends, and the local Docker
//! engine is reached through the SSH tunnel. Skips without sshd (`MXTUNE_TEST_SSHD=require`
//! fails instead) and, for the Docker parts, without Docker (`MXTUNE_TEST_DOCKER=require`).

#[path = "support/vllm_double.rs"]
mod double;
mod support;

use mxtune::hosts::monitor::{RemoteMonitor, RemoteMonitorArgs};
use mxtune::hosts::ssh::Tunnel;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use support::sshd::{Sshd, sshd_or_skip};
use support::*;

const MXTUNE: &str = env!("CARGO_BIN_EXE_mxtune");

fn mxtune(config_home: &Path, args: &[&str]) -> Output {
    Command::new(MXTUNE)
        .args(args)
        .env("XDG_CONFIG_HOME", config_home)
        .output()
        .unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// An executable shell script in the sshd's directory standing in for another mxtune.
fn fake_mxtune(sshd: &Sshd, name: &str, body: &str) -> String {
    let path = sshd.dir.path().join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// Held by the tests that open tunnels in this process and then look for leftovers of
/// this process, so that they do not see each other's live tunnels.
static IN_PROCESS_TUNNELS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Whether a tunnel of process `pid` left its directory behind in /tmp.
fn tunnel_dirs_of(pid: u32) -> Vec<String> {
    std::fs::read_dir("/tmp")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("mxtune-ssh-{pid}-")))
        .collect()
}

#[test]
fn hosts_file_errors_name_the_file_line_and_what_to_do() {
    let home = tempfile::tempdir().unwrap();
    // No hosts file: nothing changes, and --host says where the file should be.
    let o = mxtune(home.path(), &["hosts", "list"]);
    let (out, _) = text(&o);
    assert!(o.status.success());
    assert!(out.contains("no hosts file"), "{out}");
    let o = mxtune(home.path(), &["monitor", "--host", "spark2", "--once"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    let expected = home.path().join("mxtune/hosts.toml");
    assert!(
        err.contains(&format!(
            "--host spark2: there is no hosts file {}",
            expected.display()
        )),
        "{err}"
    );

    std::fs::create_dir_all(home.path().join("mxtune")).unwrap();
    let file = home.path().join("mxtune/hosts.toml");
    std::fs::write(
        &file,
        "[[host]]\nname = \"spark2\"\nssh = \"me@spark2\"\nsshh = \"typo\"\n",
    )
    .unwrap();
    let o = mxtune(home.path(), &["hosts", "list"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains(&format!("{}:4: unknown field `sshh`", file.display())),
        "{err}"
    );

    std::fs::write(&file, "[[host]]\nname = \"spark2\"\nssh = \"me@spark2\"\n").unwrap();
    let o = mxtune(home.path(), &["hosts", "check", "spark3"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("no host named \"spark3\"; the hosts are: spark2"),
        "{err}"
    );
    // The page cache to drop would be this machine's, not the host's.
    let o = mxtune(
        home.path(),
        &[
            "launch",
            "--host",
            "spark2",
            "--preset",
            "baseline",
            "--drop-page-cache",
        ],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("--drop-page-cache drops this machine's page cache, not host spark2's"),
        "{err}"
    );
    // --host drives Docker targets only.
    let o = mxtune(
        home.path(),
        &["launch", "--host", "spark2", "--preset", "engine-cpu-tiny"],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("--host spark2 runs a Docker target on that host"),
        "{err}"
    );
}

#[tokio::test]
async fn tunnel_forwards_a_port_and_is_cleaned_up() {
    let Some(sshd) = sshd_or_skip("tunnel_forwards_a_port_and_is_cleaned_up") else {
        return;
    };
    let _one_at_a_time = IN_PROCESS_TUNNELS.lock().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = listener.accept() {
            let _ = s.write_all(b"hello from the host\n");
        }
    });
    // What a killed mxtune left behind is removed by the next tunnel; a live one's stays.
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let stale = Path::new("/tmp").join(format!("mxtune-ssh-{dead_pid}-0"));
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("ssh.log"), "").unwrap();
    let live = Path::new("/tmp").join(format!("mxtune-ssh-{}-999999", std::process::id()));
    std::fs::create_dir_all(&live).unwrap();

    let host = sshd.host("remote", MXTUNE);
    let tunnel = Tunnel::open(&host, Some(("127.0.0.1", port)))
        .await
        .unwrap_or_else(|e| panic!("{e:#}\nsshd log:\n{}", sshd.log()));
    assert!(tunnel.docker_socket.exists());
    assert!(!stale.exists(), "{} was not removed", stale.display());
    assert!(
        live.exists(),
        "{} of a live process was removed",
        live.display()
    );
    std::fs::remove_dir(&live).unwrap();
    let (local, remote) = tunnel.port.unwrap();
    assert_eq!(remote, port);
    assert_ne!(local, port);
    let got = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", local)).unwrap();
        let mut got = String::new();
        s.read_to_string(&mut got).unwrap();
        got
    })
    .await
    .unwrap();
    assert_eq!(got, "hello from the host\n");
    let (dir, pid) = (tunnel.dir().to_path_buf(), tunnel.pid());
    drop(tunnel);
    assert!(!dir.exists(), "{} left behind", dir.display());
    // The ssh process is gone (and reaped): no such pid any more.
    assert_eq!(unsafe { libc::kill(pid as i32, 0) }, -1);

    // A host nothing answers for: the error says which and what to try.
    let mut down = sshd.host("down", MXTUNE);
    let cfg = sshd.dir.path().join("down_config");
    std::fs::write(
        &cfg,
        format!(
            "Host {}\n  HostName 127.0.0.1\n  Port {}\n",
            support::sshd::ALIAS,
            free_port()
        ),
    )
    .unwrap();
    down.ssh_config = Some(cfg);
    let e = format!("{:#}", Tunnel::open(&down, None).await.unwrap_err());
    assert!(e.contains("cannot reach host down over ssh"), "{e}");
    assert!(e.contains("Connection refused"), "{e}");
    assert!(tunnel_dirs_of(std::process::id()).is_empty());
}

#[test]
fn hosts_check_against_local_sshd() {
    let Some(sshd) = sshd_or_skip("hosts_check_against_local_sshd") else {
        return;
    };
    let down_cfg = sshd.dir.path().join("down_config");
    std::fs::write(
        &down_cfg,
        format!(
            "Host {}\n  HostName 127.0.0.1\n  Port {}\n",
            support::sshd::ALIAS,
            free_port()
        ),
    )
    .unwrap();
    let old = fake_mxtune(&sshd, "old-mxtune", "echo 'mxtune 0.0.0-other'");
    let entries = format!(
        "{}\n{}\n{}\n[[host]]\nname = \"down\"\nssh = \"{}\"\nssh_config = {:?}\n",
        sshd.host_entry("remote", MXTUNE),
        sshd.host_entry("gone", "/nonexistent/mxtune"),
        sshd.host_entry("old", &old),
        support::sshd::ALIAS,
        down_cfg.display().to_string()
    );
    let home = sshd.config_home(&entries);

    let o = mxtune(&home, &["hosts", "list"]);
    let (out, _) = text(&o);
    assert!(o.status.success());
    for name in ["remote ", "gone ", "old ", "down "] {
        assert!(out.contains(name), "{out}");
    }

    let docker_here = std::thread::spawn(|| {
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(mxtune::launch::docker::connect())
            .is_ok()
    })
    .join()
    .unwrap();
    if !docker_here && std::env::var("MXTUNE_TEST_DOCKER").as_deref() == Ok("require") {
        panic!("MXTUNE_TEST_DOCKER=require but no Docker engine");
    }
    let o = mxtune(&home, &["hosts", "check", "remote"]);
    let (out, err) = text(&o);
    assert!(out.contains("  ssh: ok"), "{out}{err}\n{}", sshd.log());
    assert!(
        out.contains(&format!(
            "  mxtune: ok (mxtune {}, as here)",
            env!("CARGO_PKG_VERSION")
        )),
        "{out}"
    );
    if docker_here {
        assert!(out.contains("  docker: ok (Docker "), "{out}");
        assert!(
            out.contains("at unix:///var/run/docker.sock over ssh"),
            "{out}"
        );
        assert_eq!(o.status.code(), Some(0), "{out}{err}");
    } else {
        eprintln!("SKIPPED the docker part of hosts check: no Docker engine here");
        assert!(out.contains("  docker: FAILED"), "{out}");
        assert_eq!(o.status.code(), Some(1));
    }

    let o = mxtune(&home, &["hosts", "check", "gone"]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        out.contains("  mxtune: FAILED: mxtune is not installed on host gone"),
        "{out}"
    );
    assert!(out.contains("set mxtune = \"/path/to/mxtune\""), "{out}");

    let o = mxtune(&home, &["hosts", "check", "old"]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        out.contains(&format!(
            "host old runs mxtune 0.0.0-other, this is mxtune {}",
            env!("CARGO_PKG_VERSION")
        )),
        "{out}"
    );

    let o = mxtune(&home, &["hosts", "check", "down"]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        out.contains("  ssh: FAILED: cannot reach host down over ssh"),
        "{out}"
    );
    assert!(out.contains("  docker: not checked (no ssh)"), "{out}");
}

/// A host whose sshd forbids forwarding: the tunnel comes up, the Docker engine cannot be
/// reached through it, and the message carries what ssh said.
#[test]
fn docker_through_an_sshd_that_forbids_forwarding_says_so() {
    let test = "docker_through_an_sshd_that_forbids_forwarding_says_so";
    if sshd_or_skip(test).is_none() {
        return;
    }
    let sshd = Sshd::with_config("AllowStreamLocalForwarding no\nAllowTcpForwarding no\n");
    let home = sshd.config_home(&sshd.host_entry("closed", MXTUNE));
    let o = mxtune(&home, &["hosts", "check", "closed"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.contains("  ssh: ok"), "{out}");
    assert!(
        out.contains("  docker: FAILED: cannot reach the Docker engine of host closed"),
        "{out}"
    );
    assert!(out.contains("ssh said:"), "{out}");
    assert!(out.contains("open failed"), "{out}");
}

#[test]
fn remote_monitor_json_is_read_back_into_samples() {
    let Some(sshd) = sshd_or_skip("remote_monitor_json_is_read_back_into_samples") else {
        return;
    };
    // The library: one sample from the remote end, then the end of the stream.
    let host = sshd.host("remote", MXTUNE);
    let args = RemoteMonitorArgs {
        once: true,
        ..Default::default()
    };
    let mut m = RemoteMonitor::start(&host, &args, false)
        .unwrap_or_else(|e| panic!("{e:#}\nsshd log:\n{}", sshd.log()));
    let sample = m.next_sample().unwrap().expect("one sample");
    assert!(sample.host.ram_total_bytes > 0);
    assert!(matches!(
        sample.server,
        mxtune::monitor::sample::ServerStatus::NotConfigured
    ));
    assert!(m.next_sample().unwrap().is_none());

    let version = env!("CARGO_PKG_VERSION");
    let old = fake_mxtune(&sshd, "old-mxtune", "echo 'mxtune 0.0.0-other'");
    let other = fake_mxtune(&sshd, "other", "echo 'something 1.0'");
    let garbled = fake_mxtune(
        &sshd,
        "garbled",
        &format!(
            "if [ \"$1\" = --version ]; then echo 'mxtune {version}'; else echo 'not json'; fi"
        ),
    );
    let failing = fake_mxtune(
        &sshd,
        "failing",
        &format!(
            "if [ \"$1\" = --version ]; then echo 'mxtune {version}'; else echo 'boom: the monitor cannot start' >&2; exit 3; fi"
        ),
    );
    let entries = [
        sshd.host_entry("remote", MXTUNE),
        sshd.host_entry("gone", "/nonexistent/mxtune"),
        sshd.host_entry("old", &old),
        sshd.host_entry("other", &other),
        sshd.host_entry("garbled", &garbled),
        sshd.host_entry("failing", &failing),
    ]
    .join("\n");
    let home = sshd.config_home(&entries);

    // The command line: the remote sample printed here as JSON, with a --url passed along.
    let o = mxtune(
        &home,
        &[
            "monitor",
            "--host",
            "remote",
            "--once",
            "--json",
            "--url",
            &format!("http://127.0.0.1:{}", free_port()),
        ],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert!(v["host"]["ram_total_bytes"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["server"]["status"], "failed", "{v}");
    // And as the compact line.
    let o = mxtune(&home, &["monitor", "--host", "remote", "--once"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("| cpu "), "{out}");

    for (name, expected) in [
        (
            "gone",
            "mxtune is not installed on host gone (`/nonexistent/mxtune` is not a command there"
                .to_string(),
        ),
        (
            "old",
            format!(
                "host old runs mxtune 0.0.0-other, this is mxtune {version}: the two ends must be the same version"
            ),
        ),
        ("other", "which is not mxtune's version line".to_string()),
        (
            "garbled",
            "host garbled: a line of `mxtune monitor --json` is not a sample".to_string(),
        ),
        (
            "failing",
            "`mxtune monitor` on host failing ended (exit status: 3): boom: the monitor cannot start"
                .to_string(),
        ),
    ] {
        let o = mxtune(&home, &["monitor", "--host", name, "--once"]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{name}: {out}{err}");
        assert!(err.contains(&expected), "{name}: {err}");
    }
}

/// Removes a container by name when dropped, so a failing test leaves nothing running.
struct RemoveContainer(String);

impl Drop for RemoveContainer {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

#[tokio::test]
async fn docker_launch_reattach_and_stop_through_the_ssh_tunnel() {
    let test = "docker_launch_reattach_and_stop_through_the_ssh_tunnel";
    let Some(d) = docker_or_skip(test).await else {
        return;
    };
    let Some(sshd) = sshd_or_skip(test) else {
        return;
    };
    let image = test_image(&d).await;
    let port = free_port();
    let name = format!("mxtune-test-ssh-{}", ulid::Ulid::generate()).to_lowercase();
    let _cleanup = RemoveContainer(name.clone());
    let mut spec = docker_spec(&image, port, "test-model");
    spec.container.as_mut().unwrap().name = Some(name.clone());
    // A cache the host lacks: pre-flight there announces it and creates it once nothing blocks.
    let cache = sshd.dir.path().join("cache/on-the-host");
    spec.container.as_mut().unwrap().mounts = vec![mxtune::vocab::Mount {
        host: cache.display().to_string(),
        container: "/cache".into(),
        read_only: false,
    }];
    let spec_file = sshd.dir.path().join("spec.toml");
    std::fs::write(&spec_file, toml::to_string(&spec).unwrap()).unwrap();
    let home = sshd.config_home(&format!(
        "{}\n{}",
        sshd.host_entry("remote", MXTUNE),
        sshd.host_entry("gone", "/nonexistent/mxtune")
    ));
    let runs = sshd.dir.path().join("runs");
    let runs = runs.to_str().unwrap();

    let run = |args: Vec<String>| {
        let home = home.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let child = Command::new(MXTUNE)
                    .args(&args)
                    .env("XDG_CONFIG_HOME", &home)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                let pid = child.id();
                (pid, child.wait_with_output().unwrap())
            })
            .await
            .unwrap()
        }
    };
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    let launch_on = |host: &str, spec: &Path| {
        args(&[
            "launch",
            "--host",
            host,
            "--spec",
            spec.to_str().unwrap(),
            "--target",
            "docker",
            "--runs-dir",
            runs,
            "--startup-limit-s",
            "120",
        ])
    };

    // Pre-flight runs on the host (`mxtune preflight` there): its port is taken.
    let busy = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let (_, o) = run(launch_on("remote", &spec_file)).await;
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}{err}");
    assert!(
        err.contains(&format!(
            "pre-flight Error: on host remote: port {port} on 127.0.0.1 is not free"
        )),
        "{err}"
    );
    assert!(err.contains("nothing was started"), "{err}");
    assert!(
        !cache.exists(),
        "a blocked pre-flight created {}",
        cache.display()
    );
    drop(busy);

    // A host without mxtune: its checks cannot run, which is a warning; the image check
    // goes through its Docker engine and blocks.
    let mut missing = spec.clone();
    missing.container.as_mut().unwrap().image = "mxtune-test-no-such-image:1".into();
    let missing_file = sshd.dir.path().join("missing.toml");
    std::fs::write(&missing_file, toml::to_string(&missing).unwrap()).unwrap();
    let (_, o) = run(launch_on("gone", &missing_file)).await;
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}{err}");
    assert!(
        err.contains("pre-flight Warning: host gone: port, mounts, GPU processes, compilers and memory are not checked there: mxtune is not installed on host gone"),
        "{err}"
    );
    assert!(
        err.contains(
            "pre-flight Error: image mxtune-test-no-such-image:1 is not present on host gone"
        ),
        "{err}"
    );

    let (pid, o) = run(launch_on("remote", &spec_file)).await;
    let (out, err) = text(&o);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}{err}\nsshd log:\n{}",
        sshd.log()
    );
    assert!(!err.contains("not checked there"), "{err}");
    assert!(
        err.contains(&format!(
            "pre-flight Warning: on host remote: mount source {} (for /cache in the container) does not exist: mxtune creates it empty",
            cache.display()
        )),
        "{err}"
    );
    assert!(cache.is_dir());
    assert!(
        err.contains(&format!(
            "on host remote ({}): the API is port {port} there, forwarded to 127.0.0.1:",
            support::sshd::ALIAS
        )),
        "{err}"
    );
    assert!(out.contains("ready: http://127.0.0.1:"), "{out}");
    assert!(
        out.contains(&format!(
            "left running: container {name} on host remote (stop with `mxtune stop --host remote {name}`)"
        )),
        "{out}"
    );
    // The tunnel ended with the command.
    assert!(tunnel_dirs_of(pid).is_empty(), "{:?}", tunnel_dirs_of(pid));

    // The container runs on the "remote" engine (this machine's, through sshd) and serves.
    let inspected = d.inspect_container(&name, None).await.unwrap();
    assert_eq!(inspected.state.unwrap().running, Some(true));
    let labels = inspected.config.unwrap().labels.unwrap();
    assert!(labels.contains_key(mxtune::launch::docker::LABEL_RUN_ID));
    let pieces = streamed_completion(&format!("http://127.0.0.1:{port}"), "test-model", 3).await;
    assert_eq!(pieces.len(), 3);

    // Re-attach through a new tunnel: the port comes from the container's labels.
    let (pid, o) = run(args(&[
        "launch",
        "--host",
        "remote",
        "--reattach",
        &name,
        "--runs-dir",
        runs,
    ]))
    .await;
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        err.contains(&format!("re-attaching to container {name}")),
        "{err}"
    );
    assert!(out.contains("ready: http://127.0.0.1:"), "{out}");
    assert!(tunnel_dirs_of(pid).is_empty());

    // Stop through the tunnel, then nothing is left to stop.
    let (_, o) = run(args(&["stop", "--host", "remote", &name, "--grace-s", "5"])).await;
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(matches!(
        d.inspect_container(&name, None).await,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        })
    ));
    let (_, o) = run(args(&["stop", "--host", "remote", &name])).await;
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains(&format!(
            "nothing mxtune started on host remote matches {name:?}"
        )),
        "{err}"
    );
}

// ---- The panel ----

mod panel {
    use super::*;
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
    use mxtune::flags::preset::PresetStore;
    use mxtune::flags::{FlagSet, VllmFlavor};
    use mxtune::tui::app::{App, Effect, Paths, Tab};
    use mxtune::tui::screens::launch::TargetState;
    use mxtune::tui::{perform, step, ui};
    use mxtune::vocab::{NetworkMode, TargetKind};
    use std::collections::BTreeMap;

    fn app(dir: &Path) -> App {
        App::new(
            mxtune::tui::theme::Theme {
                color: false,
                ascii: false,
            },
            Paths {
                presets: PresetStore::new(vec![dir.join("presets")]),
                save_dir: dir.join("presets"),
                runs_dir: dir.join("runs"),
                export_dir: dir.to_path_buf(),
            },
        )
    }

    fn screen(app: &App, w: u16, h: u16) -> String {
        let mut t = ratatui::Terminal::new(ratatui::backend::TestBackend::new(w, h)).unwrap();
        t.draw(|f| ui::draw(f, app)).unwrap();
        t.backend().to_string()
    }

    fn key(app: &mut App, c: char) {
        app.on_key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE));
    }

    fn host(name: &str) -> mxtune::hosts::Host {
        mxtune::hosts::Host {
            name: name.into(),
            ssh: format!("me@{name}"),
            ssh_config: None,
            docker_socket: mxtune::hosts::DEFAULT_DOCKER_SOCKET.into(),
            mxtune: "mxtune".into(),
            nccl: Default::default(),
            defined_at: "hosts.toml:1".into(),
        }
    }

    #[test]
    fn host_picker_only_with_a_hosts_file() {
        let dir = tempfile::tempdir().unwrap();
        // Without hosts: no `h`, no host on the screen, nothing in the help.
        let mut a = app(dir.path());
        a.tab = Tab::Launch;
        a.launch.choice = TargetKind::Docker;
        key(&mut a, 'h');
        assert_eq!(a.launch.host, None);
        let s = screen(&a, 160, 30);
        assert!(!s.contains("host"), "{s}");
        key(&mut a, '?');
        let help = screen(&a, 160, 200);
        assert!(!help.contains("docker host"), "{help}");

        // With two hosts: `h` steps this machine → spark2 → spark3 → this machine.
        let mut a = app(dir.path());
        a.tab = Tab::Launch;
        a.launch.hosts = vec![host("spark2"), host("spark3")];
        key(&mut a, 'h');
        assert_eq!(a.launch.host, None, "h on the engine target does nothing");
        assert!(
            a.message.as_deref().unwrap().contains("press t for docker"),
            "{:?}",
            a.message
        );
        a.launch.choice = TargetKind::Docker;
        let s = screen(&a, 160, 30);
        assert!(s.contains("host this machine"), "{s}");
        assert!(s.contains("h docker host"), "{s}");
        key(&mut a, 'h');
        assert!(screen(&a, 160, 30).contains("host spark2 (me@spark2)"));
        key(&mut a, 'h');
        assert_eq!(a.launch.chosen_host().unwrap().name, "spark3");
        key(&mut a, 'h');
        assert_eq!(a.launch.chosen_host(), None);
        key(&mut a, '?');
        let help = screen(&a, 160, 200);
        assert!(
            help.contains("docker host: this machine / hosts.toml"),
            "{help}"
        );
    }

    /// The panel launches a Docker target on a host through the SSH tunnel, the Live screen
    /// switches to that host's own monitor, and the stop goes through the tunnel too.
    #[test]
    fn docker_panel_launches_on_a_host_and_watches_it() {
        let test = "docker_panel_launches_on_a_host_and_watches_it";
        let rt = tokio::runtime::Runtime::new().unwrap();
        let Some(d) = rt.block_on(docker_or_skip(test)) else {
            return;
        };
        let Some(sshd) = sshd_or_skip(test) else {
            return;
        };
        let _one_at_a_time = IN_PROCESS_TUNNELS.blocking_lock();
        let image = rt.block_on(test_image(&d));
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut bg = mxtune::tui::background::Background::new(tx).unwrap();
        let mut a = app(dir.path());
        let port = free_port();
        let name = format!("mxtune-test-panel-ssh-{}", ulid::Ulid::generate()).to_lowercase();
        let _cleanup = RemoveContainer(name.clone());
        let mut fs = FlagSet::default();
        fs.container.vllm = VllmFlavor::Upstream;
        fs.container.image = image;
        fs.container.name = Some(name.clone());
        fs.container.network = NetworkMode::Bridge;
        fs.container.gpus_all = false;
        fs.container.ulimits = BTreeMap::new();
        fs.container.hf_cache = None;
        fs.container.jit_cache = None;
        fs.container.env = BTreeMap::from([("MXTUNE_TEST_SM".to_string(), "121".to_string())]);
        fs.serving.host = Some("0.0.0.0".into());
        fs.serving.port = port;
        fs.serving.served_model_name = Some("m".into());
        a.flags.flags = fs;
        a.launch.hosts = vec![sshd.host("remote", MXTUNE)];
        a.launch.choice = TargetKind::Docker;
        a.tab = Tab::Launch;
        key(&mut a, 'h');
        assert_eq!(a.launch.chosen_host().unwrap().name, "remote");
        a.launch.state = TargetState::Launching;
        perform(&mut a, &mut bg, Effect::StartTarget);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let pump = |a: &mut App,
                    bg: &mut mxtune::tui::background::Background,
                    what: &str,
                    done: &dyn Fn(&App) -> bool| {
            while !done(a) {
                if let TargetState::Failed(m) = &a.launch.state {
                    panic!("{what}: the launch failed: {m}\nsshd log:\n{}", sshd.log());
                }
                if let Some(e) = &a.live.error {
                    panic!("{what}: the monitor failed: {e}");
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "never reached: {what}"
                );
                if let Ok(ev) = rx.recv_timeout(std::time::Duration::from_millis(200)) {
                    step(a, bg, ev);
                }
            }
        };
        pump(&mut a, &mut bg, "ready", &|a| {
            matches!(a.launch.state, TargetState::Ready { .. })
        });
        let TargetState::Ready { url, .. } = &a.launch.state else {
            unreachable!()
        };
        // Probed through the forwarded port, not the host's own.
        assert_ne!(url, &format!("http://127.0.0.1:{port}"));
        let describe = a.launch.describe.clone().unwrap();
        assert_eq!(describe, format!("container {name} on host remote"));
        let s = screen(&a, 160, 40);
        assert!(s.contains("host remote (mxtune-test-sshd)"), "{s}");

        // Live: the host's own samples (its mxtune monitor), named in the header.
        pump(&mut a, &mut bg, "a sample of the host", &|a| {
            a.live.host.as_deref() == Some("remote") && a.live.latest.is_some()
        });
        let latest = a.live.latest.as_ref().unwrap();
        assert!(latest.host.ram_total_bytes > 0);
        // The host's monitor scrapes the target's /metrics as that host sees it.
        match &latest.server {
            mxtune::monitor::sample::ServerStatus::Scraped(m) => {
                assert_eq!(m.url, format!("http://127.0.0.1:{port}/metrics"))
            }
            mxtune::monitor::sample::ServerStatus::NoMetrics { url } => {
                assert_eq!(url, &format!("http://127.0.0.1:{port}/metrics"))
            }
            other => panic!("the host's monitor did not scrape the target: {other:?}"),
        }
        a.tab = Tab::Live;
        let s = screen(&a, 160, 40);
        assert!(s.contains("host remote"), "{s}");

        // Stop through the tunnel; the Live screen goes back to this machine.
        perform(&mut a, &mut bg, Effect::StopTarget);
        pump(&mut a, &mut bg, "stopped", &|a| {
            matches!(a.launch.state, TargetState::Exited(_))
        });
        assert_eq!(a.live.host, None);
        let gone = rt.block_on(d.inspect_container(&name, None));
        assert!(
            matches!(
                gone,
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404,
                    ..
                })
            ),
            "{gone:?}"
        );
        drop(bg);
        // The panel's tunnel ended with the launch it carried.
        let left = tunnel_dirs_of(std::process::id());
        assert!(left.is_empty(), "{left:?}");
    }
}

/// Docker presets `NAMES` of the stand-in image in `dir/presets`, each with its own port and
/// container name (the containers are removed when the returned guards drop).
fn stand_in_presets(dir: &Path, image: &str, names: &[&str]) -> Vec<RemoveContainer> {
    let presets = dir.join("presets");
    let (hf, jit) = (dir.join("hf"), dir.join("jit"));
    for d in [&presets, &hf, &jit] {
        std::fs::create_dir_all(d).unwrap();
    }
    let mut guards = Vec::new();
    for name in names {
        let container = format!("mxtune-mhost-test-{}", ulid::Ulid::generate()).to_lowercase();
        std::fs::write(
            presets.join(format!("{name}.toml")),
            format!(
                "description = \"on hosts\"\ntarget = \"docker\"\n[axes]\nmoe_backend = \"marlin\"\n\
                 [serving]\nmodel = \"openai/gpt-oss-120b\"\nserved_model_name = \"m\"\nhost = \"0.0.0.0\"\nport = {}\n\
                 [container]\nimage = \"{image}\"\nname = \"{container}\"\nnetwork = \"bridge\"\ngpus_all = false\nulimits = {{}}\nvllm = \"fork\"\nhf_cache = \"{}\"\njit_cache = \"{}\"\n",
                free_port(),
                hf.display(),
                jit.display()
            ),
        )
        .unwrap();
        guards.push(RemoveContainer(container));
    }
    guards
}

#[tokio::test]
async fn matrix_on_two_hosts_at_once_tags_each_record_with_its_host_in_one_report() {
    let test = "matrix_on_two_hosts_at_once_tags_each_record_with_its_host_in_one_report";
    let Some(d) = docker_or_skip(test).await else {
        return;
    };
    let Some(sshd) = sshd_or_skip(test) else {
        return;
    };
    let image = test_image(&d).await;
    let dir = tempfile::tempdir().unwrap();
    let presets = dir.path().join("presets");
    let _cleanup = stand_in_presets(dir.path(), &image, &["m-one", "m-two"]);
    // Two hosts of hosts.toml, both the local sshd standing in for two machines: h1 runs this
    // mxtune, h2 has none (its readings are not taken, the matrix goes on).
    let home = sshd.config_home(&format!(
        "{}\n{}",
        sshd.host_entry("h1", MXTUNE),
        sshd.host_entry("h2", "/nonexistent/mxtune")
    ));
    let out = dir.path().join("out");
    let runs = dir.path().join("runs");
    let o = tokio::task::spawn_blocking({
        let (presets, out, runs, home) = (presets.clone(), out.clone(), runs.clone(), home.clone());
        move || {
            let child = Command::new(MXTUNE)
                // h1 has its own list; m-one, named, is dealt out over the hosts without one.
                .args([
                    "matrix", "--target", "docker", "--host", "h1=m-two", "--host", "h2",
                ])
                .args(["m-one", "--endpoint", "completions", "--no-shuffle"])
                .args([
                    "--grid", "pp=64", "tg=4", "runs=1", "warmup=0", "--levels", "1,4",
                ])
                .arg("--presets-dir")
                .arg(presets)
                .arg("--runs-dir")
                .arg(runs)
                .arg("--out")
                .arg(out)
                .env("XDG_CONFIG_HOME", home)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let pid = child.id();
            (pid, child.wait_with_output().unwrap())
        }
    })
    .await
    .unwrap();
    let (pid, o) = o;
    let (stdout, stderr) = text(&o);
    // 0, or 1 when the instant stand-in left a pp figure out on a loaded machine (as in
    // matrix_runs.rs); both presets must have run to the end either way.
    assert!(matches!(o.status.code(), Some(0 | 1)), "{stdout}{stderr}");
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("matrix-state.json")).unwrap())
            .unwrap();
    assert_eq!(state["plan"]["hosts"], serde_json::json!(["h1", "h2"]));
    assert_eq!(
        state["plan"]["host_presets"],
        serde_json::json!({"h1": ["m-two"]})
    );
    let order = state["order"].as_array().unwrap();
    assert_eq!(order.len(), 2, "{state}");
    for (p, (name, host)) in order.iter().zip([("m-one", "h2"), ("m-two", "h1")]) {
        assert_eq!(p["name"], name);
        assert_eq!(p["host"], host);
        assert_eq!(p["status"], "done", "{p}\n{stderr}");
        assert_eq!(p["levels"][0]["verdict"], "pass", "{p}");
        let record: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(p["record"].as_str().unwrap()).unwrap())
                .unwrap();
        let tags = record["identity"]["tags"].as_array().unwrap();
        assert!(
            tags.contains(&serde_json::json!(format!("host:{host}"))),
            "{tags:?}"
        );
        assert!(
            !record["results"].as_array().unwrap().is_empty(),
            "{record}"
        );
        // The environment is the host's, marked as such: its Docker engine's facts either way.
        let env = &record["environment"];
        assert_eq!(env["remote_host"], host, "{env}");
        assert!(env["host"]["os"].as_str().is_some(), "{env}");
        assert!(env["host"]["hostname"].as_str().is_some(), "{env}");
        assert!(
            env["host"]["ram_total_bytes"].as_u64().unwrap() > 0,
            "{env}"
        );
        let not_taken = format!(
            "run on host {host}: GPU and temperature readings of that host were not taken (no cool-down there): "
        );
        let warned = record["observed"]["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|w| w.as_str())
            .find(|w| w.starts_with(&not_taken));
        if host == "h1" {
            // The host's own monitor answered: its sample is in the record (no NVML on
            // this machine, so the reason it gave), and nothing says readings are missing.
            assert!(warned.is_none(), "{warned:?}");
            let gpu_error = env["gpu_error"].as_str().unwrap();
            assert!(gpu_error.starts_with("NVML not available"), "{env}");
            assert!(env["host"]["swap_total_bytes"].as_u64().is_some(), "{env}");
            assert!(env["host"]["cpu_threads"].as_u64().unwrap() > 0, "{env}");
            // The host's monitor ran alongside L4 (from its first sample on).
            let res = &record["resources"];
            assert!(res["samples"].as_u64().unwrap() >= 1, "{res}");
            assert!(res["host_cpu_mean_pct"].as_f64().is_some(), "{res}");
        } else {
            let w = warned.unwrap_or_else(|| panic!("no readings warning: {record}"));
            assert!(w.contains("mxtune is not installed on host h2"), "{w}");
            assert!(
                env["gpu_error"]
                    .as_str()
                    .unwrap()
                    .starts_with("not read on host h2: mxtune is not installed"),
                "{env}"
            );
            assert!(record["resources"].is_null(), "{}", record["resources"]);
        }
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("Hosts: h1 (its own: m-two), h2 (Docker over SSH; a host with its own presets runs those"),
        "{report}"
    );
    assert!(report.contains("| m-one (host h2) |"), "{report}");
    assert!(report.starts_with("# Matrix "), "{report}");
    assert!(
        report.lines().next().unwrap().ends_with("(hosts h1, h2)"),
        "{report}"
    );
    assert!(report.contains("| m-two (host h1) |"), "{report}");
    // No tunnel is left behind by the matrix.
    assert!(tunnel_dirs_of(pid).is_empty(), "{:?}", tunnel_dirs_of(pid));

    // --host is for Docker presets only, and a host must be in hosts.toml.
    let o = mxtune(
        &home,
        &[
            "matrix",
            "--target",
            "engine",
            "--host",
            "h1",
            "m-one",
            "--out",
            out.join("x").to_str().unwrap(),
        ],
    );
    assert!(
        text(&o)
            .1
            .contains("--host runs Docker presets on that host"),
        "{}",
        text(&o).1
    );
    let o = mxtune(
        &home,
        &[
            "matrix",
            "--target",
            "docker",
            "--host",
            "h9",
            "m-one",
            "--out",
            out.join("y").to_str().unwrap(),
        ],
    );
    assert!(
        text(&o).1.contains("no host named \"h9\""),
        "{}",
        text(&o).1
    );
}

/// The cool-down and the stress level's memory probe of a preset on a host read that host's
/// GPU. There is no NVML here, so the
/// host's mxtune is a stand-in that answers `--version` as this one and whose monitor reports
/// a GB10 at 95 °C (a real sample of this machine with that GPU in it); the matrix runs on it
/// through the real sshd and Docker.
#[tokio::test]
async fn matrix_cool_down_and_memory_probe_read_the_hosts_gpu() {
    let test = "matrix_cool_down_and_memory_probe_read_the_hosts_gpu";
    let Some(d) = docker_or_skip(test).await else {
        return;
    };
    let Some(sshd) = sshd_or_skip(test) else {
        return;
    };
    let image = test_image(&d).await;
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = stand_in_presets(dir.path(), &image, &["m-hot"]);
    let o = Command::new(MXTUNE)
        .args(["monitor", "--json", "--once"])
        .output()
        .unwrap();
    let mut sample: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    sample["gpu"] = serde_json::json!({
        "status": "available",
        "driver_version": "580.95.05",
        "cuda_driver_version": "13.0",
        "gpus": [{
            "index": 0, "name": "NVIDIA GB10", "uuid": "GPU-hot", "compute_capability": "12.1",
            "persistence_mode": "n/a", "compute_mode": "Default",
            "memory": {"source": "unified", "used_bytes": 1u64 << 30, "total_bytes": 128u64 << 30, "process_bytes": "n/a"},
            "clocks": {"sm_mhz": 2400, "graphics_mhz": 2400, "mem_mhz": "n/a"},
            "max_clocks": {"sm_mhz": 3000, "graphics_mhz": 3000, "mem_mhz": "n/a"},
            "power_w": 30.0, "power_limit_w": "n/a", "energy_j": "n/a", "temperature_c": 95,
            "utilization_gpu_pct": 0, "utilization_mem_pct": "n/a", "pstate": "P0",
            "throttle_reasons": [], "processes": []
        }]
    });
    // What the remote monitor prints must be a sample this mxtune reads.
    serde_json::from_value::<mxtune::monitor::Sample>(sample.clone()).unwrap();
    let line = sshd.dir.path().join("hot-sample.json");
    std::fs::write(&line, format!("{sample}\n")).unwrap();
    // Every second `--once` sample has 2 GiB in use instead of 1: two readings in a row (the
    // memory probe's before and after L3) differ, so its check names what it read.
    sample["gpu"]["gpus"][0]["memory"]["used_bytes"] = serde_json::json!(2u64 << 30);
    let other = sshd.dir.path().join("hot-sample-2.json");
    std::fs::write(&other, format!("{sample}\n")).unwrap();
    let count = sshd.dir.path().join("hot-count");
    let hot = fake_mxtune(
        &sshd,
        "hot-mxtune",
        &format!(
            "if [ \"$1\" = --version ]; then exec {MXTUNE} --version; fi\n\
             case \" $* \" in *\" --once \"*)\n\
               n=$(( $(cat {2} 2>/dev/null || echo 0) + 1 )); echo $n > {2}\n\
               if [ $((n % 2)) = 0 ]; then cat {1}; else cat {0}; fi; exit 0;;\n\
             esac\n\
             while cat {0}; do sleep 0.25; done",
            line.display(),
            other.display(),
            count.display()
        ),
    );
    let home = sshd.config_home(&sshd.host_entry("hot", &hot));
    let (out, runs) = (dir.path().join("out"), dir.path().join("runs"));
    let o = tokio::task::spawn_blocking({
        let (presets, out, runs) = (dir.path().join("presets"), out.clone(), runs.clone());
        move || {
            Command::new(MXTUNE)
                .args(["matrix", "--target", "docker", "--host", "hot", "m-hot"])
                .args([
                    "--endpoint",
                    "completions",
                    "--no-shuffle",
                    "--levels",
                    "1,3,4",
                ])
                .args(["--grid", "pp=64", "tg=4", "runs=1", "warmup=0"])
                // Hotter than 90 °C: one wait, then the limit lets the point start.
                .args(["--cooldown-c", "90", "--cooldown-limit-s", "1"])
                .arg("--presets-dir")
                .arg(presets)
                .arg("--runs-dir")
                .arg(runs)
                .arg("--out")
                .arg(out)
                .env("XDG_CONFIG_HOME", home)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let (stdout, stderr) = text(&o);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{stdout}{stderr}");
    assert!(
        stderr.contains("cool-down: GPU of host hot at 95 °C, waiting for < 90 °C"),
        "{stderr}"
    );
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("matrix-state.json")).unwrap())
            .unwrap();
    let p = &state["order"][0];
    assert_eq!(p["status"], "done", "{p}\n{stderr}");
    assert_eq!(p["point_temps_c"], serde_json::json!([95.0]), "{p}");
    // L3's memory check read the host's GB10 before and after. (The stand-in server stops
    // at 64 tokens, so L3 fails on its long generation too.)
    let stress = p["levels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["level"] == "stress")
        .unwrap_or_else(|| panic!("no L3 in {p}"));
    let detail = stress["detail"].as_str().unwrap();
    assert!(
        detail.contains("memory stable within")
            && detail.contains("GPU 0 (NVIDIA GB10) memory in use, Unified memory on host hot: "),
        "{stress}"
    );
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p["record"].as_str().unwrap()).unwrap())
            .unwrap();
    let env = &record["environment"];
    assert_eq!(env["remote_host"], "hot", "{env}");
    assert_eq!(env["gpus"][0]["name"], "NVIDIA GB10", "{env}");
    assert!(env["gpu_error"].is_null(), "{env}");
    assert_eq!(
        record["resources"]["temp_max_c"], 95.0,
        "{}",
        record["resources"]
    );
}

/// `--host NAME=PRESET,…` gives a host its own presets; a list that cannot be run is refused
/// before anything starts, naming what is wrong and what to do. No host is contacted.
#[test]
fn matrix_host_lists_that_cannot_run_are_refused_before_anything_starts() {
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("mxtune")).unwrap();
    std::fs::write(
        home.path().join("mxtune/hosts.toml"),
        "[[host]]\nname = \"h1\"\nssh = \"nowhere1\"\n[[host]]\nname = \"h2\"\nssh = \"nowhere2\"\n",
    )
    .unwrap();
    let out = home.path().join("out");
    let cases: &[(&[&str], &str)] = &[
        (
            &["--host", "h1="],
            "--host h1=: the list of presets for host h1 has an empty name; give --host h1=PRESET,PRESET…",
        ),
        (&["--host", "h1=a,,b"], "has an empty name"),
        (
            &["--host", "=a"],
            "the host's name is missing; give --host NAME or --host NAME=PRESET,PRESET…",
        ),
        (
            &["--host", "h1=a", "--host", "h2=b", "c"],
            "preset(s) c have no host: every --host has its own list",
        ),
        (
            &["--host", "h1=a", "--host", "h1"],
            "--host h1 is given twice",
        ),
        (
            &["--host", "h1=a", "--host", "h2=a"],
            "preset a is listed twice",
        ),
        (&["--host", "h9=a"], "no host named \"h9\""),
        (&[], "no presets: name the presets to run"),
    ];
    for (args, want) in cases {
        let o = mxtune(
            home.path(),
            &[&["matrix", "--out", out.to_str().unwrap()][..], args].concat(),
        );
        let (stdout, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {stdout}{err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?} left {}", out.display());
    }
}

/// `ab --host`: both presets launched on the host's Docker engine through the same code as a
/// matrix's (`run::start_on`), benchmarked through the forward, records tagged and holding
/// the host's readings, nothing left behind.
#[tokio::test]
async fn ab_on_a_host_launches_both_presets_there_and_benchmarks_through_the_forward() {
    let test = "ab_on_a_host_launches_both_presets_there_and_benchmarks_through_the_forward";
    let Some(d) = docker_or_skip(test).await else {
        return;
    };
    if sshd_or_skip(test).is_none() {
        return;
    }
    // DEBUG1: sshd logs each forwarded connection with its target port.
    let sshd = Sshd::with_config("LogLevel DEBUG1\n");
    let image = test_image(&d).await;
    let dir = tempfile::tempdir().unwrap();
    let presets = dir.path().join("presets");
    let cleanup = stand_in_presets(dir.path(), &image, &["ab-a", "ab-b"]);
    let home = sshd.config_home(&sshd.host_entry("h", MXTUNE));
    let (out, runs) = (dir.path().join("ab"), dir.path().join("runs"));
    let o = tokio::task::spawn_blocking({
        let (presets, out, runs, home) = (presets.clone(), out.clone(), runs.clone(), home.clone());
        move || {
            let child = Command::new(MXTUNE)
                .args(["ab", "ab-a", "ab-b", "--host", "h", "--rounds", "1"])
                .args([
                    "--endpoint",
                    "completions",
                    "--grid",
                    "pp=64",
                    "tg=4",
                    "runs=1",
                ])
                .args(["warmup=0", "--presets-dir"])
                .arg(presets)
                .arg("--runs-dir")
                .arg(runs)
                .arg("--out")
                .arg(out)
                .env("XDG_CONFIG_HOME", home)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let pid = child.id();
            (pid, child.wait_with_output().unwrap())
        }
    })
    .await
    .unwrap();
    let (pid, o) = o;
    let (stdout, stderr) = text(&o);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{stdout}{stderr}\nsshd log:\n{}",
        sshd.log()
    );
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("ab.json")).unwrap()).unwrap();
    assert_eq!(result["host"], "h", "{result}");
    assert_eq!(result["excluded"], serde_json::json!([]), "{result}");
    assert!(
        stdout.contains("both on host h (Docker over SSH)"),
        "{stdout}"
    );
    let records = result["records"].as_array().unwrap();
    assert_eq!(records.len(), 2, "{result}");
    let log = sshd.log();
    let written: Vec<serde_json::Value> = std::fs::read_dir(&runs)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
        .collect();
    assert_eq!(written.len(), 2, "{written:?}");
    for (pair, cleanup) in records.iter().zip(&cleanup) {
        let (preset, run_id) = (pair[0].as_str().unwrap(), pair[1].as_str().unwrap());
        let record = written
            .iter()
            .find(|r| r["identity"]["run_id"] == run_id)
            .unwrap_or_else(|| panic!("no record {run_id}"));
        assert_eq!(record["target"]["preset"], preset);
        assert_eq!(record["identity"]["status"], "completed", "{record}");
        let tags = record["identity"]["tags"].as_array().unwrap();
        assert!(tags.contains(&serde_json::json!("host:h")), "{tags:?}");
        assert!(
            tags.iter().any(|t| t.as_str().unwrap().starts_with("ab:")),
            "{tags:?}"
        );
        assert!(
            !record["results"].as_array().unwrap().is_empty(),
            "{record}"
        );
        // The container ran on the host's engine, named as in the preset.
        assert_eq!(
            record["target"]["docker"]["container_name"], cleanup.0,
            "{}",
            record["target"]
        );
        // The host's readings, as a matrix on it takes them.
        let env = &record["environment"];
        assert_eq!(env["remote_host"], "h", "{env}");
        assert!(
            env["gpu_error"]
                .as_str()
                .unwrap()
                .starts_with("NVML not available"),
            "{env}"
        );
        assert!(
            env["host"]["ram_total_bytes"].as_u64().unwrap() > 0,
            "{env}"
        );
        assert!(
            record["resources"]["samples"].as_u64().unwrap() >= 1,
            "{}",
            record["resources"]
        );
        let warnings = record["observed"]["warnings"].as_array().unwrap();
        assert!(
            !warnings.iter().any(|w| w
                .as_str()
                .unwrap()
                .contains("readings of that host were not taken")),
            "{warnings:?}"
        );
        // Served through the forward: the API port in the preset is the host's, reached
        // through sshd.
        let port = record["target"]["launch"]["port"].as_u64().unwrap();
        assert!(
            log.contains(&format!("target 127.0.0.1 port {port}")),
            "no forward to port {port} in the sshd log:\n{log}"
        );
        assert!(
            record["target"]["url"]
                .as_str()
                .unwrap()
                .starts_with("http://127.0.0.1:"),
            "{}",
            record["target"]
        );
    }
    // Stopped and removed on the host, and no tunnel or ssh left.
    for c in &cleanup {
        let o = Command::new("docker")
            .args(["ps", "-aq", "--filter", &format!("name={}", c.0)])
            .output()
            .unwrap();
        assert!(o.stdout.is_empty(), "container {} left", c.0);
    }
    assert!(tunnel_dirs_of(pid).is_empty(), "{:?}", tunnel_dirs_of(pid));
    let config = sshd.dir.path().join("ssh_config").display().to_string();
    let left = processes_with(&config);
    assert!(left.is_empty(), "ssh left running: {left:?}");
}

/// What an A/B on a host cannot do is refused before anything starts, as a matrix refuses
/// it; no host is contacted.
#[test]
fn ab_host_that_cannot_run_is_refused_before_anything_starts() {
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("mxtune")).unwrap();
    std::fs::write(
        home.path().join("mxtune/hosts.toml"),
        "[[host]]\nname = \"h1\"\nssh = \"nowhere1\"\n[[host]]\nname = \"h2\"\nssh = \"nowhere2\"\n",
    )
    .unwrap();
    let out = home.path().join("out");
    let cases: &[(&[&str], &str)] = &[
        (
            &["--host", "h1", "--host", "h2"],
            "--host is given 2 times (h1, h2): an A/B runs A and B on the same machine",
        ),
        (
            &["--host", "h1=a"],
            "--host h1=a: an A/B runs its two presets on one host and takes no list of presets for it; give --host NAME",
        ),
        (
            &["--host", "h1", "--target", "engine"],
            "--host runs Docker presets on that host: use --target docker (for the engine, run mxtune on that host)",
        ),
        (
            &["--host", "h9"],
            "no host named \"h9\"; the hosts are: h1, h2",
        ),
        (
            &["--host", ""],
            "the host's name is missing; give --host NAME",
        ),
    ];
    for (args, want) in cases {
        let o = mxtune(
            home.path(),
            &[&["ab", "a", "b", "--out", out.to_str().unwrap()][..], args].concat(),
        );
        let (stdout, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {stdout}{err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?} left {}", out.display());
    }
}

/// Processes whose command line holds `needle` (e.g. a test sshd's client configuration,
/// which only the ssh processes of that test name).
fn processes_with(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(needle))
        .collect()
}

#[tokio::test]
async fn bench_host_reaches_the_server_through_an_ssh_forward_and_closes_it() {
    let test = "bench_host_reaches_the_server_through_an_ssh_forward_and_closes_it";
    if sshd_or_skip(test).is_none() {
        return;
    }
    // DEBUG1: sshd logs each forwarded connection with its target, the proof that the bench
    // went through the host and not straight to the port.
    let sshd = Sshd::with_config("LogLevel DEBUG1\n");
    let home = sshd.config_home(&sshd.host_entry("remote", MXTUNE));
    let d = double::spawn(double::Script::default()).await;
    let port = d.url.rsplit(':').next().unwrap().to_string();
    let runs = tempfile::tempdir().unwrap();
    let child = tokio::process::Command::new(MXTUNE)
        .args(["bench", "--host", "remote", "--url", &d.url])
        .args(["--pp", "32", "--tg", "8", "--runs", "2", "--warmup", "0"])
        .args(["--json", "--record", "--runs-dir"])
        .arg(runs.path())
        .env("XDG_CONFIG_HOME", &home)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let o = child.wait_with_output().await.unwrap();
    let (out, err) = text(&o);
    assert!(
        o.status.success(),
        "{out}\n{err}\nsshd log:\n{}",
        sshd.log()
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["host"], "remote", "{out}");
    assert_eq!(v["url"], d.url.as_str(), "{out}");
    assert_eq!(v["points"][0]["requests"], 2, "{out}");
    assert_eq!(v["points"][0]["errors"], 0, "{out}");
    assert_eq!(d.posts(), 2);
    assert!(
        err.contains(&format!(
            "benchmarked {} on host remote through an SSH forward at http://127.0.0.1:",
            d.url
        )),
        "{err}"
    );
    // The requests went through sshd to the server's port.
    let log = sshd.log();
    assert!(
        log.contains(&format!("target 127.0.0.1 port {port}")),
        "no forward to port {port} in the sshd log:\n{log}"
    );
    // The record names the host and the URL as seen there, not the local forward.
    let records: Vec<_> = std::fs::read_dir(runs.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(records.len(), 1, "{records:?}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&records[0]).unwrap()).unwrap();
    let tags: Vec<&str> = r["identity"]["tags"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    assert!(tags.contains(&"host:remote"), "{tags:?}");
    assert_eq!(
        r["target"]["url"],
        format!("{}/v1", d.url),
        "{}",
        r["target"]
    );
    // No tunnel left behind: neither its directory nor an ssh of this host.
    assert!(tunnel_dirs_of(pid).is_empty(), "{:?}", tunnel_dirs_of(pid));
    let config = sshd.dir.path().join("ssh_config").display().to_string();
    let left = processes_with(&config);
    assert!(left.is_empty(), "ssh left running: {left:?}");
}

#[test]
fn bench_host_errors_name_the_host_and_the_file() {
    let home = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{}", free_port());
    // No hosts file: where it should be.
    let o = mxtune(home.path(), &["bench", "--host", "spark2", "--url", &url]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let file = home.path().join("mxtune/hosts.toml");
    assert!(
        err.contains(&format!(
            "--host spark2: there is no hosts file {}",
            file.display()
        )),
        "{err}"
    );
    // A name not in the file: the file, the names, and how to list them.
    std::fs::create_dir_all(home.path().join("mxtune")).unwrap();
    std::fs::write(&file, "[[host]]\nname = \"spark2\"\nssh = \"me@spark2\"\n").unwrap();
    let o = mxtune(home.path(), &["bench", "--host", "spark3", "--url", &url]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "{}: no host named \"spark3\"; the hosts are: spark2 (`mxtune hosts list`)",
            file.display()
        )),
        "{err}"
    );
    // TLS through the forward would not match the certificate: refused before any ssh.
    let o = mxtune(
        home.path(),
        &[
            "bench",
            "--host",
            "spark2",
            "--url",
            "https://10.0.0.2:8000",
        ],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("with --host the URL must be http://"), "{err}");
}

#[tokio::test]
async fn bench_host_interrupted_closes_the_forward() {
    let test = "bench_host_interrupted_closes_the_forward";
    let Some(sshd) = sshd_or_skip(test) else {
        return;
    };
    let home = sshd.config_home(&sshd.host_entry("remote", MXTUNE));
    // The first answer stalls after one chunk: the bench is mid-request when interrupted.
    let d = double::spawn(double::Script {
        fault: double::Fault::StallAfter(1),
        ..double::Script::default()
    })
    .await;
    let runs = tempfile::tempdir().unwrap();
    let child = tokio::process::Command::new(MXTUNE)
        .args(["bench", "--host", "remote", "--url", &d.url, "--model", "m"])
        .args(["--pp", "32", "--tg", "8", "--runs", "1", "--warmup", "0"])
        .args(["--latency-mode", "none", "--json", "--record", "--runs-dir"])
        .arg(runs.path())
        .env("XDG_CONFIG_HOME", &home)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    // Wait (bounded, not timed) until the request has reached the server through the forward.
    let mut waited = 0;
    while d.posts() == 0 {
        assert!(waited < 600, "no request reached the server in 60 s");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        waited += 1;
    }
    assert!(!tunnel_dirs_of(pid).is_empty(), "no tunnel while running");
    // Ctrl-C to mxtune alone (a terminal would signal ssh too; this shows mxtune ends it).
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGINT) }, 0);
    let o = child.wait_with_output().await.unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(130), "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["aborted"], true, "{out}");
    assert_eq!(v["host"], "remote", "{out}");
    assert!(tunnel_dirs_of(pid).is_empty(), "{:?}", tunnel_dirs_of(pid));
    let config = sshd.dir.path().join("ssh_config").display().to_string();
    let left = processes_with(&config);
    assert!(left.is_empty(), "ssh left running: {left:?}");
}
