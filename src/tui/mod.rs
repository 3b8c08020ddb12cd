//! The interactive control panel (ratatui + crossterm). A thin face on the core modules:
//! every action here is also available headless. The event loop is generic over the ratatui
//! `Backend`, so screens are tested with `TestBackend`; background work (terminal input,
//! signals, monitor samples, launch and bench progress) arrives as `Event`s on one channel,
//! and the screen is redrawn only when something changed.

pub mod app;
pub mod background;
pub mod keys;
pub mod remember;
pub mod screens;
pub mod theme;
pub mod ui;

use std::io::{self, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use anyhow::Context;
use crossterm::event::{DisableMouseCapture, EnableMouseCapture};
use crossterm::execute;
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use ratatui::Terminal;
use ratatui::backend::{Backend, CrosstermBackend};

use app::{App, Effect, Paths};
use background::Background;
use screens::launch::TargetState;
use theme::Theme;

/// How the panel starts.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// ASCII-only glyphs.
    pub ascii: bool,
    /// No colours (also when `NO_COLOR` is set).
    pub no_color: bool,
    /// Capture the mouse (off by default: it breaks copy/paste over SSH).
    pub mouse: bool,
    /// Start on this preset (`--preset`), instead of the one remembered from last time.
    pub preset: Option<String>,
}

/// Everything that can wake the event loop.
#[derive(Debug)]
pub enum Event {
    /// Terminal input: keys, resize, mouse.
    Term(crossterm::event::Event),
    /// A signal arrived (SIGTERM, SIGHUP, SIGINT).
    Signal(i32),
    /// The clock: once a second on a fixed schedule while a running time is shown.
    Tick,
    /// Progress of the target launched from the Launch screen.
    Launch(background::LaunchMsg),
    /// A monitor sample (GPU, host, server metrics).
    Sample(Box<crate::monitor::Sample>),
    /// The monitor could not start.
    MonitorError(String),
    /// A sample of the `host`th host of a target that spans several.
    HostSample {
        /// Index into the hosts being watched.
        host: usize,
        /// The sample.
        sample: Box<crate::monitor::Sample>,
    },
    /// The monitor of the `host`th host of a target that spans several failed or ended.
    HostMonitorError {
        /// Index into the hosts being watched.
        host: usize,
        /// What went wrong and what to do.
        error: String,
    },
    /// Progress or the end of the benchmark started from the Bench screen.
    Bench(background::BenchMsg),
    /// Progress or the end of the matrix or A/B started from the Bench screen.
    Matrix(background::MatrixMsg),
}

/// Why the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The operator quit.
    Quit,
    /// A signal ended the panel (the terminal may be gone, e.g. SIGHUP from a dropped SSH session).
    Signal(i32),
}

/// Restores the terminal when dropped, on every exit path that unwinds.
struct TerminalGuard {
    mouse: bool,
}

impl TerminalGuard {
    fn enter(mouse: bool) -> anyhow::Result<Self> {
        enable_raw_mode()
            .context("cannot switch the terminal to raw mode (is stdin a terminal?)")?;
        let guard = TerminalGuard { mouse };
        execute!(io::stdout(), EnterAlternateScreen)
            .context("cannot enter the alternate screen")?;
        if mouse {
            execute!(io::stdout(), EnableMouseCapture).context("cannot enable mouse capture")?;
        }
        Ok(guard)
    }
}

/// Put the terminal back the way we found it. Errors are ignored: after SIGHUP there may be
/// no terminal left to write to.
fn restore_terminal(mouse: bool) {
    if mouse {
        let _ = execute!(io::stdout(), DisableMouseCapture);
    }
    let _ = execute!(io::stdout(), LeaveAlternateScreen, crossterm::cursor::Show);
    let _ = disable_raw_mode();
    let _ = io::stdout().flush();
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal(self.mouse);
    }
}

