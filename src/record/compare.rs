//! Comparing runs: a delta table per metric against the first run, with a noise hint, as
//! plain text or as markdown in the shape of the operators' BENCHMARK_RESULTS.md tables.

use super::schema::{LatencyStats, PointResult, RunRecord, Stats, WorkloadPoint};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// Output format of `runs compare`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned text for the terminal.
    Text,
    /// Markdown tables ready to paste into BENCHMARK_RESULTS.md.
    Md,
}

/// A value with its spread: mean and (when known) standard deviation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Value {
    /// Mean.
    pub mean: f64,
    /// Standard deviation, when the metric has one.
    pub std: Option<f64>,
}

/// The noise threshold unless one is given: a change smaller than this many standard
/// deviations is within noise (`runs compare --noise`, `ab --noise`, `n` in the panel).
pub const DEFAULT_NOISE_SIGMAS: f64 = 2.0;

/// The largest noise threshold taken: beyond it every change would read as noise.
pub const MAX_NOISE_SIGMAS: f64 = 10.0;

/// Reads a noise threshold (a number of standard deviations above 0, at most 10); the
/// error says what was wrong and what to give instead.
pub fn parse_noise_sigmas(s: &str) -> Result<f64, String> {
    let t = s.trim();
    match t.parse::<f64>() {
        Ok(k) if k.is_finite() && k > 0.0 && k <= MAX_NOISE_SIGMAS => Ok(k),
        _ => Err(format!(
            "noise threshold `{t}`: give a number of standard deviations above 0 and at most \
             {MAX_NOISE_SIGMAS}, e.g. 2 (a change smaller than that many std is within noise)"
        )),
    }
}

/// A noise threshold as the tables write it: `2·std`, `1.5·std` (the shortest form that
/// reads back the same).
pub fn sigmas_text(k: f64) -> String {
    format!("{k}·std")
}

/// What a change is, next to the noise of the figures it compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Noise {
    /// Smaller than the threshold times the spread: may be noise.
    Within,
    /// At least the threshold times the spread.
    Beyond,
    /// No spread is known (a percentile, a single round): nothing can be said.
    Unknown,
}

impl Noise {
    /// The hint for a change of `diff` where the figures spread by `spread` (one standard
    /// deviation), at a threshold of `sigmas` standard deviations. No change at all is
    /// within noise even with no spread.
    pub fn of(diff: f64, spread: Option<f64>, sigmas: f64) -> Noise {
        match spread {
            _ if diff == 0.0 => Noise::Within,
            Some(s) if diff.abs() < sigmas * s => Noise::Within,
            Some(_) => Noise::Beyond,
            None => Noise::Unknown,
        }
    }

    /// The hint as the tables print it.
    pub fn text(self) -> &'static str {
        match self {
            Noise::Within => "within noise",
            Noise::Beyond => "beyond noise",
            Noise::Unknown => "noise unknown",
        }
    }
}

/// The change of one run's value against the baseline's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Delta {
    /// Percent change of the mean; `None` when the baseline is 0.
    pub pct: Option<f64>,
    /// |Δmean| against the threshold times the larger std of the two.
    pub noise: Noise,
}

/// Change of `v` against baseline `base`, with the noise hint at `sigmas` standard deviations.
pub fn delta(base: Value, v: Value, sigmas: f64) -> Delta {
    let diff = v.mean - base.mean;
    let pct = (base.mean != 0.0).then(|| diff / base.mean.abs() * 100.0);
    let spread = match (base.std, v.std) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (Some(a), None) | (None, Some(a)) => Some(a),
        (None, None) => None,
    };
    Delta {
        pct,
        noise: Noise::of(diff, spread, sigmas),
    }
}

/// Which way is better for a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Better {
    Higher,
    Lower,
}

struct MetricDef {
    name: &'static str,
    better: Better,
    get: fn(&PointResult) -> Option<Value>,
}

fn stats(s: &Option<Stats>) -> Option<Value> {
    s.map(|s| Value {
        mean: s.mean,
        std: Some(s.std),
    })
}

