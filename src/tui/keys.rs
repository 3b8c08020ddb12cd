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
    b("Up/Down", "select axis"),
    b("Enter/Space/Right", "next value"),
    b("Left", "previous value"),
    b("r", "reset axis to default"),
    b("R", "reset all to the loaded preset"),
    b("p", "load preset"),
    b("s", "save as preset"),
    b("d", "diff against loaded preset"),
    b("c", "command that would run"),
    b("t", "switch target (docker/engine)"),
];

/// Launch screen.
pub const LAUNCH: &[Binding] = &[
    b("t", "choose target"),
    b("l", "launch"),
    b("x", "stop (asks)"),
    b("Up/Down", "scroll log"),
    b("PgUp/PgDn", "page log"),
    b("Home/End", "top / follow"),
    b("/", "search log"),
    b("n/N", "next/prev match"),
    b("w", "wrap lines"),
    b("S", "save log to file"),
];

/// Live screen.
pub const LIVE: &[Binding] = &[
    b("+/-", "longer/shorter window"),
    b("f", "freeze (collection continues)"),
];

/// Bench screen.
pub const BENCH: &[Binding] = &[
    b("Up/Down", "select field"),
    b("Left/Right", "change value"),
    b("Enter", "run against the current target"),
    b("Esc", "cancel (partial record kept)"),
];

/// Runs screen.
pub const RUNS: &[Binding] = &[
    b("Up/Down", "select run"),
    b("Enter", "open"),
    b("m", "mark for A/B (two)"),
    b("C", "compare marked"),
    b("e", "export comparison as markdown"),
    b("/", "filter"),
    b("g", "reload"),
];
