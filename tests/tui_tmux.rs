//! End-to-end: the real `mxtune` binary in a real terminal (tmux), driven with send-keys and
//! read back with capture-pane.

use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

#[path = "support/loading_double.rs"]
mod loading_double;

mod support;

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run tmux {args:?}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn have_tmux() -> bool {
    match Command::new("tmux").arg("-V").output() {
        Ok(o) if o.status.success() => true,
        _ => {
            if std::env::var("CI").is_ok() {
                panic!("tmux is required in CI (.ci/run installs it)");
            }
            eprintln!("SKIPPED: tmux not installed (apt-get install tmux)");
            false
        }
    }
}

/// A tmux session running a shell, killed when dropped.
struct Session {
    name: String,
}

impl Session {
    fn new(tag: &str, width: u16, height: u16) -> Self {
        let name = format!("mxtune-test-{tag}-{}", std::process::id());
        let status = Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                &name,
                "-x",
                &width.to_string(),
                "-y",
            ])
            .arg(height.to_string())
            .args(["bash", "--norc", "--noprofile"])
            .env("PS1", "$ ")
            .status()
            .expect("tmux new-session");
        assert!(status.success(), "tmux new-session failed");
        Session { name }
    }

    fn send(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", &self.name];
        args.extend_from_slice(keys);
        tmux(&args);
    }

    fn screen(&self) -> String {
        tmux(&["capture-pane", "-p", "-t", &self.name])
    }

    fn alternate_on(&self) -> bool {
        tmux(&["display-message", "-p", "-t", &self.name, "#{alternate_on}"]).trim() == "1"
    }

    /// Wait until the screen no longer contains `needle`.
    fn wait_gone(&self, needle: &str) {
        let start = Instant::now();
        while self.screen().contains(needle) {
            if start.elapsed() > Duration::from_secs(60) {
                panic!("screen kept showing {needle:?}:\n{}", self.screen());
            }
            sleep(Duration::from_millis(100));
        }
    }

    /// Wait until the screen contains `needle` (a behavioural wait, not a timing assert).
    fn wait_for(&self, needle: &str) -> String {
        self.wait_until(needle, |s| s.contains(needle))
    }

    /// Wait until the pane's shell has no child process left (the panel has exited).
    fn wait_for_panel_exit(&self) {
        let shell = tmux(&["display-message", "-p", "-t", &self.name, "#{pane_pid}"]);
        let start = Instant::now();
        loop {
            let out = Command::new("pgrep")
                .args(["-P", shell.trim()])
                .output()
                .expect("pgrep");
            if out.stdout.is_empty() {
                return;
            }
            if start.elapsed() > Duration::from_secs(60) {
                panic!("the panel did not exit; screen:\n{}", self.screen());
            }
            sleep(Duration::from_millis(100));
        }
    }

    /// Wait until `ready(screen)` holds; `what` names the condition in the failure message.
    fn wait_until(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        self.wait_longer(what, Duration::from_secs(60), ready)
    }

    /// [`Session::wait_until`] with its own bound, for work that takes minutes on the
    /// shared debug build (four 64-token generations of the CPU engine).
    fn wait_longer(&self, what: &str, limit: Duration, ready: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if ready(&s) {
                return s;
            }
            if start.elapsed() > limit {
                panic!("screen never showed {what:?}; last screen:\n{s}");
            }
            sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        tmux(&["kill-session", "-t", &self.name]);
    }
}

fn launch_cmd(dir: &std::path::Path) -> String {
    format!(
        "cd {d} && MXTUNE_RUNS_DIR={d}/runs MXTUNE_PRESETS_DIR={p}/presets XDG_CONFIG_HOME={d}/config {bin}",
        d = dir.display(),
        p = env!("CARGO_MANIFEST_DIR"),
        bin = env!("CARGO_BIN_EXE_mxtune")
    )
}

#[test]
fn tui_tmux_tabs_help_and_quit() {
    if !have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Session::new("tabs", 100, 30);
    s.send(&[&launch_cmd(dir.path()), "Enter"]);
    s.wait_for("preset engine-cpu-tiny");
    assert!(
        s.alternate_on(),
        "the panel should use the alternate screen"
    );
    // Toggle the first axis (moe_backend): the unsaved-changes marker appears.
    s.send(&["Enter"]);
    s.wait_for("[+] unsaved");
    s.send(&["3"]);
    s.wait_for("window 5 min");
    s.send(&["Tab"]);
    s.wait_for("no target running");
    s.send(&["?"]);
    s.wait_for("any other key closes)");
    s.send(&["Escape"]);
    s.wait_gone("any other key closes)");
    s.send(&["q"]);
    // Keys typed before the panel has exited would go to the panel, not the shell.
    s.wait_for_panel_exit();
    s.send(&["echo done-$((40+2))", "Enter"]);
    s.wait_for("done-42");
    assert!(!s.alternate_on(), "quit must leave the alternate screen");
}