fn lat_mean(s: &Option<LatencyStats>) -> Option<Value> {
    s.map(|s| Value {
        mean: s.mean,
        std: Some(s.std),
    })
}

fn lat_pct(s: &Option<LatencyStats>, f: fn(&LatencyStats) -> f64) -> Option<Value> {
    s.as_ref().map(|s| Value {
        mean: f(s),
        std: None,
    })
}

const METRICS: &[MetricDef] = &[
    MetricDef {
        name: "pp t/s",
        better: Better::Higher,
        get: |p| stats(&p.pp_tps),
    },
    MetricDef {
        name: "tg t/s",
        better: Better::Higher,
        get: |p| stats(&p.tg_tps),
    },
    MetricDef {
        name: "total tg t/s",
        better: Better::Higher,
        get: |p| stats(&p.total_tg_tps),
    },
    MetricDef {
        name: "TTFT mean ms",
        better: Better::Lower,
        get: |p| lat_mean(&p.latency.ttft_ms),
    },
    MetricDef {
        name: "TTFT p99 ms",
        better: Better::Lower,
        get: |p| lat_pct(&p.latency.ttft_ms, |s| s.p99),
    },
    MetricDef {
        name: "TPOT mean ms",
        better: Better::Lower,
        get: |p| lat_mean(&p.latency.tpot_ms),
    },
    MetricDef {
        name: "TPOT p99 ms",
        better: Better::Lower,
        get: |p| lat_pct(&p.latency.tpot_ms, |s| s.p99),
    },
    MetricDef {
        name: "ITL mean ms",
        better: Better::Lower,
        get: |p| lat_mean(&p.latency.itl_ms),
    },
    MetricDef {
        name: "ITL p99 ms",
        better: Better::Lower,
        get: |p| lat_pct(&p.latency.itl_ms, |s| s.p99),
    },
    MetricDef {
        name: "E2EL mean ms",
        better: Better::Lower,
        get: |p| lat_mean(&p.latency.e2el_ms),
    },
    MetricDef {
        name: "E2EL p99 ms",
        better: Better::Lower,
        get: |p| lat_pct(&p.latency.e2el_ms, |s| s.p99),
    },
];

fn point_result<'a>(r: &'a RunRecord, p: &WorkloadPoint) -> Option<&'a PointResult> {
    r.results.iter().find(|x| &x.point == p)
}

fn all_points(runs: &[RunRecord]) -> Vec<WorkloadPoint> {
    let set: BTreeSet<WorkloadPoint> = runs
        .iter()
        .flat_map(|r| r.results.iter().map(|p| p.point))
        .collect();
    set.into_iter().collect()
}

/// Table names for runs: the preset (or target kind), with the short id added where two
/// runs would otherwise share a name.
pub fn run_names(runs: &[RunRecord]) -> Vec<String> {
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for r in runs {
        *count.entry(r.label()).or_default() += 1;
    }
    runs.iter()
        .map(|r| {
            let l = r.label();
            if count[&l] > 1 {
                format!("{l} ({})", r.identity.run_id.short())
            } else {
                l
            }
        })
        .collect()
}

/// Two decimals, as in the operators' tables.
fn fmt_num(x: f64) -> String {
    format!("{x:.2}")
}

fn fmt_value(v: Value) -> String {
    match v.std {
        Some(s) => format!("{} ± {}", fmt_num(v.mean), fmt_num(s)),
        None => fmt_num(v.mean),
    }
}

fn fmt_delta(d: Delta) -> String {
    let pct = match d.pct {
        Some(p) => format!("{p:+.1}%"),
        None => "n/a".to_string(),
    };
    format!("{pct} ({})", d.noise.text())
}

/// Lines of flag/target settings that differ between the runs: key, then one value per run.
fn setting_differences(runs: &[RunRecord]) -> Vec<(String, Vec<String>)> {
    let flat: Vec<BTreeMap<String, String>> = runs.iter().map(settings_of).collect();
    let keys: BTreeSet<&String> = flat.iter().flat_map(|m| m.keys()).collect();
    keys.into_iter()
        .filter_map(|k| {
            let vals: Vec<String> = flat
                .iter()
                .map(|m| m.get(k).cloned().unwrap_or_else(|| "-".to_string()))
                .collect();
            vals.iter()
                .any(|v| v != &vals[0])
                .then(|| (k.clone(), vals))
        })
        .collect()
}

