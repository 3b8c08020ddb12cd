//! Live screen: charts of the monitor's samples over a selectable window (30 s … 30 min):
//! server tok/s, GPU memory (unified memory labelled as such), clocks, power, temperature,
//! utilisation, host CPU/RAM, running/waiting requests, KV-cache use and spec-decode
//! acceptance, and — only when the server exports the series — time per output token and
//! prefix-cache hit rate; throttle reasons shown prominently. `f` freezes the view while
//! collection continues. When the running target spans several hosts (a two-node cluster),
//! one panel per host sits above the charts, side by side, with that host's latest readings
//! or why its monitor failed; each host keeps its own history, and `h` picks whose charts
//! are shown (first the host that serves the API).

use std::collections::VecDeque;

use crossterm::event::{KeyCode, KeyEvent};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, Chart, Dataset, GraphType, Paragraph, Wrap};

use crate::monitor::sample::{GpuStatus, MemorySource, ServerMetrics, ServerStatus};
use crate::monitor::{Reading, Sample};

use super::super::app::App;
use super::super::theme::Theme;

/// The windows `+`/`-` step through, in seconds.
pub const WINDOWS: [u32; 6] = [30, 60, 120, 300, 600, 1800];

/// Points kept: 30 minutes at the panel's sampling rate of 1 Hz, plus slack.
pub const HISTORY_POINTS: usize = 1900;

/// Throttle reasons that are not a problem (an idle GPU clocks down on purpose).
const BENIGN_THROTTLE: &[&str] = &["gpu_idle", "applications_clocks_setting"];

/// The charted figures of one sample.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LivePoint {
    /// Seconds since the panel started (from the sample's wall time, so a restarted
    /// collector continues the same axis).
    pub t: f64,
    /// Server-side generation tokens/s.
    pub gen_tok_s: Option<f64>,
    /// Server-side prompt tokens/s.
    pub prompt_tok_s: Option<f64>,
    /// GPU (or unified) memory in use, GiB.
    pub gpu_mem_gib: Option<f64>,
    /// SM clock, MHz.
    pub sm_mhz: Option<f64>,
    /// Memory clock, MHz.
    pub mem_mhz: Option<f64>,
    /// Power, W.
    pub power_w: Option<f64>,
    /// Temperature, °C.
    pub temp_c: Option<f64>,
    /// GPU utilisation, %.
    pub util_pct: Option<f64>,
    /// Host CPU, %.
    pub cpu_pct: Option<f64>,
    /// Host RAM in use, %.
    pub ram_pct: Option<f64>,
    /// Requests running.
    pub running: Option<f64>,
    /// Requests waiting.
    pub waiting: Option<f64>,
    /// KV-cache use, %.
    pub kv_pct: Option<f64>,
    /// Spec-decode acceptance, %.
    pub spec_accept_pct: Option<f64>,
    /// Mean time per output token over the server's rate window, ms.
    pub tpot_ms: Option<f64>,
    /// Prefix-cache hit rate over the server's rate window, %.
    pub prefix_hit_pct: Option<f64>,
    /// Client-side generation tokens/s of the Bench screen's running benchmark (tokens of
    /// the requests that finished since the previous sample).
    pub bench_tok_s: Option<f64>,
}

const GIB: f64 = (1u64 << 30) as f64;