/// Open the panel in this terminal and run until the operator quits or a signal ends it.
pub fn run(opts: Options) -> anyhow::Result<Exit> {
    let (tx, rx) = mpsc::channel();
    spawn_signal_thread(tx.clone())?;
    let guard = TerminalGuard::enter(opts.mouse)?;
    let mouse = opts.mouse;
    let previous_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore_terminal(mouse);
        previous_hook(info);
    }));
    spawn_input_thread(tx.clone());
    let mut bg = Background::new(tx.clone())?;
    bg.watch(None);

    let mut terminal =
        Terminal::new(CrosstermBackend::new(io::stdout())).context("cannot set up the terminal")?;
    let mut app = App::new(
        Theme::from_env(opts.ascii, opts.no_color),
        Paths::from_env(),
    );
    app.remember = remember::file();
    let remembered = app.remember.as_deref().and_then(remember::last_preset);
    let (start, note) = remember::start_preset(opts.preset.as_deref(), remembered, |n| {
        app.paths.presets.find(n).is_some()
    });
    app.start_preset = start;
    app.message = note;
    // Hosts a Docker target can run on; a broken file is said in the status line and the
    // panel goes on with this machine only.
    match crate::hosts::Hosts::load_user() {
        Ok(Some(h)) => app.launch.hosts = h.hosts,
        Ok(None) => {}
        Err(e) => {
            let said = format!("hosts file not used: {e}");
            app.message = Some(match app.message.take() {
                Some(n) => format!("{n}; {said}"),
                None => said,
            });
        }
    }
    for effect in app.startup_effects() {
        perform(&mut app, &mut bg, effect);
    }
    let exit = event_loop(&mut terminal, &mut app, &mut bg, &rx);
    drop(guard);
    exit
}

fn spawn_input_thread(tx: Sender<Event>) {
    std::thread::Builder::new()
        .name("tui-input".into())
        .spawn(move || {
            // Blocks in read(); ends when the terminal goes away or the loop hangs up.
            while let Ok(ev) = crossterm::event::read() {
                if tx.send(Event::Term(ev)).is_err() {
                    break;
                }
            }
        })
        .ok();
}

fn spawn_signal_thread(tx: Sender<Event>) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGHUP, SIGINT])
        .context("cannot install signal handlers")?;
    std::thread::Builder::new()
        .name("tui-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if tx.send(Event::Signal(sig)).is_err() {
                    break;
                }
            }
        })
        .context("cannot start the signal thread")?;
    Ok(())
}

/// The panel's clock. Ticks fall on a fixed schedule from the moment a clock is wanted,
/// whatever else arrives: waiting for a quiet channel instead would starve them, since the
/// monitor alone sends a sample every second.
#[derive(Debug, Default)]
struct Ticker {
    /// When the next tick is due; `None` while nothing wants one.
    next: Option<Instant>,
}

impl Ticker {
    /// When the next tick is due, ticking every `every` from now on if it was stopped.
    fn due(&mut self, every: Duration, now: Instant) -> Instant {
        *self.next.get_or_insert(now + every)
    }

    /// The tick due at `at` is being delivered: the next one is a period later. After a
    /// stall of more than a period the missed ticks are dropped rather than delivered in a
    /// burst (one tick brings every clock up to date).
    fn ticked(&mut self, at: Instant, every: Duration, now: Instant) {
        let next = at + every;
        self.next = Some(if next > now { next } else { now + every });
    }

    /// Nothing wants a clock; the next start begins a new schedule.
    fn stop(&mut self) {
        self.next = None;
    }
}

