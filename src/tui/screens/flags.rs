//! Flags screen: every axis and serving limit of the current `FlagSet` with its value,
//! default and doc; cycle and reset values; rule findings inline; preset picker, save,
//! diff against the loaded preset, and the exact command that would run.

use crossterm::event::{KeyCode, KeyEvent};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Table, TableState, Wrap};

use crate::flags::axes::{Activation, AxisInfo, AxisValue, MoeBackend, all_axes};
use crate::flags::dialect::{Upstream, upstream_moe};
use crate::flags::model::{self, Setting};
use crate::flags::preset::Preset;
use crate::flags::rules::{self, Finding, Severity};
use crate::flags::{FlagSet, VllmFlavor, docker_run_argv, render};
use crate::vocab::TargetKind;

use super::super::app::{App, Effect};
use super::super::theme::Theme;
use super::super::ui::centered;

/// A serving limit editable on this screen. `None` leaves the target's own default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `serving.max_model_len`.
    MaxModelLen,
    /// `serving.max_num_seqs`.
    MaxNumSeqs,
    /// `serving.max_num_batched_tokens`.
    MaxBatchedTokens,
    /// `serving.long_prefill_token_threshold`.
    LongPrefill,
    /// `serving.max_waiting_queue_length` (bundled engine).
    MaxWaiting,
    /// `serving.gpu_memory_utilization`.
    GpuMemory,
    /// `serving.prefix_caching`.
    PrefixCaching,
    /// `serving.async_scheduling`.
    AsyncScheduling,
    /// `serving.load_format`.
    LoadFormat,
}

impl Limit {
    /// All limits in display order.
    pub const ALL: [Limit; 9] = [
        Limit::MaxModelLen,
        Limit::MaxNumSeqs,
        Limit::MaxBatchedTokens,
        Limit::LongPrefill,
        Limit::MaxWaiting,
        Limit::GpuMemory,
        Limit::PrefixCaching,
        Limit::AsyncScheduling,
        Limit::LoadFormat,
    ];

