//! Key bindings as data: the help overlay and the hint bar are generated from these tables,
//! so what the panel says and what it does cannot drift apart.

/// One binding: the key as shown to the operator and what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    /// The key as printed, e.g. `Enter`, `p`, `PgUp`.
    pub key: &'static str,
    /// What it does, a few words.
    pub action: &'static str,
}

const fn b(key: &'static str, action: &'static str) -> Binding {
    Binding { key, action }
}

/// Bindings that work on every screen.
pub const GLOBAL: &[Binding] = &[
    b("1-5", "switch screen"),
    b("Tab/S-Tab", "next/prev screen"),
    b("?", "help"),
    b("q", "quit"),
];

/// Flags screen.
pub const FLAGS: &[Binding] = &[
    b("Enter", "next/type number"),
    b("Left/Right", "prev/next"),
    b("Up/Down", "select"),
    b("r", "reset to default"),
    b("p", "load preset"),
    b("s", "save preset"),
    b("d", "diff"),
    b("c", "command"),
    b("t", "docker/engine target"),
    b("R", "reset all to the loaded preset"),
    b("Space", "next value"),
    b("a", "mark these flags as A (quick A/B)"),
];

/// Flags screen while a serving limit is typed in (Enter on a numeric limit).
pub const FLAGS_EDIT: &[Binding] = &[
    b("Enter", "set (empty: target default)"),
    b("Esc", "cancel"),
    b("0-9 .", "type"),
    b("Backspace", "delete"),
];

/// Flags screen while a dialog (picker, save, diff, command) is open.
pub const FLAGS_DIALOG: &[Binding] = &[
    b("Esc", "close"),
    b("Enter", "confirm"),
    b("Up/Down", "move / scroll"),
    b("PgUp/PgDn", "page"),
    b("y/n", "overwrite or not"),
    b("S", "save the command to a file"),
];

/// A Launch-screen key table: `first`, then the log-view keys every variant shares.
macro_rules! launch_keys {
    ($($first:expr),* $(,)?) => {
        &[
            $($first,)*
            b("/", "search log"),
            b("n/N", "older/newer match"),
            b("w", "wrap"),
            b("S", "save log"),
            b("Up/Down", "scroll log"),
            b("PgUp/PgDn", "page log"),
            b("Home/End", "top / follow"),
        ]
    };
}

/// Launch screen.
pub const LAUNCH: &[Binding] = launch_keys![
    b("l", "launch"),
    b("x", "stop (asks)"),
    b("t", "target engine/docker/attach"),
    b("u", "attach URL"),
];

/// Launch screen when ~/.config/mxtune/hosts.toml names hosts: `h` picks where a Docker
/// target runs.
pub const LAUNCH_HOSTS: &[Binding] = launch_keys![
    b("l", "launch"),
    b("x", "stop (asks)"),
    b("t", "target engine/docker/attach"),
    b("h", "docker host: this machine / hosts.toml"),
    b("u", "attach URL"),
];

/// Launch screen with a docker-cluster preset loaded: `r` follows its running cluster again.
pub const LAUNCH_CLUSTER: &[Binding] = launch_keys![
    b("l", "launch the cluster"),
    b("r", "re-attach to its running cluster"),
    b("x", "stop (asks)"),
    b("t", "target engine/docker/attach"),
];

/// The title of [`LAUNCH_CLUSTER`]'s section: the help overlay shows it only while a
/// docker-cluster preset is the Launch screen's target.
pub const CLUSTER_SECTION: &str = "Launch: a docker-cluster preset";

/// The title of [`LAUNCH_HOSTS`]'s section: the help overlay shows it only when there are hosts.
pub const HOSTS_SECTION: &str = "Launch: with a hosts file";

/// Launch screen while typing a URL or a search, or answering the stop question.
pub const LAUNCH_INPUT: &[Binding] = &[
    b("Enter", "done / yes"),
    b("Esc", "cancel"),
    b("y", "yes, stop it"),
];

/// Live screen.
pub const LIVE: &[Binding] = &[
    b("+/-", "window"),
    b("PgUp/PgDn", "more charts"),
    b("f", "freeze, keep collecting"),
];

/// Live screen while the running target spans several hosts: `h` picks whose charts show.
pub const LIVE_HOSTS: &[Binding] = &[
    b("+/-", "window"),
    b("h", "charts of the next host"),
    b("PgUp/PgDn", "more charts"),
    b("f", "freeze, keep collecting"),
];

/// The title of [`LIVE_HOSTS`]'s section: the help overlay shows it only when the running
/// target spans several hosts.
pub const LIVE_HOSTS_SECTION: &str = "Live: a target on several hosts";