impl LivePoint {
    /// The charted figures of `s`, timed against `origin`.
    pub fn from_sample(s: &Sample, origin: chrono::DateTime<chrono::Utc>) -> Self {
        let mut p = LivePoint {
            t: (s.at - origin).num_milliseconds() as f64 / 1000.0,
            cpu_pct: s.host.cpu_pct.get().map(f64::from),
            ram_pct: (s.host.ram_total_bytes > 0)
                .then(|| s.host.ram_used_bytes as f64 / s.host.ram_total_bytes as f64 * 100.0),
            ..LivePoint::default()
        };
        if let GpuStatus::Available { gpus, .. } = &s.gpu
            && let Some(g) = gpus.first()
        {
            p.gpu_mem_gib = g.memory.used_bytes.get().map(|b| b as f64 / GIB);
            p.sm_mhz = g.clocks.sm_mhz.get().map(f64::from);
            p.mem_mhz = g.clocks.mem_mhz.get().map(f64::from);
            p.power_w = g.power_w.get();
            p.temp_c = g.temperature_c.get().map(f64::from);
            p.util_pct = g.utilization_gpu_pct.get().map(f64::from);
        }
        if let ServerStatus::Scraped(m) = &s.server {
            p.gen_tok_s = m.generation_tok_s.get();
            p.prompt_tok_s = m.prompt_tok_s.get();
            p.running = m.running.get();
            p.waiting = m.waiting.get();
            p.kv_pct = m.kv_cache_usage.get().map(|v| v * 100.0);
            p.spec_accept_pct = m.spec_acceptance_rate.get().map(|v| v * 100.0);
            p.tpot_ms = m.tpot_ms.as_ref().and_then(Reading::get);
            p.prefix_hit_pct = m
                .prefix_cache_hit_rate
                .as_ref()
                .and_then(Reading::get)
                .map(|v| v * 100.0);
        }
        p
    }
}

/// State of the Live screen.
#[derive(Debug, Clone)]
pub struct LiveScreen {
    /// When the first sample was taken (the time axis starts here).
    pub origin: Option<chrono::DateTime<chrono::Utc>>,
    /// Charted history, oldest first.
    pub points: VecDeque<LivePoint>,
    /// The latest sample, for labels and text (GPU name, memory source, throttling).
    pub latest: Option<Sample>,
    /// Index into `WINDOWS`.
    pub window: usize,
    /// Frozen at this time: the view stops there while samples keep arriving.
    pub frozen_at: Option<f64>,
    /// Why the collector could not start, if it could not.
    pub error: Option<String>,
    /// The page of charts shown when the terminal has room for fewer than all of them.
    pub page: usize,
    /// Pages at the last draw (the terminal size decides it).
    pub pages: std::cell::Cell<usize>,
    /// Tokens the running benchmark received since the last sample.
    pub bench_pending: u64,
    /// A benchmark is running (its tok/s is charted, zero included).
    pub bench_running: bool,
    /// The hosts.toml host these samples come from; `None`: this machine.
    pub host: Option<String>,
    /// One panel per host while the running target spans several hosts; empty otherwise
    /// (then the screen is the single-host view).
    pub hosts: Vec<HostPanel>,
    /// Index into `hosts` of the host whose charts are shown (`h` steps through them).
    pub shown: usize,
    /// The monitor watches the running target (its /metrics, its hosts): from its readiness
    /// until its end.
    pub target_watched: bool,
}

/// One host of a target that spans several: its latest sample, or why its monitor failed.
#[derive(Debug, Clone, Default)]
pub struct HostPanel {
    /// The hosts.toml name, or `local` for this machine.
    pub name: String,
    /// What the target runs there, e.g. `Ray head, API`.
    pub role: String,
    /// This host serves the API: its samples carry /metrics and are the screen's own
    /// history (`LiveScreen::points`, with the benchmark's tok/s), shown first.
    pub charted: bool,
    /// The latest sample.
    pub latest: Option<Sample>,
    /// The charted history of a host that does not serve the API, oldest first (the API
    /// host's is `LiveScreen::points`).
    pub points: VecDeque<LivePoint>,
    /// Why this host's monitor failed or ended.
    pub error: Option<String>,
}

impl HostPanel {
    /// A panel for host `name` that has no sample yet.
    pub fn new(name: &str, role: &str, charted: bool) -> Self {
        HostPanel {
            name: name.into(),
            role: role.into(),
            charted,
            latest: None,
            points: VecDeque::new(),
            error: None,
        }
    }
}

impl Default for LiveScreen {
    fn default() -> Self {
        LiveScreen {
            origin: None,
            points: VecDeque::new(),
            latest: None,
            window: 3,
            frozen_at: None,
            error: None,
            page: 0,
            pages: std::cell::Cell::new(1),
            bench_pending: 0,
            bench_running: false,
            host: None,
            hosts: Vec::new(),
            shown: 0,
            target_watched: false,
        }
    }
}