#[test]
fn tui_tmux_preset_option_picks_the_start_and_the_next_session_remembers_it() {
    if !have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Session::new("startpreset", 100, 30);
    s.send(&[
        &format!(
            "{} --preset engine-cuda-20b-synthetic",
            launch_cmd(dir.path())
        ),
        "Enter",
    ]);
    s.wait_for("preset engine-cuda-20b-synthetic");
    s.send(&["q"]);
    s.wait_for_panel_exit();
    let file = dir.path().join("config/mxtune/panel.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("engine-cuda-20b-synthetic"), "{text}");
    // No option this time: the panel starts where the last session was.
    s.send(&[&launch_cmd(dir.path()), "Enter"]);
    s.wait_for("preset engine-cuda-20b-synthetic");
    s.send(&["q"]);
    s.wait_for_panel_exit();
}

/// Whether the escape sequences of a `capture-pane -e` dump set any colour (SGR 30–38,
/// 40–48, 90–97, 100–107; 39/49 only reset to the default).
fn sets_colour(dump: &str) -> bool {
    dump.split("\x1b[").skip(1).any(|seq| {
        let Some(end) = seq.find(|c: char| !(c.is_ascii_digit() || c == ';')) else {
            return false;
        };
        seq[end..].starts_with('m')
            && seq[..end].split(';').any(|p| {
                matches!(
                    p.parse::<u32>(),
                    Ok(30..=38 | 40..=48 | 90..=97 | 100..=107)
                )
            })
    })
}

#[test]
fn tui_tmux_no_color_env_draws_without_colour() {
    if !have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Session::new("nocolor", 100, 30);
    s.send(&[&launch_cmd(dir.path()), "Enter"]);
    s.wait_for("preset engine-cpu-tiny");
    let coloured = tmux(&["capture-pane", "-e", "-p", "-t", &s.name]);
    assert!(
        sets_colour(&coloured),
        "the panel draws in colour by default"
    );
    s.send(&["q"]);
    s.wait_for_panel_exit();

    s.send(&[
        &format!("export NO_COLOR=1; {}", launch_cmd(dir.path())),
        "Enter",
    ]);
    s.wait_for("preset engine-cpu-tiny");
    for (tab, shows) in [
        ("2", "watchdog"),
        ("3", "window 5 min"),
        ("5", "filter:"),
        ("1", "max_model_len"),
    ] {
        s.send(&[tab]);
        s.wait_for(shows);
        let plain = tmux(&["capture-pane", "-e", "-p", "-t", &s.name]);
        assert!(!sets_colour(&plain), "colour with NO_COLOR set:\n{plain:?}");
    }
    s.send(&["q"]);
    s.wait_for_panel_exit();
}

#[test]
fn tui_tmux_sighup_restores_terminal() {
    if !have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Session::new("hup", 100, 30);
    s.send(&[&launch_cmd(dir.path()), "Enter"]);
    s.wait_for("1 Flags");
    // The hang-up a dropped SSH session delivers, sent to the panel (the shell's child).
    let shell = tmux(&["display-message", "-p", "-t", &s.name, "#{pane_pid}"]);
    let child = Command::new("pgrep")
        .args(["-P", shell.trim()])
        .output()
        .expect("pgrep");
    let child = String::from_utf8_lossy(&child.stdout).trim().to_string();
    assert!(
        !child.is_empty(),
        "mxtune is not running under the pane's shell"
    );
    let status = Command::new("kill")
        .args(["-HUP", &child])
        .status()
        .expect("kill");
    assert!(status.success());
    // Type only once the panel is gone: keys sent while it is still exiting would be read by
    // its input thread instead of the shell.
    s.wait_for_panel_exit();
    s.send(&[
        "stty -a | tr ' ' '\\n' | grep -E '^-?(icanon|echo)$' | tr '\\n' ' '; echo E\"\"ND",
        "Enter",
    ]);
    let screen = s.wait_for("END");
    assert!(!s.alternate_on(), "SIGHUP must leave the alternate screen");
    assert!(
        screen.contains("icanon echo") && !screen.contains("-icanon"),
        "terminal left in raw mode:\n{screen}"
    );
}

#[test]
fn tui_tmux_launch_engine_then_stop() {
    if !have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The default preset, on a free port, so parallel tests and servers do not collide.
    let port = tiny_preset_on_free_port(dir.path());
    let s = Session::new("launch", 120, 40);
    open_launch_screen(&s, dir.path());
    s.send(&["l"]);
    let screen = s.wait_for("phase ready");
    assert!(screen.contains(&format!("127.0.0.1:{port}")), "{screen}");
    // The verdict follows readiness; wait for the verdict row itself, not the log line.
    s.wait_until("kernel-path verdict for sinks: valid", |screen| {
        screen
            .lines()
            .any(|l| l.contains("sinks=on") && l.contains("valid"))
    });
    s.send(&["x"]);
    s.wait_for("Stop target?");
    s.send(&["y"]);
    s.wait_for("phase exited");
    s.send(&["q"]);
    // Keys typed before the panel has exited would go to the panel, not the shell.
    s.wait_for_panel_exit();
    s.send(&["echo done-$((40+2))", "Enter"]);
    s.wait_for("done-42");
}

/// The `elapsed m:ss` on the Launch screen, in seconds.
fn elapsed_s(screen: &str) -> Option<u64> {
    let rest = &screen[screen.find("elapsed ")? + "elapsed ".len()..];
    let (m, s) = rest.split_whitespace().next()?.split_once(':')?;
    Some(m.parse::<u64>().ok()? * 60 + s.parse::<u64>().ok()?)
}

#[test]
fn tui_tmux_attach_to_a_loading_server_shows_a_running_clock_and_the_probe_answer() {
    if !have_tmux() {
        return;
    }
    use loading_double::{LOADING_MESSAGE, loading_double};
    let url = loading_double();
    let dir = tempfile::tempdir().unwrap();
    let s = Session::new("probe", 120, 30);
    s.send(&[&launch_cmd(dir.path()), "Enter"]);
    s.wait_for("preset engine-cpu-tiny");
    s.send(&["2"]);
    s.wait_for("[engine]");
    s.send(&["u"]);
    s.wait_for("[attach]");
    s.send(&["BSpace"; 40]);
    s.send(&["-l", &url]);
    s.send(&["Enter"]);
    // Typed and done: the field no longer shows its cursor.
    let done = format!("url {url}");
    s.wait_until(&done, |screen| {
        screen.lines().any(|l| l.trim_end().ends_with(&done))
    });
    s.send(&["l"]);
    let pressed = Instant::now();

    // The server's own words are on screen while the start is stuck, not after the limit.
    let screen = s.wait_for("probe: POST /v1/completions");
    let screen = if screen.contains(LOADING_MESSAGE) {
        screen
    } else {
        s.wait_for(LOADING_MESSAGE)
    };
    assert!(
        pressed.elapsed() < Duration::from_secs(8),
        "the probe answer took {:?} to show:\n{screen}",
        pressed.elapsed()
    );
    // The attach limit applies.
    assert!(screen.contains("/1:00"), "{screen}");

    // The clock runs while the monitor's samples and the probe answers keep arriving: every
    // second shows, in order, with no stall.
    let mut seen = Vec::new();
    let start = Instant::now();
    while seen.last().is_none_or(|&e| e < 6) {
        if let Some(e) = elapsed_s(&s.screen())
            && seen.last() != Some(&e)
        {
            seen.push(e);
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "the clock stalled: {seen:?}\n{}",
            s.screen()
        );
        sleep(Duration::from_millis(100));
    }
    let from = seen[0];
    assert_eq!(seen, (from..=6).collect::<Vec<_>>(), "one step a second");
    s.send(&["x"]);
    s.wait_for("Stop target?");
    s.send(&["y"]);
    s.wait_for("phase exited");
    s.send(&["q"]);
    s.wait_for_panel_exit();
}

/// The children of `pid` (pgrep -P).
fn children(pid: &str) -> Vec<String> {
    let out = Command::new("pgrep")
        .args(["-P", pid.trim()])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Starts the panel in `s` with its runs, presets and config under `dir` and opens the Launch
/// screen on the engine preset written by [`tiny_preset_on_free_port`].
fn open_launch_screen(s: &Session, dir: &std::path::Path) {
    s.send(&[
        &format!(
            "cd {d} && MXTUNE_RUNS_DIR={d}/runs MXTUNE_PRESETS_DIR={d}/presets XDG_CONFIG_HOME={d}/config {bin}",
            d = dir.display(),
            bin = env!("CARGO_BIN_EXE_mxtune")
        ),
        "Enter",
    ]);
    s.wait_for("preset engine-cpu-tiny");
    s.send(&["2"]);
    s.wait_for("[engine]");
}

/// A copy of the default preset on a free port, in `dir/presets`; returns the port.
fn tiny_preset_on_free_port(dir: &std::path::Path) -> u16 {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let presets = dir.join("presets");
    std::fs::create_dir_all(&presets).unwrap();
    let tiny = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("presets/engine-cpu-tiny.toml"),
    )
    .unwrap();
    let tiny = tiny.replace("port = 8000", &format!("port = {port}"));
    assert!(tiny.contains(&format!("port = {port}")));
    std::fs::write(presets.join("engine-cpu-tiny.toml"), tiny).unwrap();
    port
}

#[test]
fn tui_tmux_preflight_port_taken_blocks_the_launch_and_starts_nothing() {
    if !have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = tiny_preset_on_free_port(dir.path());
    // Something else listens on the preset's port now.
    let _taken = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let s = Session::new("preflight-port", 200, 40);
    open_launch_screen(&s, dir.path());
    s.send(&["l"]);
    // The findings come first, then the launch's failure: wait for both on screen.
    let screen = s.wait_until("the blocked pre-flight and the failed phase", |screen| {
        screen.contains("Pre-flight: blocked, nothing was started")
            && screen.contains("phase failed")
    });
    assert!(
        screen.contains(&format!("error: port {port} on 127.0.0.1 is not free")),
        "{screen}"
    );
    assert!(screen.contains("or choose another port"), "{screen}");
    assert!(screen.contains("phase failed"), "{screen}");
    // No engine under the panel, and no target log.
    let shell = tmux(&["display-message", "-p", "-t", &s.name, "#{pane_pid}"]);
    let panel = children(&shell);
    assert_eq!(
        panel.len(),
        1,
        "one mxtune under the pane's shell: {panel:?}"
    );
    assert_eq!(children(&panel[0]), Vec::<String>::new(), "nothing started");
    let logs: Vec<_> = std::fs::read_dir(dir.path().join("runs"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        !logs
            .iter()
            .any(|p| p.to_string_lossy().ends_with(".target.log")),
        "{logs:?}"
    );
    // Nothing runs, so quitting asks nothing.
    s.send(&["q"]);
    s.wait_for_panel_exit();
}

/// A process named `ptxas` (`sleep` through a link of that name: the kernel names a process
/// after the path it was started by): a leftover JIT compiler as pre-flight sees it. Killed
/// when dropped.
struct FakeCompiler(std::process::Child);

impl FakeCompiler {
    fn start(dir: &std::path::Path) -> Self {
        // A link, not a copy: a copy's write handle, inherited by a child another test
        // forks meanwhile, would make starting it fail with ETXTBSY.
        let exe = dir.join("ptxas");
        std::os::unix::fs::symlink("/bin/sleep", &exe).expect("link /bin/sleep");
        FakeCompiler(Command::new(&exe).arg("600").spawn().expect("start ptxas"))
    }
}

impl Drop for FakeCompiler {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn tui_tmux_preflight_warning_is_shown_and_the_launch_goes_on() {
    if !have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = tiny_preset_on_free_port(dir.path());
    let bin = tempfile::tempdir().unwrap();
    let compiler = FakeCompiler::start(bin.path());
    let pid = compiler.0.id();
    let s = Session::new("preflight-warn", 200, 40);
    open_launch_screen(&s, dir.path());
    s.send(&["l"]);
    let screen = s.wait_for("phase ready");
    let shell = tmux(&["display-message", "-p", "-t", &s.name, "#{pane_pid}"]);
    let panel = children(&shell);
    let _engine = KillOnDrop(panel.first().map(|p| children(p)).unwrap_or_default());
    assert!(screen.contains(&format!("127.0.0.1:{port}")), "{screen}");
    // The warning stays on screen while the target runs, as `mxtune launch` prints it.
    assert!(
        screen.contains("Pre-flight: warnings; the launch went on"),
        "{screen}"
    );
    assert!(
        screen.contains("warning: leftover JIT compiler processes:")
            && screen.contains(&format!("ptxas (pid {pid}")),
        "{screen}"
    );
    drop(compiler);
    s.send(&["x"]);
    s.wait_for("Stop target?");
    s.send(&["y"]);
    s.wait_for("phase exited");
    s.send(&["q"]);
    s.wait_for_panel_exit();
}

/// Stops the engine the panel left running (a hang-up leaves targets up on purpose).
struct KillOnDrop(Vec<String>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = Command::new("kill").args(["-TERM", pid]).status();
        }
    }
}

/// The tests that benchmark the CPU engine take turns: on a small shared machine two of
/// them at once starve each other past the screen waits.
static CPU_BENCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The two-node docker-cluster tests take turns: run at once, one's Ray worker went missing
/// while the other's cluster came and went on the same host network (CI, session 17).
static DOCKER_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn tui_tmux_sighup_during_bench_saves_an_aborted_record() {
    if !have_tmux() {
        return;
    }
    let _turn = CPU_BENCH.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    tiny_preset_on_free_port(dir.path());
    let s = Session::new("benchhup", 120, 40);
    open_launch_screen(&s, dir.path());
    s.send(&["l"]);
    s.wait_for("phase ready");
    let shell = tmux(&["display-message", "-p", "-t", &s.name, "#{pane_pid}"]);
    let panel = children(&shell);
    assert_eq!(
        panel.len(),
        1,
        "one mxtune under the pane's shell: {panel:?}"
    );
    let _engine = KillOnDrop(children(&panel[0]));

    // A long bench: small points, many runs.
    s.send(&["4"]);
    s.wait_for("Workload");
    for (row, value) in [(1, "64"), (2, "8"), (5, "100000")] {
        s.send(&["Up"; 6]);
        for _ in 0..row {
            s.send(&["Down"]);
        }
        s.send(&["Enter"]);
        s.send(&["BSpace"; 8]);
        s.send(&[value]);
        s.send(&["Enter"]);
    }
    s.wait_for("100000");
    s.send(&["r"]);
    s.wait_until("measured runs going", |screen| {
        screen.contains("point 1/1  run ") && !screen.contains("run 1/100000")
    });

    // The hang-up a dropped SSH session delivers.
    let status = Command::new("kill")
        .args(["-HUP", &panel[0]])
        .status()
        .expect("kill");
    assert!(status.success());
    s.wait_for_panel_exit();
    s.send(&[
        "stty -a | tr ' ' '\\n' | grep -E '^-?(icanon|echo)$' | tr '\\n' ' '; echo E\"\"ND",
        "Enter",
    ]);
    let screen = s.wait_for("END");
    assert!(!s.alternate_on(), "SIGHUP must leave the alternate screen");
    assert!(
        screen.contains("icanon echo") && !screen.contains("-icanon"),
        "terminal left in raw mode:\n{screen}"
    );
    // The bench's record was saved as aborted before the panel exited.
    let scan = mxtune::record::RunStore::new(dir.path().join("runs"))
        .scan()
        .unwrap();
    let benches: Vec<_> = scan
        .runs
        .iter()
        .filter(|r| r.record.workload.is_some())
        .collect();
    assert_eq!(benches.len(), 1, "one bench record: {:?}", scan.runs);
    let rec = &benches[0].record;
    assert_eq!(
        rec.identity.status,
        mxtune::record::RunStatus::Aborted,
        "{rec:?}"
    );
    let text = std::fs::read_to_string(&benches[0].path).unwrap();
    assert!(
        text.contains("SIGHUP"),
        "the reason names the signal: {text}"
    );
    assert_launched_by_the_panel(&benches[0].path, rec);
}

/// A bench record from the panel against the engine the panel launched names that launch:
/// kind, preset, flag set, launch spec and the launch's run id (whose log is beside it).
fn assert_launched_by_the_panel(path: &std::path::Path, rec: &mxtune::record::RunRecord) {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.contains("-engine-cpu-tiny-") && !name.contains("attach"),
        "{name}"
    );
    assert_eq!(rec.target.kind, mxtune::vocab::TargetKind::Engine);
    assert_eq!(rec.target.preset.as_deref(), Some("engine-cpu-tiny"));
    assert_eq!(rec.target.flags["target"], "engine", "{}", rec.target.flags);
    let launch = rec.target.launch.as_ref().expect("the launch spec");
    assert!(
        launch.argv.iter().any(|a| a == "serve"),
        "{:?}",
        launch.argv
    );
    let run = rec.target.launch_run.as_ref().expect("the launch's run id");
    assert!(
        path.parent()
            .unwrap()
            .join(format!("{run}.target.log"))
            .exists(),
        "the launch's log is beside the record"
    );
}