    /// The setting this row edits (key, doc, section).
    pub fn setting(self) -> &'static Setting {
        match self {
            Limit::MaxModelLen => &model::S_MAX_MODEL_LEN,
            Limit::MaxNumSeqs => &model::S_MAX_NUM_SEQS,
            Limit::MaxBatchedTokens => &model::S_MAX_BATCHED,
            Limit::LongPrefill => &model::S_LONG_PREFILL,
            Limit::MaxWaiting => &model::S_MAX_WAITING,
            Limit::GpuMemory => &model::S_GPU_MEM,
            Limit::PrefixCaching => &model::S_PREFIX_CACHING,
            Limit::AsyncScheduling => &model::S_ASYNC,
            Limit::LoadFormat => &model::S_LOAD_FORMAT,
        }
    }

    /// The values offered when cycling; the operator's own values (from a preset) stay
    /// reachable because cycling starts from wherever the current value sorts.
    fn choices(self) -> &'static [&'static str] {
        match self {
            Limit::MaxModelLen => &[
                "1024", "2048", "4096", "8192", "16384", "32768", "65536", "131072",
            ],
            Limit::MaxNumSeqs => &["1", "2", "4", "8", "16", "32", "64", "128", "256"],
            Limit::MaxBatchedTokens => &["1024", "2048", "4096", "8192", "16384", "32768"],
            Limit::LongPrefill => &["64", "128", "256", "512", "1024", "2048"],
            Limit::MaxWaiting => &["1", "2", "4", "8", "16", "32", "64", "128", "256"],
            Limit::GpuMemory => &["0.5", "0.6", "0.7", "0.8", "0.85", "0.9", "0.95"],
            Limit::PrefixCaching | Limit::AsyncScheduling => &["true", "false"],
            Limit::LoadFormat => &["auto", "safetensors", "fastsafetensors"],
        }
    }

    /// The range a typed value must fall in, for the limits that take a number (the others
    /// are cycled only). Whole numbers are stored as `u32` in the flag set; the GPU memory
    /// fraction must lie in (0, 1], the same check `flags::render` makes.
    pub fn numeric(self) -> Option<NumberRule> {
        match self {
            Limit::MaxModelLen
            | Limit::MaxNumSeqs
            | Limit::MaxBatchedTokens
            | Limit::MaxWaiting
            | Limit::LongPrefill => Some(NumberRule::Count),
            Limit::GpuMemory => Some(NumberRule::Fraction),
            Limit::PrefixCaching | Limit::AsyncScheduling | Limit::LoadFormat => None,
        }
    }

    /// Checks a typed value: `Ok(None)` for an empty field (the target's own default),
    /// `Ok(Some(v))` for a value in range, else why not, naming the allowed range.
    pub fn parse(self, text: &str) -> Result<Option<String>, String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let key = self.setting().key;
        match self.numeric() {
            None => Err(format!(
                "{key} is not a number; cycle it with Enter/Left/Right"
            )),
            Some(NumberRule::Count) => match text.parse::<u32>() {
                Ok(v) if v >= 1 => Ok(Some(v.to_string())),
                _ => Err(format!(
                    "{key} = {text} is not allowed: a whole number from 1 to {}",
                    u32::MAX
                )),
            },
            Some(NumberRule::Fraction) => match text.parse::<f64>() {
                Ok(v) if v > 0.0 && v <= 1.0 => Ok(Some(v.to_string())),
                _ => Err(format!(
                    "{key} = {text} is not allowed: a fraction in (0, 1], e.g. 0.85"
                )),
            },
        }
    }

    fn get(self, fs: &FlagSet) -> Option<String> {
        let s = &fs.serving;
        match self {
            Limit::MaxModelLen => s.max_model_len.map(|v| v.to_string()),
            Limit::MaxNumSeqs => s.max_num_seqs.map(|v| v.to_string()),
            Limit::MaxBatchedTokens => s.max_num_batched_tokens.map(|v| v.to_string()),
            Limit::LongPrefill => s.long_prefill_token_threshold.map(|v| v.to_string()),
            Limit::MaxWaiting => s.max_waiting_queue_length.map(|v| v.to_string()),
            Limit::GpuMemory => s.gpu_memory_utilization.map(|v| v.to_string()),
            Limit::PrefixCaching => s.prefix_caching.map(|v| v.to_string()),
            Limit::AsyncScheduling => s.async_scheduling.map(|v| v.to_string()),
            Limit::LoadFormat => s.load_format.clone(),
        }
    }

    /// Sets the limit from one of its `choices` (always parseable) or `None`.
    fn set(self, fs: &mut FlagSet, v: Option<&str>) {
        let s = &mut fs.serving;
        match self {
            Limit::MaxModelLen => s.max_model_len = v.and_then(|v| v.parse().ok()),
            Limit::MaxNumSeqs => s.max_num_seqs = v.and_then(|v| v.parse().ok()),
            Limit::MaxBatchedTokens => s.max_num_batched_tokens = v.and_then(|v| v.parse().ok()),
            Limit::LongPrefill => s.long_prefill_token_threshold = v.and_then(|v| v.parse().ok()),
            Limit::MaxWaiting => s.max_waiting_queue_length = v.and_then(|v| v.parse().ok()),
            Limit::GpuMemory => s.gpu_memory_utilization = v.and_then(|v| v.parse().ok()),
            Limit::PrefixCaching => s.prefix_caching = v.and_then(|v| v.parse().ok()),
            Limit::AsyncScheduling => s.async_scheduling = v.and_then(|v| v.parse().ok()),
            Limit::LoadFormat => s.load_format = v.map(str::to_string),
        }
    }

    /// Position of the current value among the choices, counting "target default" as -1,
    /// and values between choices as just before the next larger one.
    fn position(self, cur: Option<&str>) -> isize {
        let Some(cur) = cur else { return -1 };
        let ch = self.choices();
        if let Some(i) = ch.iter().position(|c| *c == cur) {
            return i as isize;
        }
        if let Ok(x) = cur.parse::<f64>() {
            let above = ch
                .iter()
                .position(|c| c.parse::<f64>().is_ok_and(|c| c > x))
                .unwrap_or(ch.len());
            return above as isize - 1;
        }
        -1
    }

    fn step(self, fs: &mut FlagSet, forward: bool) {
        let n = self.choices().len() as isize + 1; // +1: the target default
        let cur = self.get(fs);
        let pos = self.position(cur.as_deref()) + 1; // 0 = default
        let exact = cur.is_none() || self.choices().contains(&cur.as_deref().unwrap_or(""));
        let next = if forward {
            (pos + 1) % n
        } else if exact {
            (pos - 1 + n) % n
        } else {
            pos
        };
        let v = (next > 0).then(|| self.choices()[(next - 1) as usize]);
        self.set(fs, v);
    }
}

/// What a typed serving limit must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberRule {
    /// A whole number from 1 to `u32::MAX`.
    Count,
    /// A fraction in (0, 1].
    Fraction,
}

impl NumberRule {
    /// The allowed range, as the editor shows it.
    pub fn describe(self) -> String {
        match self {
            NumberRule::Count => format!("whole number 1..{}", u32::MAX),
            NumberRule::Fraction => "fraction in (0, 1]".to_string(),
        }
    }

    fn accepts(self, c: char) -> bool {
        c.is_ascii_digit() || (self == NumberRule::Fraction && c == '.')
    }
}

/// The inline editor of a numeric serving limit (Enter on its row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitEdit {
    /// The limit being edited.
    pub limit: Limit,
    /// What has been typed (starts as the current value).
    pub text: String,
    /// Why the last Enter was refused; the old value stays.
    pub error: Option<String>,
}