impl LiveScreen {
    /// The samples come from another machine from now on (`None`: this one). The charts
    /// start over, so that no line joins two machines' readings.
    pub fn set_host(&mut self, host: Option<String>) {
        if self.host != host {
            self.host = host;
            self.points.clear();
            self.latest = None;
            self.origin = None;
            self.error = None;
        }
    }

    /// The running target spans these hosts from now on, one panel each (empty: back to the
    /// single-host view). The charts start over, as for [`LiveScreen::set_host`].
    pub fn set_hosts(&mut self, hosts: Vec<HostPanel>) {
        self.host = None;
        self.shown = hosts.iter().position(|h| h.charted).unwrap_or(0);
        self.hosts = hosts;
        self.points.clear();
        self.latest = None;
        self.origin = None;
        self.error = None;
    }

    /// A sample of the `i`th host's monitor arrived: the panel's latest, and a point of that
    /// host's history (the API host's is the screen's own). One of a panel set that is gone
    /// (a late sample of an earlier target) is dropped.
    pub fn push_host(&mut self, i: usize, s: Sample) {
        let Some(panel) = self.hosts.get_mut(i) else {
            return;
        };
        panel.error = None;
        if panel.charted {
            panel.latest = Some(s.clone());
            self.push(s);
        } else {
            // One time axis for every host, so `f` freezes them all at the same moment.
            let origin = *self.origin.get_or_insert(s.at);
            if panel.points.len() == HISTORY_POINTS {
                panel.points.pop_front();
            }
            panel.points.push_back(LivePoint::from_sample(&s, origin));
            panel.latest = Some(s);
        }
    }

    /// What the charts show: the history and latest sample of the host picked with `h`, or
    /// of the single host.
    fn view(&self) -> ChartView<'_> {
        match self.hosts.get(self.shown) {
            Some(h) if !h.charted => ChartView {
                points: &h.points,
                latest: h.latest.as_ref(),
                server: false,
            },
            _ => ChartView {
                points: &self.points,
                latest: self.latest.as_ref(),
                server: true,
            },
        }
    }

    /// The `i`th host's monitor failed (it has stopped: no samples follow).
    pub fn host_error(&mut self, i: usize, e: String) {
        if let Some(panel) = self.hosts.get_mut(i) {
            panel.error = Some(e);
        }
    }

    /// A sample arrived.
    pub fn push(&mut self, s: Sample) {
        let origin = *self.origin.get_or_insert(s.at);
        if self.points.len() == HISTORY_POINTS {
            self.points.pop_front();
        }
        let mut p = LivePoint::from_sample(&s, origin);
        if self.bench_running || self.bench_pending > 0 {
            let dt = self
                .latest
                .as_ref()
                .map(|l| (s.at - l.at).num_milliseconds() as f64 / 1000.0)
                .filter(|dt| *dt > 0.0);
            p.bench_tok_s = dt.map(|dt| self.bench_pending as f64 / dt);
            self.bench_pending = 0;
        }
        self.points.push_back(p);
        self.latest = Some(s);
    }

    /// The running benchmark received `tokens` more completion tokens.
    pub fn bench_tokens(&mut self, tokens: u64) {
        self.bench_running = true;
        self.bench_pending += tokens;
    }

    /// The benchmark ended: its series stops after the next sample.
    pub fn bench_ended(&mut self) {
        self.bench_running = false;
    }

    /// Whether a new sample changes what the screen shows.
    pub fn is_moving(&self) -> bool {
        self.frozen_at.is_none()
    }

    /// Seconds of history shown.
    pub fn window_s(&self) -> u32 {
        WINDOWS[self.window]
    }

    /// Handle a key on this screen.
    pub fn on_key(&mut self, key: KeyEvent) {
        match key.code {
            KeyCode::Char('+') | KeyCode::Char('=') | KeyCode::Right => {
                self.window = (self.window + 1).min(WINDOWS.len() - 1)
            }
            KeyCode::Char('-') | KeyCode::Left => self.window = self.window.saturating_sub(1),
            KeyCode::PageDown | KeyCode::Down | KeyCode::Char('j') => {
                self.page = (self.page + 1).min(self.pages.get().saturating_sub(1))
            }
            KeyCode::PageUp | KeyCode::Up | KeyCode::Char('k') => {
                self.page = self.page.saturating_sub(1)
            }
            KeyCode::Char('h') if self.hosts.len() > 1 => {
                self.shown = (self.shown + 1) % self.hosts.len();
                self.page = 0;
            }
            KeyCode::Char('f') | KeyCode::Char(' ') => {
                self.frozen_at = match self.frozen_at {
                    Some(_) => None,
                    None => Some(self.points.back().map(|p| p.t).unwrap_or(0.0)),
                }
            }
            _ => {}
        }
    }

    /// Throttle reasons of the latest sample that deserve attention.
    pub fn throttling(&self) -> Vec<String> {
        throttling(self.latest.as_ref())
    }
}