#[test]
fn tui_tmux_first_bench_on_the_default_preset_passes_correctness() {
    // The first hour from a fresh runs/: launch the default preset (synthetic weights),
    // run the correctness level from the Bench screen, and get a PASS that says which
    // checks were skipped; the record names the launch.
    if !have_tmux() {
        return;
    }
    let _turn = CPU_BENCH.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    tiny_preset_on_free_port(dir.path());
    let s = Session::new("firstbench", 120, 40);
    open_launch_screen(&s, dir.path());
    s.send(&["l"]);
    s.wait_for("phase ready");
    let shell = tmux(&["display-message", "-p", "-t", &s.name, "#{pane_pid}"]);
    let panel = children(&shell);
    let _engine = KillOnDrop(panel.iter().flat_map(|p| children(p)).collect());
    s.send(&["4"]);
    s.wait_for("Workload");
    // The level row is first: → cycles performance → correctness.
    s.send(&["Up"; 6]);
    s.send(&["Right"]);
    s.wait_for("correctness");
    s.send(&["r"]);
    let screen = s.wait_longer(
        "the correctness verdict",
        Duration::from_secs(900),
        |screen| {
            screen.contains("correctness level: PASS") || screen.contains("correctness level: FAIL")
        },
    );
    assert!(
        // (The line wraps at the pane's edge; "synthetic" stays on the first line.)
        screen.contains("correctness level: PASS (skipped non-empty printable text")
            && screen.contains("the target serves synthetic"),
        "{screen}"
    );
    // The verdict shows before the record is final; the status line says when it is.
    s.wait_for("saved run record");
    let scan = mxtune::record::RunStore::new(dir.path().join("runs"))
        .scan()
        .unwrap();
    let bench = scan
        .runs
        .iter()
        .find(|r| r.record.workload.is_some())
        .expect("a bench record");
    assert_eq!(
        bench.record.identity.status,
        mxtune::record::RunStatus::Completed
    );
    assert_launched_by_the_panel(&bench.path, &bench.record);
    s.send(&["2"]);
    s.send(&["x"]);
    s.wait_for("Stop target?");
    s.send(&["y"]);
    s.wait_for("phase exited");
    s.send(&["q"]);
    s.wait_for_panel_exit();
}