/// One row of the flags table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    /// An axis: index into `all_axes()`.
    Axis(usize),
    /// A serving limit.
    Limit(Limit),
}

/// A dialog open over the flags table.
#[derive(Debug, Clone, PartialEq)]
pub enum Overlay {
    /// `p`: choose a preset; typing filters the list.
    Picker {
        /// Typed filter (substring, case-insensitive).
        filter: String,
        /// Every preset name (filled by the runtime).
        names: Vec<String>,
        /// Index into the filtered list.
        selected: usize,
    },
    /// `s`: name the preset to save.
    Save {
        /// Name typed so far.
        name: String,
        /// Why the name cannot be used, or what failed.
        error: Option<String>,
        /// The name exists: waiting for y/n.
        confirm_overwrite: bool,
    },
    /// `d`: keys that differ from the loaded preset.
    Diff {
        /// First line shown.
        scroll: u16,
    },
    /// `c`: the command that would run.
    Command {
        /// First line shown.
        scroll: u16,
    },
}

/// State of the Flags screen.
#[derive(Debug, Clone, Default)]
pub struct FlagsScreen {
    /// The flags being edited.
    pub flags: FlagSet,
    /// The preset they came from (the baseline for diff, `R` and the unsaved marker).
    pub loaded: Option<Preset>,
    /// Selected row.
    pub selected: usize,
    /// Open dialog.
    pub overlay: Option<Overlay>,
    /// Why the last preset load failed.
    pub load_error: Option<String>,
    /// A serving limit being typed in.
    pub editing: Option<LimitEdit>,
}

/// Every row in display order.
pub fn rows() -> Vec<RowKind> {
    let n = all_axes().len();
    (0..n)
        .map(RowKind::Axis)
        .chain(Limit::ALL.iter().copied().map(RowKind::Limit))
        .collect()
}

/// Whether `name` is usable as a preset file stem (same rule as `PresetStore::save`).
pub fn valid_preset_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn target_name(t: TargetKind) -> &'static str {
    t.name()
}

/// Axis values that render on the flag set's target — on a stock vLLM image only those
/// upstream can express, `moe_backend` and `activation` as a pair with the other's current
/// value — or all of them when none does, so the row still cycles.
fn values_for(info: &AxisInfo, fs: &FlagSet) -> Vec<&'static str> {
    let stock = fs.target == TargetKind::Docker && fs.container.vllm == VllmFlavor::Upstream;
    let fits: Vec<&'static str> = info
        .values
        .iter()
        .zip(&info.upstream)
        .filter(|((name, _, spec), upstream)| match fs.target {
            TargetKind::Docker if stock => match info.key {
                k if k == MoeBackend::KEY => name
                    .parse::<MoeBackend>()
                    .is_ok_and(|b| upstream_moe(b, fs.axes.activation).is_ok()),
                k if k == Activation::KEY => name
                    .parse::<Activation>()
                    .is_ok_and(|a| upstream_moe(fs.axes.moe_backend, a).is_ok()),
                _ => !matches!(upstream, Upstream::Not(_)),
            },
            TargetKind::Docker | TargetKind::DockerCluster => spec.vllm.is_some(),
            TargetKind::Engine => spec.engine.is_some(),
            TargetKind::Attach => true,
        })
        .map(|((n, _, _), _)| *n)
        .collect();
    if fits.is_empty() {
        info.values.iter().map(|(n, _, _)| *n).collect()
    } else {
        fits
    }
}

/// Keys whose values differ between `base` and `now`: (key, before, after). A flag set that
/// cannot be written as TOML shows no differences rather than stopping the panel.
pub fn diff(base: &FlagSet, now: &FlagSet) -> Vec<(String, String, String)> {
    base.diff(now).unwrap_or_default()
}