/// The history one set of charts is drawn from: one host's.
struct ChartView<'a> {
    points: &'a VecDeque<LivePoint>,
    latest: Option<&'a Sample>,
    /// The host serves the API, so the server's charts (tok/s, requests, KV cache, …) apply.
    server: bool,
}

impl ChartView<'_> {
    /// Whether the server exports a series (`exported` of its latest scrape), or did
    /// earlier in the history (`charted` of a point): a server without it gets no chart.
    fn server_has(
        &self,
        exported: fn(&ServerMetrics) -> bool,
        charted: fn(&LivePoint) -> bool,
    ) -> bool {
        matches!(
            self.latest.map(|s| &s.server),
            Some(ServerStatus::Scraped(m)) if exported(m)
        ) || self.points.iter().any(charted)
    }

    fn unified(&self) -> bool {
        matches!(
            self.latest.map(|s| &s.gpu),
            Some(GpuStatus::Available { gpus, .. })
                if gpus.first().is_some_and(|g| g.memory.source == MemorySource::Unified)
        )
    }
}

/// Throttle reasons of `latest`'s first GPU that deserve attention.
fn throttling(latest: Option<&Sample>) -> Vec<String> {
    match latest.map(|s| &s.gpu) {
        Some(GpuStatus::Available { gpus, .. }) => gpus
            .first()
            .and_then(|g| g.throttle_reasons.value().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter(|r| !BENIGN_THROTTLE.contains(&r.as_str()))
            .collect(),
        _ => Vec::new(),
    }
}

type Pick = fn(&LivePoint) -> Option<f64>;

/// One chart: title, unit, and its series (label, colour, field).
struct ChartSpec {
    title: String,
    unit: &'static str,
    series: Vec<(&'static str, Color, Pick)>,
    /// Fixed upper bound (percentages), else from the data.
    max: Option<f64>,
}

/// The charts of `s`: the server's only for the host that serves the API.
fn specs(s: &ChartView) -> Vec<ChartSpec> {
    let mem = if s.unified() {
        "GPU memory (unified, shared with CPU)"
    } else {
        "GPU memory"
    };
    let mut specs = Vec::new();
    if s.server {
        specs.push(ChartSpec {
            title: "tok/s".into(),
            unit: "tok/s",
            series: vec![
                ("gen", Color::Green, |p| p.gen_tok_s),
                ("prompt", Color::Cyan, |p| p.prompt_tok_s),
                ("bench", Color::Yellow, |p| p.bench_tok_s),
            ],
            max: None,
        });
    }
    if s.server && s.server_has(|m| m.tpot_ms.is_some(), |p| p.tpot_ms.is_some()) {
        specs.push(ChartSpec {
            title: "time per output token".into(),
            unit: "ms",
            series: vec![("tpot", Color::Magenta, |p| p.tpot_ms)],
            max: None,
        });
    }
    specs.extend([
        ChartSpec {
            title: mem.into(),
            unit: "GiB",
            series: vec![("used", Color::Magenta, |p| p.gpu_mem_gib)],
            max: None,
        },
        ChartSpec {
            title: "clocks".into(),
            unit: "MHz",
            series: vec![
                ("sm", Color::Yellow, |p| p.sm_mhz),
                ("mem", Color::Blue, |p| p.mem_mhz),
            ],
            max: None,
        },
        ChartSpec {
            title: "GPU utilisation".into(),
            unit: "%",
            series: vec![("util", Color::Green, |p| p.util_pct)],
            max: Some(100.0),
        },
        ChartSpec {
            title: "power".into(),
            unit: "W",
            series: vec![("power", Color::Red, |p| p.power_w)],
            max: None,
        },
        ChartSpec {
            title: "temperature".into(),
            unit: "C",
            series: vec![("temp", Color::Red, |p| p.temp_c)],
            max: None,
        },
        ChartSpec {
            title: "host".into(),
            unit: "%",
            series: vec![
                ("cpu", Color::Cyan, |p| p.cpu_pct),
                ("ram", Color::Magenta, |p| p.ram_pct),
            ],
            max: Some(100.0),
        },
    ]);
    if !s.server {
        return specs;
    }
    // Pre-emptions mean the KV cache is too small for the load: the count since the panel
    // started watching rides on the requests chart's title.
    let requests = match s.latest.map(|x| &x.server) {
        Some(ServerStatus::Scraped(m)) => m.preemptions.as_ref().and_then(Reading::get),
        _ => None,
    }
    .map_or("requests".to_string(), |n| {
        format!("requests · {n:.0} pre-empted")
    });
    specs.extend([
        ChartSpec {
            title: requests,
            unit: "",
            series: vec![
                ("running", Color::Green, |p| p.running),
                ("waiting", Color::Yellow, |p| p.waiting),
            ],
            max: None,
        },
        ChartSpec {
            title: "KV cache / spec acceptance".into(),
            unit: "%",
            series: vec![
                ("kv", Color::Blue, |p| p.kv_pct),
                ("accept", Color::Green, |p| p.spec_accept_pct),
            ],
            max: Some(100.0),
        },
    ]);
    if s.server_has(
        |m| m.prefix_cache_hit_rate.is_some(),
        |p| p.prefix_hit_pct.is_some(),
    ) {
        specs.push(ChartSpec {
            title: "prefix cache".into(),
            unit: "%",
            series: vec![("hits", Color::Cyan, |p| p.prefix_hit_pct)],
            max: Some(100.0),
        });
    }
    specs
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn draw_chart(frame: &mut Frame, theme: &Theme, s: &LiveScreen, spec: &ChartSpec, area: Rect) {
    let view = s.view();
    let end = s
        .frozen_at
        .or_else(|| view.points.back().map(|p| p.t))
        .unwrap_or(0.0);
    let start = end - f64::from(s.window_s());
    let data: Vec<Vec<(f64, f64)>> = spec
        .series
        .iter()
        .map(|(_, _, pick)| {
            view.points
                .iter()
                .filter(|p| p.t >= start && p.t <= end)
                .filter_map(|p| pick(p).map(|v| (p.t - end, v)))
                .collect()
        })
        .map(|d| decimate(d, f64::from(s.window_s()), area.width.saturating_sub(7)))
        .collect();
    let mut title = vec![Span::styled(
        format!(" {} ", theme.text(&spec.title)),
        theme.accent(),
    )];
    let mut any = false;
    for ((label, _, _), d) in spec.series.iter().zip(&data) {
        if let Some((_, v)) = d.last() {
            any = true;
            title.push(Span::raw(format!("{label} {} {} ", fmt_num(*v), spec.unit)));
        }
    }
    if !any {
        title.push(Span::styled("n/a ", theme.dim()));
    }
    let top = spec.max.unwrap_or_else(|| {
        let m = data
            .iter()
            .flatten()
            .map(|(_, v)| *v)
            .fold(0.0_f64, f64::max);
        if m <= 0.0 { 1.0 } else { m * 1.1 }
    });
    let marker = theme.marker();
    let datasets: Vec<Dataset> = spec
        .series
        .iter()
        .zip(&data)
        .map(|((_, color, _), d)| {
            Dataset::default()
                .marker(marker)
                .graph_type(GraphType::Line)
                .style(if theme.color {
                    Style::default().fg(*color)
                } else {
                    Style::default()
                })
                .data(d)
        })
        .collect();
    let w = f64::from(s.window_s());
    let chart = Chart::new(datasets)
        .block(
            Block::bordered()
                .border_set(theme.border())
                .title(Line::from(title)),
        )
        .x_axis(Axis::default().bounds([-w, 0.0]))
        .y_axis(if theme.ascii {
            // Axis labels come with a box-drawing axis line; the title carries the values.
            Axis::default().bounds([0.0, top])
        } else {
            Axis::default()
                .bounds([0.0, top])
                .labels([Span::raw("0"), Span::raw(fmt_num(top))])
        });
    frame.render_widget(chart, area);
}

/// At most a minimum and a maximum per braille column (two per cell): a 30-minute window
/// has far more samples than a chart has columns, and drawing them all is wasted time.
/// Keeping both extremes keeps spikes visible.
fn decimate(d: Vec<(f64, f64)>, window_s: f64, cells: u16) -> Vec<(f64, f64)> {
    let buckets = usize::from(cells.max(1)) * 2;
    if d.len() <= buckets * 2 {
        return d;
    }
    let mut out = Vec::with_capacity(buckets * 2);
    let mut i = 0;
    for b in 0..buckets {
        let edge = -window_s + window_s * (b + 1) as f64 / buckets as f64;
        let mut lo: Option<(f64, f64)> = None;
        let mut hi: Option<(f64, f64)> = None;
        while i < d.len() && (d[i].0 <= edge || b == buckets - 1) {
            let p = d[i];
            if lo.is_none_or(|l| p.1 < l.1) {
                lo = Some(p);
            }
            if hi.is_none_or(|h| p.1 > h.1) {
                hi = Some(p);
            }
            i += 1;
        }
        match (lo, hi) {
            (Some(l), Some(h)) if l.0 <= h.0 => out.extend([l, h]),
            (Some(l), Some(h)) => out.extend([h, l]),
            _ => {}
        }
    }
    out
}

fn window_label(s: u32) -> String {
    if s < 60 {
        format!("{s} s")
    } else {
        format!("{} min", s / 60)
    }
}

/// The Live screen's head: window, chart page, freeze, GPU; then monitor error, throttling
/// or the server watched.
fn head_lines(app: &App, page: usize, pages: usize) -> Vec<Line<'static>> {
    let s = &app.live;
    let theme = &app.theme;
    let throttling = s.throttling();
    let mut l1 = vec![
        Span::styled(" window ", theme.dim()),
        Span::styled(window_label(s.window_s()), theme.accent()),
    ];
    if let Some(h) = &s.host {
        l1.push(Span::styled("  host ", theme.dim()));
        l1.push(Span::styled(h.clone(), theme.accent()));
    }
    if let Some(c) = s.hosts.get(s.shown) {
        l1.push(Span::styled("  charts of host ", theme.dim()));
        l1.push(Span::styled(c.name.clone(), theme.accent()));
        l1.push(Span::styled(format!(" ({})", c.role), theme.dim()));
    }
    if pages > 1 {
        l1.push(Span::styled(
            format!("  charts {}/{}", page + 1, pages),
            theme.accent(),
        ));
    }
    if s.frozen_at.is_some() {
        l1.push(Span::styled(
            "  FROZEN (f resumes; collection continues)",
            theme.warn(),
        ));
    }
    match s.latest.as_ref().map(|x| &x.gpu) {
        // The panels show each host's GPU.
        _ if !s.hosts.is_empty() => {}
        Some(GpuStatus::Available { gpus, .. }) => {
            if let Some(g) = gpus.first() {
                l1.push(Span::raw(format!("  {}", g.name.show(|n| n.clone()))));
                let used = g
                    .memory
                    .used_bytes
                    .show(|b| format!("{:.1}", *b as f64 / GIB));
                let total = g
                    .memory
                    .total_bytes
                    .show(|b| format!("{:.1}", *b as f64 / GIB));
                let src = if g.memory.source == MemorySource::Unified {
                    " unified"
                } else {
                    ""
                };
                l1.push(Span::raw(format!("  mem {used}/{total} GiB{src}")));
                l1.push(Span::raw(format!("  {}", g.pstate.show(|p| p.clone()))));
            }
        }
        Some(GpuStatus::Unavailable { reason }) => {
            l1.push(Span::styled(
                format!("  GPU: {}", theme.text(reason)),
                theme.dim(),
            ));
        }
        None => l1.push(Span::styled("  waiting for the first sample", theme.dim())),
    }
    let l2 = if let Some(e) = &s.error {
        Line::styled(format!(" monitor: {}", theme.text(e)), theme.error())
    } else if !throttling.is_empty() {
        Line::styled(
            format!(" THROTTLING: {}", throttling.join(", ")),
            theme.error(),
        )
    } else {
        let server = match s.latest.as_ref().map(|x| &x.server) {
            Some(ServerStatus::Scraped(m)) => format!("server {}", m.url),
            Some(ServerStatus::NoMetrics { url }) => format!("server {url}: no /metrics"),
            Some(ServerStatus::Failed { error }) => format!("server: {error}"),
            _ => "no server watched (launch a target)".into(),
        };
        Line::styled(
            format!(" no throttling   {}", theme.text(&server)),
            theme.dim(),
        )
    };
    vec![Line::from(l1), l2]
}

/// `n GiB` with one decimal.
fn gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / GIB)
}