/// A two-node cluster launched from the panel, its head on this machine and its worker on the
/// local sshd standing in for a second host: the Live screen shows both hosts' telemetry side
/// by side, the worker's read by `mxtune monitor --json` over SSH. Needs tmux, Docker and sshd
/// (`MXTUNE_TEST_DOCKER=require` / `MXTUNE_TEST_SSHD=require` make their absence a failure).
#[test]
fn tui_tmux_live_shows_both_hosts_of_a_two_node_cluster_side_by_side() {
    let _turn = DOCKER_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    use mxtune::flags::FlagSet;
    use mxtune::vocab::{NetworkMode, TargetKind};
    let test = "tui_tmux_live_shows_both_hosts_of_a_two_node_cluster_side_by_side";
    if !have_tmux() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(d) = rt.block_on(support::docker_or_skip(test)) else {
        return;
    };
    let Some(sshd) = support::sshd::sshd_or_skip(test) else {
        return;
    };
    let image = rt.block_on(support::test_image(&d));
    let dir = tempfile::tempdir().unwrap();
    let mut fs = FlagSet {
        target: TargetKind::DockerCluster,
        ..FlagSet::default()
    };
    fs.container.image = image;
    fs.container.vllm = mxtune::flags::VllmFlavor::Fork;
    fs.container.network = NetworkMode::Host;
    fs.container.gpus_all = false;
    fs.container.ulimits.clear();
    for cache in ["hf", "jit"] {
        std::fs::create_dir_all(dir.path().join(cache)).unwrap();
    }
    fs.container.hf_cache = Some(dir.path().join("hf").display().to_string());
    fs.container.jit_cache = Some(dir.path().join("jit").display().to_string());
    fs.serving.port = support::free_port();
    fs.serving.host = Some("127.0.0.1".into());
    fs.serving.served_model_name = Some("tp2".into());
    fs.cluster.head = "local".into();
    fs.cluster.worker = "remote".into();
    fs.cluster.local_ip = Some("127.0.0.1".into());
    fs.cluster.ray_port = support::free_port();
    let presets = dir.path().join("presets");
    std::fs::create_dir_all(&presets).unwrap();
    let mut text = String::from("description = \"two nodes\"\n");
    text.push_str(&toml::to_string(&fs).unwrap());
    std::fs::write(presets.join("tp2.toml"), text).unwrap();
    // The worker's host is the sshd, reaching this machine: its mxtune is this build.
    let home = sshd.config_home(&format!(
        "{}[host.nccl]\nhost_ip = \"127.0.0.1\"\n",
        sshd.host_entry("remote", env!("CARGO_BIN_EXE_mxtune"))
    ));
    let s = Session::new("twohosts", 120, 44);
    s.send(&[
        &format!(
            "cd {d} && MXTUNE_RUNS_DIR={d}/runs MXTUNE_PRESETS_DIR={d}/presets XDG_CONFIG_HOME={h} {bin} --preset tp2",
            d = dir.path().display(),
            h = home.display(),
            bin = env!("CARGO_BIN_EXE_mxtune")
        ),
        "Enter",
    ]);
    s.wait_for("preset tp2");
    s.send(&["2"]);
    // The Launch screen's own key line: the status bar's "target docker-cluster" shows on the
    // Flags screen too, before the "2" has been drawn.
    s.wait_for("l launch the cluster");
    s.send(&["l"]);
    let screen = s.wait_longer("phase ready", Duration::from_secs(180), |screen| {
        screen.contains("phase ready") || screen.contains("phase failed")
    });
    assert!(screen.contains("phase ready"), "{screen}");
    // Whatever happens next, the run's containers go.
    let run_id = std::fs::read_dir(dir.path().join("runs"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".target.log").map(str::to_string)
        })
        .next()
        .expect("the launch's log file names its run id");
    let _cleanup = support::Cleanup(run_id.clone());
    s.send(&["3"]);
    // Both panels have readings: each shows its host's CPU and RAM line.
    let screen = s.wait_until("both hosts' readings", |screen| {
        screen.matches("host cpu").count() == 2 || screen.contains("failed:")
    });
    assert!(!screen.contains("failed:"), "{screen}");
    // Side by side: both titles on one row, this machine's first.
    let titles = screen
        .lines()
        .find(|l| {
            l.contains("host local (Ray head, API)") && l.contains("host remote (Ray worker)")
        })
        .unwrap_or_else(|| panic!("no row has both hosts' panels:\n{screen}"));
    assert!(
        titles.find("host local") < titles.find("host remote"),
        "{titles}"
    );
    assert!(
        screen.contains("charts of host local (Ray head, API)"),
        "{screen}"
    );
    // Each panel shows its own GPU reading: a GPU, or why NVML gave none.
    assert_eq!(
        screen.matches("GPU: ").count() + screen.matches("headroom").count(),
        2,
        "{screen}"
    );
    // `h` shows the worker's own charts (its host chart from its own samples, no server
    // charts), and `h` again the head's.
    assert!(screen.contains("h charts of the next host"), "{screen}");
    s.send(&["h"]);
    let screen = s.wait_for("charts of host remote (Ray worker)");
    assert!(!screen.contains("tok/s gen"), "{screen}");
    // Both panels' host lines, and the worker's host chart on the first page.
    assert_eq!(screen.matches("host cpu").count(), 3, "{screen}");
    s.send(&["h"]);
    s.wait_for("charts of host local (Ray head, API)");
    s.send(&["2"]);
    s.wait_for("phase ready");
    s.send(&["x"]);
    s.wait_for("Stop target?");
    s.send(&["y"]);
    s.wait_longer("phase exited", Duration::from_secs(120), |screen| {
        screen.contains("phase exited")
    });
    s.send(&["3"]);
    // The target is gone: back to this machine alone.
    s.wait_gone("host remote (Ray worker)");
    s.send(&["q"]);
    s.wait_for_panel_exit();
    assert!(!s.alternate_on(), "quit must leave the alternate screen");
    let left: Vec<_> = rt
        .block_on(mxtune::launch::docker::find_mxtune_containers(&d))
        .unwrap()
        .into_iter()
        .filter(|f| f.run_id == run_id)
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A cluster launched from the panel and left running when it quits (`q`, then `l`) is
/// followed again by the next panel's `r` (offered because the preset is a docker-cluster
/// one): ready, its run id in the log's `re-attaching to run …` line, and the stop removes
/// both nodes.
#[test]
fn tui_tmux_reattaches_to_a_cluster_left_running_by_an_earlier_panel() {
    let _turn = DOCKER_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    use mxtune::flags::FlagSet;
    use mxtune::vocab::{NetworkMode, TargetKind};
    let test = "tui_tmux_reattaches_to_a_cluster_left_running_by_an_earlier_panel";
    if !have_tmux() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(d) = rt.block_on(support::docker_or_skip(test)) else {
        return;
    };
    let image = rt.block_on(support::test_image(&d));
    let dir = tempfile::tempdir().unwrap();
    let mut fs = FlagSet {
        target: TargetKind::DockerCluster,
        ..FlagSet::default()
    };
    fs.container.image = image;
    fs.container.vllm = mxtune::flags::VllmFlavor::Fork;
    fs.container.network = NetworkMode::Host;
    fs.container.gpus_all = false;
    fs.container.ulimits.clear();
    for cache in ["hf", "jit"] {
        std::fs::create_dir_all(dir.path().join(cache)).unwrap();
    }
    fs.container.hf_cache = Some(dir.path().join("hf").display().to_string());
    fs.container.jit_cache = Some(dir.path().join("jit").display().to_string());
    fs.serving.port = support::free_port();
    fs.serving.host = Some("127.0.0.1".into());
    fs.serving.served_model_name = Some("tp2".into());
    fs.cluster.head = "local".into();
    fs.cluster.worker = "local".into();
    fs.cluster.ray_port = support::free_port();
    let presets = dir.path().join("presets");
    std::fs::create_dir_all(&presets).unwrap();
    let mut text = String::from("description = \"two nodes here\"\n");
    text.push_str(&toml::to_string(&fs).unwrap());
    std::fs::write(presets.join("tp2.toml"), text).unwrap();
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    let open = |s: &Session| {
        s.send(&[
            &format!(
                "cd {d} && MXTUNE_RUNS_DIR={d}/runs MXTUNE_PRESETS_DIR={d}/presets XDG_CONFIG_HOME={d}/config {bin} --preset tp2",
                d = dir.path().display(),
                bin = env!("CARGO_BIN_EXE_mxtune")
            ),
            "Enter",
        ]);
        s.wait_for("preset tp2");
        s.send(&["2"]);
        // The Launch screen's own key line (the status bar shows on the Flags screen too).
        s.wait_for("l launch the cluster");
    };
    let s = Session::new("reattach", 120, 40);
    open(&s);
    assert!(
        s.screen().contains("r re-attach to its running cluster"),
        "{}",
        s.screen()
    );
    s.send(&["l"]);
    let screen = s.wait_longer("phase ready", Duration::from_secs(180), |screen| {
        screen.contains("phase ready") || screen.contains("phase failed")
    });
    assert!(screen.contains("phase ready"), "{screen}");
    let run_id = std::fs::read_dir(dir.path().join("runs"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".target.log").map(str::to_string)
        })
        .next()
        .expect("the launch's log file names its run id");
    let _cleanup = support::Cleanup(run_id.clone());
    // Quit, leaving the cluster running.
    s.send(&["q"]);
    s.wait_for("leave it running");
    s.send(&["l"]);
    s.wait_for_panel_exit();
    let running = |rt: &tokio::runtime::Runtime| {
        rt.block_on(mxtune::launch::docker::find_mxtune_containers(&d))
            .unwrap()
            .into_iter()
            .filter(|f| f.run_id == run_id && f.state == "running")
            .count()
    };
    assert_eq!(
        running(&rt),
        2,
        "both nodes keep running after the panel quit"
    );

    // The next panel follows it again.
    s.send(&["clear", "Enter"]);
    open(&s);
    s.send(&["r"]);
    let screen = s.wait_longer("phase ready again", Duration::from_secs(120), |screen| {
        screen.contains("phase ready") || screen.contains("phase failed")
    });
    assert!(screen.contains("phase ready"), "{screen}");
    assert!(
        screen.contains(&format!("mxtune-{run_id}-head")),
        "{screen}"
    );
    // The log's first line says what was re-attached to.
    s.send(&["Home"]);
    s.wait_for(&format!("re-attaching to run {run_id}"));
    s.send(&["End", "x"]);
    s.wait_for("Stop target?");
    s.send(&["y"]);
    s.wait_longer("phase exited", Duration::from_secs(120), |screen| {
        screen.contains("phase exited")
    });
    s.send(&["q"]);
    s.wait_for_panel_exit();
    assert_eq!(running(&rt), 0);
    let left: Vec<_> = rt
        .block_on(mxtune::launch::docker::find_mxtune_containers(&d))
        .unwrap()
        .into_iter()
        .filter(|f| f.run_id == run_id)
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