/// The command that would run for the flag set's target, one argument per line, or why not.
pub fn command_lines(fs: &FlagSet) -> Vec<String> {
    let spec = match render(fs, fs.target) {
        Ok(s) => s,
        Err(e) => {
            return vec![format!(
                "cannot render for {}: {e:#}",
                target_name(fs.target)
            )];
        }
    };
    let argv = match fs.target {
        TargetKind::Docker => match docker_run_argv(&spec) {
            Ok(a) => a,
            Err(e) => return vec![format!("cannot build docker run: {e:#}")],
        },
        _ => {
            let mut a: Vec<String> = spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            a.extend(spec.argv.iter().cloned());
            a
        }
    };
    let mut lines: Vec<String> = Vec::new();
    // The program and its leading words (`docker run`, `mxtune serve`) share the first line.
    let lead = argv
        .iter()
        .take_while(|a| !a.starts_with('-'))
        .count()
        .max(1);
    lines.push(shell_words::join(&argv[..lead.min(argv.len())]));
    let mut i = lead;
    // One option per line (with its value when the next word is not an option), so the
    // block copies as one valid shell command.
    while i < argv.len() {
        let mut line = shell_words::quote(&argv[i]).into_owned();
        if argv[i].starts_with('-') && i + 1 < argv.len() && !argv[i + 1].starts_with('-') {
            line.push(' ');
            line.push_str(&shell_words::quote(&argv[i + 1]));
            i += 1;
        }
        lines.push(line);
        i += 1;
    }
    let last = lines.len().saturating_sub(1);
    for (n, l) in lines.iter_mut().enumerate() {
        if n != last {
            l.push_str(" \\");
        }
        if n != 0 {
            l.insert_str(0, "  ");
        }
    }
    for w in &spec.warnings {
        lines.push(format!("# warning: {w}"));
    }
    // What the kernel-path verdict will look for once the target is up.
    for c in &spec.checks {
        let mut what: Vec<String> = c.must_see.iter().map(|p| format!("see {p}")).collect();
        what.extend(c.must_not_see.iter().map(|p| format!("not {p}")));
        lines.push(format!(
            "# kernel-path {}={}: {}",
            c.flag,
            c.value,
            what.join("; ")
        ));
    }
    lines
}

impl FlagsScreen {
    /// Findings of the rules table for the current flags on their target (GPU unknown).
    pub fn findings(&self) -> Vec<Finding> {
        rules::evaluate(&self.flags, self.flags.target, None)
    }

    /// Whether the flags differ from the loaded preset.
    pub fn dirty(&self) -> bool {
        self.loaded.as_ref().is_none_or(|p| p.flags != self.flags)
    }

    /// Whether a dialog is open that takes every key (typing, confirming).
    pub fn captures_keys(&self) -> bool {
        self.overlay.is_some() || self.editing.is_some()
    }

    /// A preset was loaded: it becomes the baseline and the flags being edited.
    pub fn on_preset_loaded(&mut self, preset: Preset) {
        self.flags = preset.flags.clone();
        self.loaded = Some(preset);
        self.load_error = None;
        self.overlay = None;
        self.editing = None;
    }

    /// Loading a preset failed.
    pub fn on_preset_error(&mut self, error: String) {
        self.load_error = Some(error);
    }

    /// The preset list arrived for the picker.
    pub fn on_preset_list(&mut self, list: Vec<String>) {
        if let Some(Overlay::Picker {
            names, selected, ..
        }) = &mut self.overlay
        {
            *names = list;
            *selected = 0;
        }
    }

    /// Saving finished: on success the saved preset becomes the baseline; with `ask` the
    /// error is a question the Save dialog puts to the operator (y saves anyway).
    pub fn on_saved(&mut self, result: Result<Preset, String>, ask: bool) {
        match result {
            Ok(p) => {
                self.loaded = Some(p);
                self.overlay = None;
            }
            Err(e) => {
                if let Some(Overlay::Save {
                    error,
                    confirm_overwrite,
                    ..
                }) = &mut self.overlay
                {
                    *confirm_overwrite = ask;
                    *error = Some(e);
                }
            }
        }
    }

    fn picker_matches(filter: &str, names: &[String]) -> Vec<String> {
        let f = filter.to_lowercase();
        names
            .iter()
            .filter(|n| n.to_lowercase().contains(&f))
            .cloned()
            .collect()
    }

    fn cycle(&mut self, forward: bool) {
        let Some(row) = rows().get(self.selected).copied() else {
            return;
        };
        match row {
            RowKind::Axis(i) => {
                let axes = all_axes();
                let info = &axes[i];
                let values = values_for(info, &self.flags);
                let cur = self.flags.axis_value(info.key).unwrap_or(info.default);
                let n = values.len();
                let next = match values.iter().position(|v| *v == cur) {
                    Some(p) if forward => (p + 1) % n,
                    Some(p) => (p + n - 1) % n,
                    None => 0,
                };
                // Names come from the axis table itself, so this cannot fail.
                let _ = self.flags.set_axis(info.key, values[next]);
            }
            RowKind::Limit(l) => l.step(&mut self.flags, forward),
        }
    }

    fn reset(&mut self) {
        let Some(row) = rows().get(self.selected).copied() else {
            return;
        };
        match row {
            RowKind::Axis(i) => {
                let info = &all_axes()[i];
                let _ = self.flags.set_axis(info.key, info.default);
            }
            RowKind::Limit(l) => l.set(&mut self.flags, None),
        }
    }

    /// Enter on a row: numeric serving limits open the editor, everything else cycles.
    fn enter(&mut self) {
        match rows().get(self.selected).copied() {
            Some(RowKind::Limit(l)) if l.numeric().is_some() => {
                self.editing = Some(LimitEdit {
                    limit: l,
                    text: l.get(&self.flags).unwrap_or_default(),
                    error: None,
                });
            }
            _ => self.cycle(true),
        }
    }