/// The next thing for the loop: the tick if it is due, else the next event, waiting at most
/// until the tick is due. `None` when every sender is gone.
fn next_event(rx: &Receiver<Event>, ticker: &mut Ticker, every: Option<Duration>) -> Option<Event> {
    let Some(every) = every else {
        ticker.stop();
        return rx.recv().ok();
    };
    loop {
        let now = Instant::now();
        let at = ticker.due(every, now);
        if at <= now {
            ticker.ticked(at, every, now);
            return Some(Event::Tick);
        }
        match rx.recv_timeout(at - now) {
            Ok(ev) => return Some(ev),
            // The tick is due now; the next round delivers it.
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// The loop: wait for an event, update state, redraw if anything changed. While no clock
/// runs it blocks without a timeout, so an idle panel uses no CPU.
pub fn event_loop<B: Backend>(
    terminal: &mut Terminal<B>,
    app: &mut App,
    bg: &mut Background,
    rx: &Receiver<Event>,
) -> anyhow::Result<Exit>
where
    B::Error: Send + Sync + 'static,
{
    terminal
        .draw(|f| ui::draw(f, app))
        .context("cannot draw the panel")?;
    let mut ticker = Ticker::default();
    loop {
        let Some(event) = next_event(rx, &mut ticker, app.tick_interval()) else {
            return Ok(Exit::Quit);
        };
        let (exit, redraw) = step(app, bg, event);
        if let Some(exit) = exit {
            return Ok(exit);
        }
        if redraw {
            terminal
                .draw(|f| ui::draw(f, app))
                .context("cannot draw the panel")?;
        }
    }
}

/// Apply one event to the panel and perform the effects it asks for. Returns whether the
/// panel ends, and whether the screen needs a redraw.
pub fn step(app: &mut App, bg: &mut Background, event: Event) -> (Option<Exit>, bool) {
    let (effects, redraw) = match event {
        Event::Term(crossterm::event::Event::Key(key)) => (app.on_key(key), true),
        Event::Term(crossterm::event::Event::Resize(..)) => (Vec::new(), true),
        // Mouse events only arrive with `--mouse`: the wheel scrolls like Up/Down, a click
        // on a tab title switches to it.
        Event::Term(crossterm::event::Event::Mouse(m)) => {
            use crossterm::event::{KeyEvent, KeyModifiers, MouseButton, MouseEventKind};
            let wheel = |code| KeyEvent::new(code, KeyModifiers::NONE);
            match m.kind {
                MouseEventKind::ScrollUp => {
                    (app.on_key(wheel(crossterm::event::KeyCode::Up)), true)
                }
                MouseEventKind::ScrollDown => {
                    (app.on_key(wheel(crossterm::event::KeyCode::Down)), true)
                }
                MouseEventKind::Down(MouseButton::Left) if m.row == 0 => {
                    match ui::tab_at(m.column) {
                        Some(t) if !app.show_help && app.quit_prompt.is_none() => {
                            app.tab = t;
                            (Vec::new(), true)
                        }
                        _ => (Vec::new(), false),
                    }
                }
                _ => (Vec::new(), false),
            }
        }
        Event::Term(_) => (Vec::new(), false),
        Event::Signal(sig) => {
            app.on_signal(sig);
            // A running bench's record is saved as `aborted` before the terminal goes back.
            bg.abort_bench_and_wait(&format!("the panel got {}", signal_name(sig)));
            // A matrix stops its target and stays resumable; an A/B saves its records.
            bg.abort_matrix_and_wait(&format!("the panel got {}", signal_name(sig)));
            // The target keeps running: a dropped SSH session is no reason to stop a server.
            bg.detach();
            return (Some(Exit::Signal(sig)), false);
        }
        Event::Tick => {
            app.on_tick();
            (Vec::new(), app.shows_clock())
        }
        Event::Launch(msg) => {
            // Whether the monitor watches the target: from its readiness until it has ended.
            // A stop asked from the panel turns Ready into Stopping without an event, so the
            // watch ends when the target's end arrives, not when readiness goes.
            let was_watched = app.live.target_watched;
            app.launch.on_msg(msg);
            let live = matches!(
                app.launch.state,
                TargetState::Ready { .. } | TargetState::Stopping
            );
            app.live.target_watched =
                live && (was_watched || matches!(app.launch.state, TargetState::Ready { .. }));
            // Watch the server's /metrics while it is up.
            match (&app.launch.state, was_watched) {
                // On several hosts, each host's own monitor, one panel each.
                (TargetState::Ready { .. }, false) if app.launch.target_hosts.len() > 1 => {
                    let hosts = &app.launch.target_hosts;
                    app.live.set_hosts(
                        hosts
                            .iter()
                            .map(|w| {
                                screens::live::HostPanel::new(
                                    &w.name,
                                    &w.role,
                                    w.metrics_url.is_some(),
                                )
                            })
                            .collect(),
                    );
                    bg.watch_hosts(hosts);
                }
                // On another host, that host's own monitor (its GPU, its view of /metrics).
                (TargetState::Ready { .. }, false) if app.launch.on_host.is_some() => {
                    if let Some(o) = &app.launch.on_host {
                        app.live.set_host(Some(o.host.name.clone()));
                        bg.watch_host(&o.host, format!("http://127.0.0.1:{}", o.port));
                    }
                }
                (TargetState::Ready { url, .. }, false) => bg.watch(Some(url.clone())),
                (TargetState::Ready { .. } | TargetState::Stopping, true) => {}
                (_, true) => {
                    app.live.set_host(None);
                    if !app.live.hosts.is_empty() {
                        app.live.set_hosts(Vec::new());
                    }
                    bg.watch(None)
                }
                _ => {}
            }
            (Vec::new(), true)
        }
        Event::Sample(s) => {
            app.live.push(*s);
            (
                Vec::new(),
                app.tab == app::Tab::Live && app.live.is_moving(),
            )
        }
        Event::MonitorError(e) => {
            app.live.error = Some(e);
            (Vec::new(), app.tab == app::Tab::Live)
        }
        Event::HostSample { host, sample } => {
            app.live.push_host(host, *sample);
            (
                Vec::new(),
                app.tab == app::Tab::Live && app.live.is_moving(),
            )
        }
        Event::HostMonitorError { host, error } => {
            app.live.host_error(host, error);
            (Vec::new(), app.tab == app::Tab::Live)
        }
        Event::Bench(msg) => {
            // The end shows in the status line (record saved) on every screen.
            let visible =
                matches!(app.tab, app::Tab::Bench) || matches!(msg, background::BenchMsg::Done(_));
            (app.on_bench(msg), visible)
        }
        Event::Matrix(msg) => {
            let visible = matches!(app.tab, app::Tab::Bench)
                || !matches!(msg, background::MatrixMsg::Progress(_));
            (app.on_matrix(msg), visible)
        }
    };
    for effect in effects {
        if let Some(exit) = perform(app, bg, effect) {
            return (Some(exit), false);
        }
    }
    (None, redraw)
}

fn signal_name(sig: i32) -> String {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    match sig {
        SIGHUP => "SIGHUP".into(),
        SIGTERM => "SIGTERM".into(),
        SIGINT => "SIGINT".into(),
        n => format!("signal {n}"),
    }
}

/// Perform one effect: the only place the panel touches files. Results go back into the
/// app's state; errors become a status-line message naming the file.
pub fn perform(app: &mut App, bg: &mut Background, effect: Effect) -> Option<Exit> {
    match effect {
        Effect::Quit { stop_target } => {
            app.on_quit(stop_target);
            bg.abort_bench_and_wait("the panel was closed");
            bg.abort_matrix_and_wait("the panel was closed");
            if stop_target {
                bg.stop_and_wait();
            } else {
                bg.detach();
            }
            return Some(Exit::Quit);
        }
        e @ (Effect::StartTarget | Effect::ReattachTarget) => {
            let reattach = e == Effect::ReattachTarget;
            let kind = app.launch.choice;
            let preset = app.flags.loaded.as_ref().map(|p| p.name.clone());
            // What a bench against this launch records; an attached server was not started
            // from these flags, so it carries none.
            let launched = kind != crate::vocab::TargetKind::Attach;
            app.launch.served = Some(crate::bench::cli::ServedBy {
                url: String::new(),
                kind,
                preset: preset.clone().filter(|_| launched),
                flags: if launched {
                    serde_json::to_value(&app.flags.flags).unwrap_or_default()
                } else {
                    serde_json::Value::Null
                },
                launch: None,
                launch_run: None,
            });
            bg.start(background::StartRequest {
                kind,
                url: app.launch.url.clone(),
                flags: app.flags.flags.clone(),
                preset: preset.unwrap_or_default(),
                runs_dir: app.paths.runs_dir.clone(),
                startup_limit: app.launch.startup_limit,
                attach_limit: app.launch.attach_limit,
                host: if kind == crate::vocab::TargetKind::Docker {
                    app.launch.chosen_host().cloned()
                } else {
                    None
                },
                reattach,
            })
        }
        Effect::StopTarget => bg.stop(),
        Effect::StartBench(mut args) => {
            // The record names the launch that serves the URL (preset, flags, kind), not
            // `attach`, when this panel started it.
            if let (Some(mut served), Some(url)) = (app.launch.served.clone(), app.target_url()) {
                served.url = url;
                args.served_by = Some(Box::new(served));
            }
            bg.bench(*args)
        }
        Effect::CancelBench => bg.cancel_bench("cancelled from the panel (Esc)"),
        Effect::ListMatrixPresets => match app.paths.presets.list() {
            Ok(list) => app
                .bench
                .matrix
                .on_preset_list(list.into_iter().map(|e| e.name).collect()),
            Err(e) => app.bench.matrix.error = Some(format!("cannot list presets: {e}")),
        },
        Effect::StartMatrix(args) => {
            let mut args = *args;
            args.out = fresh_dir(&app.paths.runs_dir.join("matrix"));
            app.bench.matrix.on_started(&args);
            bg.matrix(args);
        }
        Effect::StartAb(req) => match ab_args(app, &req) {
            Ok(args) => {
                app.bench.ab.on_started(&args);
                bg.ab(args);
            }
            Err(e) => app.bench.ab.on_could_not_start(e),
        },
        Effect::CancelMatrix => bg.cancel_matrix("cancelled from the panel (Esc)"),
        Effect::SaveLog(path) => {
            let text = app.launch.log.lines.iter().fold(String::new(), |mut s, l| {
                s.push_str(l);
                s.push('\n');
                s
            });
            app.message = Some(export_message(&path, text.as_bytes()));
        }
        Effect::SaveCommand => {
            let preset = app
                .flags
                .loaded
                .as_ref()
                .map(|p| p.name.clone())
                .unwrap_or_default();
            let path = screens::flags::command_file(&app.paths.export_dir, &preset);
            let mut text = screens::flags::command_lines(&app.flags.flags).join("\n");
            text.push('\n');
            app.message = Some(export_message(&path, text.as_bytes()));
        }
        Effect::ListPresets => match app.paths.presets.list() {
            Ok(list) => app
                .flags
                .on_preset_list(list.into_iter().map(|e| e.name).collect()),
            Err(e) => app.message = Some(format!("cannot list presets: {e}")),
        },
        Effect::LoadPreset(name) => match app.paths.presets.load(&name) {
            Ok(p) => {
                // The next session starts here too.
                if let Some(f) = &app.remember
                    && let Err(e) = remember::save_preset(f, &p.name)
                {
                    app.message = Some(format!("cannot remember the preset: {e:#}"));
                }
                app.flags.on_preset_loaded(p);
                if !app.launch.state.is_live() {
                    app.launch.choice = app.flags.flags.target;
                }
            }
            Err(e) => {
                app.message = Some(format!("cannot load preset {name}"));
                app.flags.on_preset_error(e.to_string());
            }
        },
        Effect::SavePreset { name, overwrite } => {
            let dir = app.paths.save_dir.clone();
            let path = dir.join(format!("{name}.toml"));
            let exists = path.exists();
            if !overwrite {
                // Replacing a file, or hiding a preset of the same name elsewhere (a bundled
                // one, say), takes a `y` first.
                let question = if exists {
                    Some(format!("`{name}` exists. Overwrite it? y/n"))
                } else {
                    app.paths.presets.find(&name).map(|other| {
                        format!("`{name}` is also {other}; the new one hides it. Save? y/n")
                    })
                };
                if let Some(q) = question {
                    app.flags.on_saved(Err(q), true);
                    return None;
                }
            }
            let extends = app.flags.loaded.as_ref().map(|p| p.name.clone());
            // A preset extending itself would be a loop: store it whole instead.
            let extends = extends.filter(|e| *e != name);
            let description = match &extends {
                Some(p) => format!("saved from the panel, based on {p}"),
                None => "saved from the panel".to_string(),
            };
            let req = crate::flags::preset::SaveRequest {
                name: &name,
                description: &description,
                extends: extends.as_deref(),
                flags: &app.flags.flags,
                overwrite,
            };
            let saved = app
                .paths
                .presets
                .save(&dir, &req)
                .and_then(|p| app.paths.presets.load_file(&p).map_err(anyhow::Error::new));
            match saved {
                Ok(p) => {
                    app.message = Some(format!("saved {}", p.origin));
                    app.flags.on_saved(Ok(p), false);
                }
                Err(e) => app.flags.on_saved(Err(format!("{e:#}")), false),
            }
        }
        Effect::ReloadRuns => {
            let store = crate::record::RunStore::new(&app.paths.runs_dir);
            app.runs.on_scan(store.scan().map_err(|e| format!("{e:#}")));
        }
        Effect::ExportComparison(path) => {
            let Some(md) = app
                .runs
                .comparison(crate::record::compare::Format::Md, app.noise_sigmas)
            else {
                app.message = Some("mark two runs (m) to export a comparison".into());
                return None;
            };
            app.message = Some(export_message(&path, md.as_bytes()));
        }
    }
    None
}

/// Writes an export under `path`, or a new numbered name when that file exists (an earlier
/// export, or one edited since), and says in the status line which file it was.
fn export_message(path: &std::path::Path, bytes: &[u8]) -> String {
    match crate::record::export::write_fresh(path, bytes) {
        Ok(written) if written == path => format!("wrote {}", written.display()),
        Ok(written) => format!(
            "wrote {} ({} exists, kept)",
            written.display(),
            path.display()
        ),
        Err(e) => format!("{e:#}"),
    }
}

/// A new directory name under `parent` (not created): the UTC time, made unique.
fn fresh_dir(parent: &std::path::Path) -> std::path::PathBuf {
    let stamp = chrono::Utc::now().format("%Y%m%d-%H%M%S").to_string();
    let mut path = parent.join(&stamp);
    let mut n = 1;
    while path.exists() {
        n += 1;
        path = parent.join(format!("{stamp}-{n}"));
    }
    path
}

/// Writes A's and B's flags as presets in a new directory under the runs dir's `ab/` and
/// returns the `mxtune ab` options that compare them; the results go to the same directory.
fn ab_args(
    app: &App,
    req: &screens::matrix::AbRequest,
) -> Result<crate::matrix::cli::AbArgs, String> {
    let dir = fresh_dir(&app.paths.runs_dir.join("ab"));
    let presets = dir.join("presets");
    std::fs::create_dir_all(&presets)
        .map_err(|e| format!("cannot create {}: {e}", presets.display()))?;
    let store = crate::flags::preset::PresetStore::new(vec![presets.clone()]);
    let mut paths = Vec::new();
    for (name, flags, label) in [
        ("quick-ab-a", &req.a, &req.a_label),
        ("quick-ab-b", &req.b, &req.b_label),
    ] {
        let description = format!("quick A/B from the panel: {label}");
        let save = crate::flags::preset::SaveRequest {
            name,
            description: &description,
            extends: None,
            flags,
            overwrite: false,
        };
        paths.push(
            store
                .save(&presets, &save)
                .map_err(|e| format!("cannot write preset {name}: {e:#}"))?,
        );
    }
    let mut common = screens::matrix::common_args(app, req.kind)?;
    common.grid = req.grid.clone();
    common.engine_bin = req.engine_bin.clone();
    Ok(crate::matrix::cli::AbArgs {
        preset_a: paths[0].display().to_string(),
        preset_b: paths[1].display().to_string(),
        rounds: req.rounds,
        noise: req.noise,
        reuse: false,
        out: dir,
        common,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_keep_their_schedule_and_drop_what_a_stall_missed() {
        let every = Duration::from_secs(1);
        let t0 = Instant::now();
        let mut t = Ticker::default();
        assert_eq!(t.due(every, t0), t0 + every);
        // Delivered a little late: the next one stays on the schedule.
        t.ticked(t0 + every, every, t0 + Duration::from_millis(1300));
        assert_eq!(t.due(every, t0), t0 + 2 * every);
        // After a stall of several periods: one tick now, the next a period later.
        let late = t0 + Duration::from_millis(5500);
        t.ticked(t0 + 2 * every, every, late);
        assert_eq!(t.due(every, late), late + every);
        // Stopped and started again: a new schedule from then.
        t.stop();
        let again = late + Duration::from_secs(30);
        assert_eq!(t.due(every, again), again + every);
    }
}