/// The lines of one host's panel: GPU, memory and headroom, clocks, power, temperature,
/// throttling and the host's CPU and RAM; or why its monitor failed and what to do.
fn host_lines(theme: &Theme, h: &HostPanel) -> Vec<Line<'static>> {
    if let Some(e) = &h.error {
        return vec![Line::styled(
            format!(
                "monitor of host {} failed: {}",
                h.name,
                theme.text(e.trim_end_matches('.'))
            ),
            theme.error(),
        )];
    }
    let Some(sample) = &h.latest else {
        return vec![Line::styled("waiting for the first sample", theme.dim())];
    };
    let mut out = Vec::new();
    let host = &sample.host;
    let ram_free = host.ram_total_bytes.saturating_sub(host.ram_used_bytes);
    match &sample.gpu {
        GpuStatus::Available { gpus, .. } if !gpus.is_empty() => {
            let g = &gpus[0];
            out.push(Line::raw(format!(
                "{}  {}",
                g.name.show(|n| n.clone()),
                g.pstate.show(|p| p.clone())
            )));
            let unified = g.memory.source == MemorySource::Unified;
            let headroom = match (g.memory.used_bytes.get(), g.memory.total_bytes.get()) {
                (Some(u), Some(t)) => format!("  headroom {} GiB", gib(t.saturating_sub(u))),
                _ => String::new(),
            };
            out.push(Line::raw(format!(
                "mem {}/{} GiB{}{headroom}",
                g.memory.used_bytes.show(|b| gib(*b)),
                g.memory.total_bytes.show(|b| gib(*b)),
                if unified { " unified" } else { "" },
            )));
            out.push(Line::raw(format!(
                "clocks sm {} MHz  mem {} MHz",
                g.clocks.sm_mhz.show(|v| v.to_string()),
                g.clocks.mem_mhz.show(|v| v.to_string())
            )));
            out.push(Line::raw(format!(
                "power {} W  temp {} C  util {} %",
                g.power_w.show(|v| fmt_num(*v)),
                g.temperature_c.show(|v| v.to_string()),
                g.utilization_gpu_pct.show(|v| v.to_string())
            )));
            let t = throttling(Some(sample));
            out.push(if t.is_empty() {
                Line::styled("no throttling", theme.dim())
            } else {
                Line::styled(format!("THROTTLING: {}", t.join(", ")), theme.error())
            });
        }
        GpuStatus::Available { .. } => {
            out.push(Line::styled("GPU: NVML lists no GPU", theme.dim()));
        }
        GpuStatus::Unavailable { reason } => {
            out.push(Line::styled(
                format!("GPU: {}", theme.text(reason)),
                theme.dim(),
            ));
        }
    }
    out.push(Line::raw(format!(
        "host cpu {} %  ram {}/{} GiB, {} free",
        host.cpu_pct.show(|v| format!("{v:.0}")),
        gib(host.ram_used_bytes),
        gib(host.ram_total_bytes),
        gib(ram_free)
    )));
    out
}