    fn on_edit_key(&mut self, mut ed: LimitEdit, key: KeyEvent) {
        let rule = ed.limit.numeric().unwrap_or(NumberRule::Count);
        match key.code {
            KeyCode::Esc => return,
            KeyCode::Enter => match ed.limit.parse(&ed.text) {
                Ok(v) => {
                    ed.limit.set(&mut self.flags, v.as_deref());
                    return;
                }
                Err(e) => ed.error = Some(e),
            },
            KeyCode::Backspace => {
                ed.text.pop();
                ed.error = None;
            }
            KeyCode::Char(c) if rule.accepts(c) => {
                ed.text.push(c);
                ed.error = None;
            }
            KeyCode::Char(c) => {
                ed.error = Some(format!(
                    "`{c}` cannot be typed here: {} (Esc cancels)",
                    rule.describe()
                ))
            }
            _ => {}
        }
        self.editing = Some(ed);
    }

    /// Handle a key on this screen.
    pub fn on_key(&mut self, key: KeyEvent) -> Vec<Effect> {
        if let Some(ov) = self.overlay.take() {
            return self.on_overlay_key(ov, key);
        }
        if let Some(ed) = self.editing.take() {
            self.on_edit_key(ed, key);
            return Vec::new();
        }
        let n = rows().len();
        match key.code {
            KeyCode::Up | KeyCode::Char('k') => self.selected = self.selected.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => self.selected = (self.selected + 1).min(n - 1),
            KeyCode::Home => self.selected = 0,
            KeyCode::End => self.selected = n - 1,
            KeyCode::Enter => self.enter(),
            KeyCode::Char(' ') | KeyCode::Right => self.cycle(true),
            KeyCode::Left => self.cycle(false),
            KeyCode::Char('r') => self.reset(),
            KeyCode::Char('R') => {
                if let Some(p) = &self.loaded {
                    self.flags = p.flags.clone();
                }
            }
            KeyCode::Char('t') => {
                self.flags.target = match self.flags.target {
                    TargetKind::Docker => TargetKind::Engine,
                    _ => TargetKind::Docker,
                }
            }
            KeyCode::Char('p') => {
                self.overlay = Some(Overlay::Picker {
                    filter: String::new(),
                    names: Vec::new(),
                    selected: 0,
                });
                return vec![Effect::ListPresets];
            }
            KeyCode::Char('s') => {
                self.overlay = Some(Overlay::Save {
                    name: String::new(),
                    error: None,
                    confirm_overwrite: false,
                })
            }
            KeyCode::Char('d') => self.overlay = Some(Overlay::Diff { scroll: 0 }),
            KeyCode::Char('c') => self.overlay = Some(Overlay::Command { scroll: 0 }),
            _ => {}
        }
        Vec::new()
    }

    fn on_overlay_key(&mut self, ov: Overlay, key: KeyEvent) -> Vec<Effect> {
        let mut effects = Vec::new();
        self.overlay = match ov {
            Overlay::Picker {
                mut filter,
                names,
                mut selected,
            } => {
                let matches = Self::picker_matches(&filter, &names);
                match key.code {
                    KeyCode::Esc => None,
                    KeyCode::Enter => {
                        if let Some(name) = matches.get(selected) {
                            effects.push(Effect::LoadPreset(name.clone()));
                            None
                        } else {
                            Some(Overlay::Picker {
                                filter,
                                names,
                                selected,
                            })
                        }
                    }
                    KeyCode::Up => {
                        selected = selected.saturating_sub(1);
                        Some(Overlay::Picker {
                            filter,
                            names,
                            selected,
                        })
                    }
                    KeyCode::Down => {
                        selected = (selected + 1).min(matches.len().saturating_sub(1));
                        Some(Overlay::Picker {
                            filter,
                            names,
                            selected,
                        })
                    }
                    KeyCode::Backspace => {
                        filter.pop();
                        Some(Overlay::Picker {
                            filter,
                            names,
                            selected: 0,
                        })
                    }
                    KeyCode::Char(c) => {
                        filter.push(c);
                        Some(Overlay::Picker {
                            filter,
                            names,
                            selected: 0,
                        })
                    }
                    _ => Some(Overlay::Picker {
                        filter,
                        names,
                        selected,
                    }),
                }
            }
            Overlay::Save {
                mut name,
                error,
                confirm_overwrite,
            } => match key.code {
                KeyCode::Esc => None,
                KeyCode::Char('y') if confirm_overwrite => {
                    effects.push(Effect::SavePreset {
                        name: name.clone(),
                        overwrite: true,
                    });
                    Some(Overlay::Save {
                        name,
                        error: None,
                        confirm_overwrite: false,
                    })
                }
                KeyCode::Char('n') if confirm_overwrite => Some(Overlay::Save {
                    name,
                    error: None,
                    confirm_overwrite: false,
                }),
                _ if confirm_overwrite => Some(Overlay::Save {
                    name,
                    error,
                    confirm_overwrite,
                }),
                KeyCode::Enter => {
                    if valid_preset_name(&name) {
                        effects.push(Effect::SavePreset {
                            name: name.clone(),
                            overwrite: false,
                        });
                        Some(Overlay::Save {
                            name,
                            error: None,
                            confirm_overwrite: false,
                        })
                    } else {
                        Some(Overlay::Save {
                            error: Some(format!(
                                "`{name}` is not a usable name: letters, digits, '-', '_', '.' (not first)"
                            )),
                            name,
                            confirm_overwrite: false,
                        })
                    }
                }
                KeyCode::Backspace => {
                    name.pop();
                    Some(Overlay::Save {
                        name,
                        error: None,
                        confirm_overwrite: false,
                    })
                }
                KeyCode::Char(c) => {
                    name.push(c);
                    let error = (!valid_preset_name(&name))
                        .then(|| "letters, digits, '-', '_', '.' only (not first)".to_string());
                    Some(Overlay::Save {
                        name,
                        error,
                        confirm_overwrite: false,
                    })
                }
                _ => Some(Overlay::Save {
                    name,
                    error,
                    confirm_overwrite,
                }),
            },
            Overlay::Diff { scroll } => {
                scroll_key(key, scroll).map(|s| Overlay::Diff { scroll: s })
            }
            Overlay::Command { scroll } => {
                if key.code == KeyCode::Char('S') {
                    effects.push(Effect::SaveCommand);
                }
                let last = command_lines(&self.flags).len().saturating_sub(1);
                scroll_key(key, scroll).map(|s| Overlay::Command {
                    scroll: s.min(u16::try_from(last).unwrap_or(u16::MAX)),
                })
            }
        };
        effects
    }
}