fn settings_of(r: &RunRecord) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    flatten("flags", &r.target.flags, &mut out);
    if let Some(m) = &r.target.model {
        out.insert("model".into(), m.clone());
    }
    if let Some(w) = r.target.weights {
        out.insert("weights".into(), format!("{w:?}").to_lowercase());
    }
    if let Some(d) = &r.target.docker {
        out.insert("image".into(), d.image.clone());
    }
    if let Some(l) = &r.target.launch {
        for (k, v) in &l.env {
            out.insert(format!("env.{k}"), v.clone());
        }
    }
    out
}

fn flatten(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    match v {
        serde_json::Value::Null => {}
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                flatten(&format!("{prefix}.{k}"), x, out);
            }
        }
        serde_json::Value::String(s) => {
            out.insert(prefix.to_string(), s.clone());
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

fn warnings(runs: &[RunRecord], names: &[String]) -> Vec<String> {
    let mut w = Vec::new();
    for (r, n) in runs.iter().zip(names) {
        if r.identity.status != super::schema::RunStatus::Completed {
            w.push(format!(
                "{n} is {}{}: its figures may be partial",
                r.identity.status.as_str(),
                r.identity
                    .reason
                    .as_deref()
                    .map(|x| format!(" ({x})"))
                    .unwrap_or_default()
            ));
        }
    }
    let hosts: BTreeSet<Option<&str>> = runs
        .iter()
        .map(|r| r.environment.host.hostname.as_deref())
        .collect();
    if hosts.len() > 1 {
        w.push("runs come from different hosts: compare with care".to_string());
    }
    let gpus: BTreeSet<Vec<Option<&str>>> = runs
        .iter()
        .map(|r| {
            r.environment
                .gpus
                .iter()
                .map(|g| g.name.as_deref())
                .collect()
        })
        .collect();
    if gpus.len() > 1 {
        w.push("runs used different GPUs: compare with care".to_string());
    }
    w
}

/// Render the comparison of `runs` (at least two; the first is the baseline), every delta
/// with its noise hint at a threshold of `sigmas` standard deviations.
pub fn render(runs: &[RunRecord], format: Format, sigmas: f64) -> String {
    match format {
        Format::Text => render_text(runs, sigmas),
        Format::Md => render_md(runs, sigmas),
    }
}

fn render_text(runs: &[RunRecord], sigmas: f64) -> String {
    let names = run_names(runs);
    let letters: Vec<String> = (0..runs.len()).map(column_letter).collect();
    let mut out = String::new();
    let legend: Vec<Vec<String>> = runs
        .iter()
        .zip(&names)
        .zip(&letters)
        .map(|((r, n), l)| {
            vec![
                l.clone(),
                r.identity.run_id.to_string(),
                n.clone(),
                r.identity.started_at.format("%Y-%m-%d %H:%M").to_string(),
                r.identity.status.as_str().to_string(),
                if l == "A" {
                    "(baseline)".into()
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    out.push_str(&align(&legend));
    let diffs = setting_differences(runs);
    if !diffs.is_empty() {
        out.push_str("\nsettings that differ:\n");
        let mut rows = vec![header_row("setting", &letters)];
        rows.extend(diffs.into_iter().map(|(k, vals)| {
            let mut row = vec![k];
            row.extend(vals);
            row
        }));
        out.push_str(&align(&rows));
    }
    for w in warnings(runs, &names) {
        let _ = writeln!(out, "warning: {w}");
    }

    let mut header = vec!["point".to_string(), "metric".to_string()];
    for (i, l) in letters.iter().enumerate() {
        header.push(l.clone());
        if i > 0 {
            header.push(format!("Δ {l}"));
        }
    }
    let mut rows = vec![header];
    for p in all_points(runs) {
        let mut first = true;
        for m in METRICS {
            let vals: Vec<Option<Value>> = runs
                .iter()
                .map(|r| point_result(r, &p).and_then(|x| (m.get)(x)))
                .collect();
            if vals.iter().all(Option::is_none) {
                continue;
            }
            let mut row = vec![
                if first { p.label() } else { String::new() },
                metric_name(m),
            ];
            first = false;
            for (i, v) in vals.iter().enumerate() {
                row.push(v.map(fmt_value).unwrap_or_else(|| "-".into()));
                if i > 0 {
                    row.push(match (vals[0], *v) {
                        (Some(b), Some(x)) => fmt_delta(delta(b, x, sigmas)),
                        _ => "-".into(),
                    });
                }
            }
            rows.push(row);
        }
        // Failed requests, as counts with absolute differences.
        let errors: Vec<Option<u32>> = runs
            .iter()
            .map(|r| point_result(r, &p).map(|x| x.errors))
            .collect();
        let mut row = vec![
            if first { p.label() } else { String::new() },
            "errors ↓".to_string(),
        ];
        for (i, e) in errors.iter().enumerate() {
            row.push(e.map(|e| e.to_string()).unwrap_or_else(|| "-".into()));
            if i > 0 {
                row.push(match (errors[0], *e) {
                    (Some(b), Some(x)) => format!("{:+}", i64::from(x) - i64::from(b)),
                    _ => "-".into(),
                });
            }
        }
        rows.push(row);
    }
    out.push('\n');
    if rows.len() == 1 {
        out.push_str("no results to compare (none of the runs has measured points)\n");
    } else {
        out.push_str(&align(&rows));
        let _ = writeln!(
            out,
            "\nΔ is against A; higher is better for t/s, lower for ms and errors; \
             \"within noise\" means |Δmean| < {} of the noisier run; \
             \"noise unknown\": the figure has no std (p99).",
            sigmas_text(sigmas)
        );
    }
    out
}

fn metric_name(m: &MetricDef) -> String {
    let arrow = match m.better {
        Better::Higher => "↑",
        Better::Lower => "↓",
    };
    format!("{} {arrow}", m.name)
}

fn header_row(first: &str, letters: &[String]) -> Vec<String> {
    let mut h = vec![first.to_string()];
    h.extend(letters.iter().cloned());
    h
}

fn column_letter(i: usize) -> String {
    let mut s = String::new();
    let mut n = i;
    loop {
        s.insert(0, (b'A' + (n % 26) as u8) as char);
        if n < 26 {
            break;
        }
        n = n / 26 - 1;
    }
    s
}

/// Left-align columns with two spaces between them.
pub(crate) fn align(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            line.push_str(cell);
            if c + 1 < r.len() {
                let pad = widths[c] - cell.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A throughput column of the markdown table.
#[derive(Debug, Clone, PartialEq)]
enum MdCol {
    /// Prefill at (pp, depth, concurrency): one column however many tg lengths ran with it.
    Pp(u32, u32, u32),
    /// Decode at one point.
    Tg(WorkloadPoint),
}

fn point_suffix(depth: u32, concurrency: u32) -> String {
    let mut s = String::new();
    if depth > 0 {
        s.push_str(&format!(" @ d{depth}"));
    }
    if concurrency > 1 {
        s.push_str(&format!(" c{concurrency}"));
    }
    s
}

/// Columns `pp2048 (tok/s)`, `tg32 (tok/s)`, `tg128 @ d4096 (tok/s)`; a decode column
/// names its prompt length only when two prompt lengths share it (`tg32 after pp512`).
fn md_columns(points: &[WorkloadPoint]) -> Vec<(MdCol, String)> {
    let mut cols: Vec<(MdCol, String)> = Vec::new();
    for p in points {
        let pp = MdCol::Pp(p.pp, p.depth, p.concurrency);
        if !cols.iter().any(|c| c.0 == pp) {
            let name = format!("pp{}{} (tok/s)", p.pp, point_suffix(p.depth, p.concurrency));
            cols.push((pp, name));
        }
    }
    for p in points {
        let shared = points.iter().any(|q| {
            q.tg == p.tg && q.depth == p.depth && q.concurrency == p.concurrency && q.pp != p.pp
        });
        let after = if shared {
            format!(" after pp{}", p.pp)
        } else {
            String::new()
        };
        let name = format!(
            "tg{}{after}{} (tok/s)",
            p.tg,
            point_suffix(p.depth, p.concurrency)
        );
        cols.push((MdCol::Tg(*p), name));
    }
    cols
}

fn md_value(r: &RunRecord, col: &MdCol) -> Option<Value> {
    match col {
        MdCol::Pp(pp, depth, conc) => {
            let mut same: Vec<&PointResult> = r
                .results
                .iter()
                .filter(|x| {
                    x.point.pp == *pp && x.point.depth == *depth && x.point.concurrency == *conc
                })
                .collect();
            same.sort_by_key(|x| x.point.tg);
            same.iter().find_map(|x| stats(&x.pp_tps))
        }
        MdCol::Tg(p) => point_result(r, p).and_then(|x| stats(&x.tg_tps)),
    }
}

fn md_table(rows: &[Vec<String>]) -> String {
    let mut out = String::new();
    for (i, r) in rows.iter().enumerate() {
        let _ = writeln!(out, "| {} |", r.join(" | "));
        if i == 0 {
            let seps: Vec<String> = r
                .iter()
                .map(|h| "-".repeat(h.chars().count().max(3)))
                .collect();
            let _ = writeln!(
                out,
                "|{}|",
                seps.iter()
                    .map(|s| format!("-{s}-"))
                    .collect::<Vec<_>>()
                    .join("|")
            );
        }
    }
    out
}

fn render_md(runs: &[RunRecord], sigmas: f64) -> String {
    let names = run_names(runs);
    let points = all_points(runs);
    let mut cols = md_columns(&points);
    // Columns with no value in any run are dropped (e.g. pp of a tg-only point).
    cols.retain(|(c, _)| runs.iter().any(|r| md_value(r, c).is_some()));
    let decode_col = cols.iter().position(|c| matches!(c.0, MdCol::Tg(_)));

    let mut out = String::new();
    let mut header = vec!["Config".to_string()];
    header.extend(cols.iter().map(|c| c.1.clone()));
    if decode_col.is_some() {
        header.push("Decode Δ".to_string());
    }
    let mut rows = vec![header];
    // The best mean per column is bolded, as the operators' tables do, when runs compete.
    let best: Vec<Option<f64>> = cols
        .iter()
        .map(|(c, _)| {
            let vals: Vec<f64> = runs
                .iter()
                .filter_map(|r| md_value(r, c).map(|v| v.mean))
                .collect();
            (vals.len() > 1).then(|| vals.into_iter().fold(f64::NEG_INFINITY, f64::max))
        })
        .collect();
    for (i, (r, n)) in runs.iter().zip(&names).enumerate() {
        let mut row = vec![n.clone()];
        for ((c, _), b) in cols.iter().zip(&best) {
            row.push(match md_value(r, c) {
                Some(v) if Some(v.mean) == *b => format!("**{}**", fmt_value(v)),
                Some(v) => fmt_value(v),
                None => "-".to_string(),
            });
        }
        if let Some(d) = decode_col {
            let col = &cols[d].0;
            row.push(if i == 0 {
                "baseline".to_string()
            } else {
                match (md_value(&runs[0], col), md_value(r, col)) {
                    (Some(b), Some(v)) => fmt_delta(delta(b, v, sigmas)),
                    _ => "-".to_string(),
                }
            });
        }
        rows.push(row);
    }
    if cols.is_empty() {
        out.push_str("_No throughput results in these runs._\n");
    } else {
        out.push_str(&md_table(&rows));
    }

    let mut lat_rows = vec![
        [
            "Config",
            "Test",
            "TTFT p50 (ms)",
            "TTFT p99 (ms)",
            "TPOT p50 (ms)",
            "ITL p50 (ms)",
            "E2EL p50 (ms)",
        ]
        .map(String::from)
        .to_vec(),
    ];
    let cell = |s: &Option<LatencyStats>, f: fn(&LatencyStats) -> f64| {
        s.as_ref()
            .map(|s| fmt_num(f(s)))
            .unwrap_or_else(|| "-".into())
    };
    for (r, n) in runs.iter().zip(&names) {
        for p in &points {
            let Some(x) = point_result(r, p) else {
                continue;
            };
            let l = &x.latency;
            if l.ttft_ms.is_none()
                && l.tpot_ms.is_none()
                && l.itl_ms.is_none()
                && l.e2el_ms.is_none()
            {
                continue;
            }
            lat_rows.push(vec![
                n.clone(),
                p.label(),
                cell(&l.ttft_ms, |s| s.p50),
                cell(&l.ttft_ms, |s| s.p99),
                cell(&l.tpot_ms, |s| s.p50),
                cell(&l.itl_ms, |s| s.p50),
                cell(&l.e2el_ms, |s| s.p50),
            ]);
        }
    }
    if lat_rows.len() > 1 {
        out.push('\n');
        out.push_str(&md_table(&lat_rows));
    }
    let legend: Vec<String> = runs
        .iter()
        .zip(&names)
        .map(|(r, n)| {
            format!(
                "{n} = `{}` ({})",
                r.identity.run_id,
                r.identity.started_at.format("%Y-%m-%d")
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "\nmean ± std; Decode Δ against {}; \"within noise\": |Δmean| < {}. Runs: {}.",
        names.first().map(String::as_str).unwrap_or("-"),
        sigmas_text(sigmas),
        legend.join(", ")
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(mean: f64, std: Option<f64>) -> Value {
        Value { mean, std }
    }

    #[test]
    fn delta_percent_and_noise_hint() {
        let d = delta(v(100.0, Some(1.0)), v(101.5, Some(0.5)), 2.0);
        assert!((d.pct.unwrap() - 1.5).abs() < 1e-12);
        assert_eq!(d.noise, Noise::Within, "1.5 < 2 * max(1.0, 0.5)");
        let d = delta(v(100.0, Some(1.0)), v(97.0, Some(0.5)), 2.0);
        assert_eq!(d.noise, Noise::Beyond);
        assert!((d.pct.unwrap() + 3.0).abs() < 1e-12);
        assert_eq!(
            delta(v(10.0, None), v(10.1, None), 2.0).noise,
            Noise::Unknown,
            "no std: nothing to say"
        );
        assert_eq!(delta(v(5.0, None), v(5.0, None), 2.0).noise, Noise::Within);
        assert_eq!(delta(v(0.0, None), v(1.0, None), 2.0).pct, None);
    }

    #[test]
    fn the_noise_threshold_moves_the_hint() {
        // A change of 3 with a std of 1: beyond 2·std, within 4·std.
        let (a, b) = (v(100.0, Some(1.0)), v(103.0, Some(1.0)));
        assert_eq!(delta(a, b, 2.0).noise, Noise::Beyond);
        assert_eq!(delta(a, b, 4.0).noise, Noise::Within);
        assert_eq!(fmt_delta(delta(a, b, 2.0)), "+3.0% (beyond noise)");
        assert_eq!(fmt_delta(delta(a, b, 4.0)), "+3.0% (within noise)");
        assert_eq!(sigmas_text(2.0), "2·std");
        assert_eq!(sigmas_text(1.5), "1.5·std");
    }

    #[test]
    fn noise_thresholds_are_checked() {
        assert_eq!(parse_noise_sigmas(" 1.5 "), Ok(1.5));
        assert_eq!(parse_noise_sigmas("10"), Ok(10.0));
        for bad in ["0", "-1", "abc", "", "NaN", "inf", "11"] {
            let e = parse_noise_sigmas(bad).unwrap_err();
            assert!(e.contains("standard deviations"), "{bad}: {e}");
            assert!(e.contains(&format!("`{}`", bad.trim())), "{bad}: {e}");
        }
    }

    #[test]
    fn column_letters() {
        let l: Vec<String> = [0, 1, 25, 26, 27].into_iter().map(column_letter).collect();
        assert_eq!(l, ["A", "B", "Z", "AA", "AB"]);
    }
}