/// Rows of the host panels' strip (borders included): six lines of readings.
const HOST_PANEL_ROWS: u16 = 8;

/// One panel per host, side by side.
fn draw_hosts(frame: &mut Frame, app: &App, area: Rect) {
    let theme = &app.theme;
    let hosts = &app.live.hosts;
    let cells =
        Layout::horizontal(vec![Constraint::Ratio(1, hosts.len() as u32); hosts.len()]).split(area);
    for (h, cell) in hosts.iter().zip(cells.iter()) {
        let title = Line::from(vec![
            Span::styled(format!(" host {} ", theme.text(&h.name)), theme.accent()),
            Span::styled(format!("({}) ", h.role), theme.dim()),
        ]);
        frame.render_widget(
            Paragraph::new(host_lines(theme, h))
                .wrap(Wrap { trim: false })
                .block(Block::bordered().border_set(theme.border()).title(title)),
            *cell,
        );
    }
}

/// Chart grid of the Live screen in `grid`: columns, rows, charts per page, pages.
fn paging(app: &App, grid: Rect) -> (u16, u16, usize, usize) {
    let cols: u16 = if grid.width >= 150 { 3 } else { 2 };
    let rows: u16 = (grid.height / 7).clamp(1, 3);
    let per_page = usize::from(cols * rows);
    let pages = specs(&app.live.view()).len().div_ceil(per_page);
    (cols, rows, per_page, pages)
}