/// The file `S` saves the command to: `command-<preset>.sh` (the export picks `-2`, `-3`…
/// when that exists).
pub fn command_file(dir: &std::path::Path, preset: &str) -> std::path::PathBuf {
    let stem = if preset.is_empty() { "flags" } else { preset };
    dir.join(format!("command-{stem}.sh"))
}

/// Scrolling in a read-only view; `None` closes it.
fn scroll_key(key: KeyEvent, scroll: u16) -> Option<u16> {
    match key.code {
        KeyCode::Esc | KeyCode::Char('q') | KeyCode::Char('c') | KeyCode::Char('d') => None,
        KeyCode::Up | KeyCode::Char('k') => Some(scroll.saturating_sub(1)),
        KeyCode::Down | KeyCode::Char('j') => Some(scroll.saturating_add(1)),
        KeyCode::PageUp => Some(scroll.saturating_sub(10)),
        KeyCode::PageDown => Some(scroll.saturating_add(10)),
        KeyCode::Home => Some(0),
        _ => Some(scroll),
    }
}

fn finding_style(theme: &Theme, f: &Finding) -> ratatui::style::Style {
    match f.severity {
        Severity::Error => theme.error(),
        Severity::Warning => theme.warn(),
    }
}

/// Draw the Flags screen.
pub fn draw(frame: &mut Frame, app: &App, area: Rect) {
    let s = &app.flags;
    let theme = &app.theme;
    let findings = s.findings();
    let find_h = (findings.len() as u16 + 2).clamp(3, area.height / 3);
    let axes = all_axes();
    // The selected row's docs: its own line, and the selected value's line for axes; while
    // a limit is typed in, what it accepts and why the last value was refused.
    let doc_lines = match (&s.editing, rows().get(s.selected)) {
        (Some(ed), _) => {
            let rule = ed.limit.numeric().unwrap_or(NumberRule::Count);
            vec![
                Line::from(vec![
                    Span::styled(format!(" {}: ", ed.limit.setting().key), theme.accent()),
                    Span::raw(format!("{}; Enter sets, Esc cancels", rule.describe())),
                ]),
                match &ed.error {
                    Some(e) => Line::styled(format!(" {}", theme.text(e)), theme.error()),
                    None => Line::styled(
                        format!(
                            " empty = the target's default; now {}",
                            ed.limit.get(&s.flags).unwrap_or_else(|| "default".into())
                        ),
                        theme.dim(),
                    ),
                },
            ]
        }
        (None, row) => match row {
            Some(RowKind::Axis(i)) => {
                let info = &axes[*i];
                let v = s.flags.axis_value(info.key).unwrap_or(info.default);
                let vdoc = info
                    .values
                    .iter()
                    .find(|(n, _, _)| *n == v)
                    .map(|(_, d, _)| *d)
                    .unwrap_or("");
                let values = values_for(info, &s.flags).join(" ");
                vec![
                    Line::from(vec![
                        Span::styled(format!(" {}: ", info.key), theme.accent()),
                        Span::raw(theme.text(info.doc).into_owned()),
                    ]),
                    Line::from(vec![
                        Span::styled(format!(" {v}: "), theme.accent()),
                        Span::raw(theme.text(vdoc).into_owned()),
                        Span::styled(format!("  [{values}]"), theme.dim()),
                    ]),
                ]
            }
            Some(RowKind::Limit(l)) => {
                let st = l.setting();
                vec![
                    Line::from(vec![
                        Span::styled(format!(" {}: ", st.key), theme.accent()),
                        Span::raw(theme.text(st.doc).into_owned()),
                    ]),
                    Line::styled(
                        match l.numeric() {
                            Some(_) => {
                                format!(" [default {}]  Enter: type a value", l.choices().join(" "))
                            }
                            None => format!(" [default {}]", l.choices().join(" ")),
                        },
                        theme.dim(),
                    ),
                ]
            }
            None => Vec::new(),
        },
    };
    // The docs wrap at the edge instead of being cut: as many rows as the wrapped lines
    // take (at least two, so the table does not jump, at most four).
    let doc = Paragraph::new(doc_lines).wrap(Wrap { trim: false });
    let doc_h = (doc.line_count(area.width) as u16).clamp(2, (area.height / 4).max(2));
    let [table_area, doc_area, find_area] = Layout::vertical([
        Constraint::Min(5),
        Constraint::Length(doc_h),
        Constraint::Length(find_h),
    ])
    .areas(area);

    let wide = area.width >= 120;
    let mut table_rows = Vec::new();
    for row in rows() {
        let (key, value, default, doc, path) = match row {
            RowKind::Axis(i) => {
                let info = &axes[i];
                let v = s.flags.axis_value(info.key).unwrap_or(info.default);
                (
                    info.key,
                    v.to_string(),
                    info.default.to_string(),
                    info.doc,
                    info.path.to_string(),
                )
            }
            RowKind::Limit(l) => {
                let st = l.setting();
                let v = match &s.editing {
                    Some(ed) if ed.limit == l => format!("[{}_]", ed.text),
                    _ => l.get(&s.flags).unwrap_or_else(|| "default".into()),
                };
                (
                    st.key,
                    v,
                    "default".to_string(),
                    st.doc,
                    format!("{}.{}", st.section, st.key),
                )
            }
        };
        let hit = findings
            .iter()
            .filter(|f| f.keys.iter().any(|k| *k == path))
            .min_by_key(|f| f.severity);
        let mark = match hit {
            Some(f) if f.severity == Severity::Error => Span::styled("E", theme.error()),
            Some(_) => Span::styled("W", theme.warn()),
            None => Span::raw(" "),
        };
        let changed = s
            .loaded
            .as_ref()
            .is_some_and(|p| diff(&p.flags, &s.flags).iter().any(|(k, _, _)| *k == path));
        let value_style = if changed {
            theme.accent()
        } else {
            ratatui::style::Style::default()
        };
        let mut cells = vec![
            Cell::from(mark),
            Cell::from(key),
            Cell::from(Span::styled(
                format!("{}{value}", if changed { "*" } else { "" }),
                value_style,
            )),
            Cell::from(Span::styled(default, theme.dim())),
        ];
        if wide {
            cells.push(Cell::from(Span::styled(
                theme.text(doc).into_owned(),
                theme.dim(),
            )));
        }
        table_rows.push(Row::new(cells));
    }
    let mut widths = vec![
        Constraint::Length(1),
        Constraint::Length(24),
        Constraint::Length(22),
        Constraint::Length(12),
    ];
    if wide {
        widths.push(Constraint::Min(20));
    }
    let mut header = vec!["", "flag", "value", "default"];
    if wide {
        header.push("doc");
    }
    let title = format!(
        " Flags: {} target, preset {}{} ",
        target_name(s.flags.target),
        s.loaded
            .as_ref()
            .map(|p| p.name.as_str())
            .unwrap_or("(none)"),
        if s.dirty() { " [modified]" } else { "" }
    );
    let table = Table::new(table_rows, widths)
        .header(Row::new(header).style(theme.accent()))
        .row_highlight_style(theme.selected())
        .block(Block::bordered().border_set(theme.border()).title(title));
    let mut state = TableState::default().with_selected(Some(s.selected));
    frame.render_stateful_widget(table, table_area, &mut state);

    frame.render_widget(doc, doc_area);

    let mut lines: Vec<Line> = Vec::new();
    if let Some(e) = &s.load_error {
        lines.push(Line::styled(
            theme.text(&format!("preset: {e}")).into_owned(),
            theme.error(),
        ));
    }
    for f in &findings {
        lines.push(Line::styled(
            theme.text(&f.to_string()).into_owned(),
            finding_style(theme, f),
        ));
    }
    if lines.is_empty() {
        lines.push(Line::styled("no conflicts for this target", theme.good()));
    }
    frame.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: true }).block(
            Block::bordered()
                .border_set(theme.border())
                .title(" Rules "),
        ),
        find_area,
    );

    if let Some(ov) = &s.overlay {
        draw_overlay(frame, app, ov, area);
    }
}