/// Bench screen.
pub const BENCH: &[Binding] = &[
    b("r", "run against the target"),
    b("m", "matrix"),
    b("a", "mark flags as A"),
    b("A", "A/B vs A"),
    b("Up/Down", "select field"),
    b("Enter", "edit field / next level"),
    b("Left/Right", "previous/next level"),
];

/// Bench screen with no target ready: `r` has nothing to run against.
pub const BENCH_NO_TARGET: &[Binding] = &[
    b("2", "no target: launch one first"),
    b("m", "matrix"),
    b("a", "mark flags as A"),
    b("A", "A/B vs A"),
    b("Up/Down", "select field"),
    b("Enter", "edit field / next level"),
];

/// Bench screen, matrix view.
pub const MATRIX: &[Binding] = &[
    b("r", "run"),
    b("Space/Enter", "choose preset"),
    b("l", "levels"),
    b("Esc", "back"),
    b("Up/Down", "select preset"),
];

/// Bench screen, matrix view while the matrix runs.
pub const MATRIX_RUNNING: &[Binding] = &[b("Esc", "cancel (stays resumable)")];

/// Bench screen, quick A/B (its settings, and the last result).
pub const AB: &[Binding] = &[
    b("A/Enter", "run the A/B"),
    b("r", "rounds"),
    b("n", "noise threshold"),
    b("Esc", "back to the form"),
];

/// Typing one value: A/B rounds, or the noise threshold (A/B or Runs comparison).
pub const VALUE_INPUT: &[Binding] = &[
    b("Enter", "set"),
    b("Esc", "cancel"),
    b("Backspace", "delete"),
];

/// Bench screen while the quick A/B runs.
pub const AB_RUNNING: &[Binding] = &[b("Esc", "cancel (records kept)")];

/// Bench screen while a benchmark runs.
pub const BENCH_RUNNING: &[Binding] = &[b("Esc", "cancel (partial record kept)")];

/// Bench screen while typing a value.
pub const BENCH_INPUT: &[Binding] = &[
    b("Enter", "accept"),
    b("Esc", "discard"),
    b("Backspace", "delete"),
    b(",", "separate several values"),
];

/// Runs screen.
pub const RUNS: &[Binding] = &[
    b("Enter", "open"),
    b("m", "mark A/B"),
    b("C", "compare"),
    b("/", "filter"),
    b("e", "export markdown"),
    b("Up/Down", "select run"),
    b("g", "reload"),
    b("Esc", "clear filter"),
];

/// Runs screen while a run or a comparison is open.
pub const RUNS_VIEW: &[Binding] = &[
    b("Esc", "back"),
    b("Up/Down", "scroll"),
    b("PgUp/PgDn", "page"),
    b("e", "export comparison as markdown"),
    b("n", "noise threshold"),
];

/// Every table with its heading, in help order (the help overlay and docs/tui.md use this).
pub const SECTIONS: &[(&str, &[Binding])] = &[
    ("Everywhere", GLOBAL),
    ("Flags", FLAGS),
    ("Flags: typing a serving limit", FLAGS_EDIT),
    ("Flags: picker, save, diff, command", FLAGS_DIALOG),
    ("Launch", LAUNCH),
    (HOSTS_SECTION, LAUNCH_HOSTS),
    (CLUSTER_SECTION, LAUNCH_CLUSTER),
    ("Launch: URL, search or stop question", LAUNCH_INPUT),
    ("Live", LIVE),
    (LIVE_HOSTS_SECTION, LIVE_HOSTS),
    ("Bench", BENCH),
    ("Bench: no target ready", BENCH_NO_TARGET),
    ("Bench: running", BENCH_RUNNING),
    ("Bench: typing a value", BENCH_INPUT),
    ("Bench: matrix view", MATRIX),
    ("Bench: matrix running", MATRIX_RUNNING),
    ("Bench: quick A/B", AB),
    ("Bench: quick A/B running", AB_RUNNING),
    (
        "Bench A/B or Runs comparison: typing rounds or noise",
        VALUE_INPUT,
    ),
    ("Runs", RUNS),
    ("Runs: run or comparison open", RUNS_VIEW),
];

/// The bindings as markdown tables, one per section: the generated part of `docs/tui.md`.
pub fn markdown() -> String {
    let mut out = String::new();
    for (title, bindings) in SECTIONS {
        out.push_str(&format!("### {title}\n\n| key | action |\n|---|---|\n"));
        for b in *bindings {
            out.push_str(&format!(
                "| `{}` | {} |\n",
                b.key.replace('|', "\\|"),
                b.action
            ));
        }
        out.push('\n');
    }
    out
}