/// Rows the Live head may take when its lines wrap.
const MAX_HEAD_ROWS: u16 = 4;

/// Draw the Live screen.
pub fn draw(frame: &mut Frame, app: &App, area: Rect) {
    let s = &app.live;
    let theme = &app.theme;
    let panels_h = if s.hosts.is_empty() {
        0
    } else {
        HOST_PANEL_ROWS
    };
    let layout = |h: u16| {
        let [head, panels, grid] = Layout::vertical([
            Constraint::Length(h),
            Constraint::Length(panels_h),
            Constraint::Min(4),
        ])
        .areas::<3>(area);
        [head, panels, grid]
    };
    // The head wraps at the edge instead of being cut: size it for its text, then the grid
    // (and so the page count the head names) from what is left.
    let [_, _, first_grid] = layout(2);
    let (_, _, _, first_pages) = paging(app, first_grid);
    let first_page = s.page.min(first_pages - 1);
    let head_h = (Paragraph::new(head_lines(app, first_page, first_pages))
        .wrap(Wrap { trim: false })
        .line_count(area.width) as u16)
        .clamp(2, MAX_HEAD_ROWS);
    let [head, panels, grid] = layout(head_h);
    if !s.hosts.is_empty() {
        draw_hosts(frame, app, panels);
    }
    let (cols, rows, per_page, pages) = paging(app, grid);
    let specs = specs(&s.view());
    s.pages.set(pages);
    let page = s.page.min(pages - 1);
    frame.render_widget(
        Paragraph::new(head_lines(app, page, pages)).wrap(Wrap { trim: false }),
        head,
    );

    let row_areas =
        Layout::vertical(vec![Constraint::Ratio(1, u32::from(rows)); rows as usize]).split(grid);
    let mut i = page * per_page;
    for r in row_areas.iter() {
        let cells = Layout::horizontal(vec![Constraint::Ratio(1, u32::from(cols)); cols as usize])
            .split(*r);
        for c in cells.iter() {
            if let Some(spec) = specs.get(i) {
                draw_chart(frame, theme, s, spec, *c);
            }
            i += 1;
        }
    }
}