fn draw_overlay(frame: &mut Frame, app: &App, ov: &Overlay, area: Rect) {
    let theme = &app.theme;
    let s = &app.flags;
    match ov {
        Overlay::Picker {
            filter,
            names,
            selected,
        } => {
            let matches = FlagsScreen::picker_matches(filter, names);
            let popup = centered(area, 50, area.height.saturating_sub(2));
            let mut lines = vec![
                Line::from(vec![
                    Span::styled("filter: ", theme.accent()),
                    Span::raw(filter.clone()),
                    Span::raw("_"),
                ]),
                Line::raw(""),
            ];
            let visible = popup.height.saturating_sub(4) as usize;
            let start = selected.saturating_sub(visible.saturating_sub(1));
            for (i, n) in matches.iter().enumerate().skip(start).take(visible) {
                let style = if i == *selected {
                    theme.selected()
                } else {
                    ratatui::style::Style::default()
                };
                lines.push(Line::styled(format!(" {n}"), style));
            }
            if matches.is_empty() {
                lines.push(Line::styled(" no preset matches", theme.dim()));
            }
            frame.render_widget(Clear, popup);
            frame.render_widget(
                Paragraph::new(lines).block(
                    Block::bordered()
                        .border_set(theme.border())
                        .title(" Load preset (type to filter, Enter loads, Esc) "),
                ),
                popup,
            );
        }
        Overlay::Save {
            name,
            error,
            confirm_overwrite,
        } => {
            let popup = centered(area, 64, 7);
            let mut lines = vec![
                Line::from(vec![
                    Span::styled("name: ", theme.accent()),
                    Span::raw(name.clone()),
                    Span::raw("_"),
                ]),
                Line::styled(
                    format!("into {}", app.paths.save_dir.display()),
                    theme.dim(),
                ),
            ];
            if *confirm_overwrite {
                let question = error
                    .clone()
                    .unwrap_or_else(|| format!("`{name}` exists. Overwrite it? y/n"));
                lines.push(Line::styled(question, theme.warn()));
            } else if let Some(e) = error {
                lines.push(Line::styled(e.clone(), theme.error()));
            } else {
                lines.push(Line::styled("Enter saves, Esc cancels", theme.dim()));
            }
            frame.render_widget(Clear, popup);
            frame.render_widget(
                Paragraph::new(lines).wrap(Wrap { trim: true }).block(
                    Block::bordered()
                        .border_set(theme.border())
                        .title(" Save as preset "),
                ),
                popup,
            );
        }
        Overlay::Diff { scroll } => {
            let popup = centered(
                area,
                area.width.saturating_sub(4),
                area.height.saturating_sub(2),
            );
            let lines: Vec<Line> = match &s.loaded {
                None => vec![Line::raw("no preset loaded")],
                Some(p) => {
                    let d = diff(&p.flags, &s.flags);
                    if d.is_empty() {
                        vec![Line::raw(format!("same flags as preset {}", p.name))]
                    } else {
                        d.into_iter()
                            .map(|(k, a, b)| {
                                Line::from(vec![
                                    Span::styled(format!("{k}: "), theme.accent()),
                                    Span::raw(format!("{a} -> {b}")),
                                ])
                            })
                            .collect()
                    }
                }
            };
            let name = s.loaded.as_ref().map(|p| p.name.as_str()).unwrap_or("-");
            frame.render_widget(Clear, popup);
            frame.render_widget(
                Paragraph::new(lines).scroll((*scroll, 0)).block(
                    Block::bordered()
                        .border_set(theme.border())
                        .title(format!(" Changes against preset {name} (Esc closes) ")),
                ),
                popup,
            );
        }
        Overlay::Command { scroll } => {
            let popup = centered(area, area.width, area.height);
            let lines: Vec<Line> = command_lines(&s.flags)
                .into_iter()
                .map(|l| Line::raw(theme.text(&l).into_owned()))
                .collect();
            frame.render_widget(Clear, popup);
            // Top and bottom rules only, so a mouse selection copies clean shell lines.
            frame.render_widget(
                Paragraph::new(lines).scroll((*scroll, 0)).block(
                    Block::default()
                        .borders(Borders::TOP | Borders::BOTTOM)
                        .border_set(theme.border())
                        .title(format!(
                            " Command for {}: Up/Down/PgUp/PgDn scroll, S saves to a file, Esc closes ",
                            target_name(s.flags.target)
                        )),
                ),
                popup,
            );
        }
    }
}
