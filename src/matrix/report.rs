//! The matrix report: a markdown page in the operators' BENCHMARK_RESULTS.md shape (one
//! preset × metric table with deltas against the baseline preset, verdicts per level,
//! throttle and heat warnings) and SVG charts next to it.

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::plan::TestLevel;
use super::state::{MatrixState, PresetStatus};
use crate::record::schema::{PointResult, RunRecord, Stats};

/// File name of the markdown report in the output directory.
pub const REPORT_FILE: &str = "report.md";
/// File name of the machine-readable summary in the output directory.
pub const SUMMARY_FILE: &str = "matrix-summary.json";

/// The matrix summary record: per preset its record, verdicts and headline figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatrixSummary {
    /// `mxtune.matrix-summary`.
    pub format: String,
    /// Matrix id.
    pub matrix_id: String,
    /// Every preset finished.
    pub complete: bool,
    /// Shuffle seed (none: given order).
    pub seed: Option<u64>,
    /// Presets in run order.
    pub order: Vec<String>,
    /// The baseline preset of the deltas.
    pub baseline: Option<String>,
    /// One entry per preset, in run order.
    pub presets: Vec<SummaryEntry>,
    /// Chart files written, relative to the output directory.
    pub charts: Vec<String>,
}

/// One preset in the summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryEntry {
    /// Preset.
    pub preset: String,
    /// Status.
    pub status: PresetStatus,
    /// Run id of its record.
    pub run_id: Option<String>,
    /// Level verdicts, `level → verdict`.
    pub levels: Vec<(String, String)>,
    /// Performance INVALID.
    pub invalid: bool,
    /// Mean decode t/s over the grid's points.
    pub tg_tps_mean: Option<f64>,
    /// Mean prefill t/s over the grid's points.
    pub pp_tps_mean: Option<f64>,
}

fn load_records(state: &MatrixState) -> Vec<Option<RunRecord>> {
    state
        .order
        .iter()
        .map(|p| {
            p.record
                .as_ref()
                .and_then(|path| crate::record::store::load_file(path).ok())
        })
        .collect()
}

fn mean_of(results: &[PointResult], f: impl Fn(&PointResult) -> Option<Stats>) -> Option<f64> {
    let v: Vec<f64> = results
        .iter()
        .filter_map(|p| f(p).map(|s| s.mean))
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn cell(s: Option<Stats>, base: Option<Stats>, is_base: bool) -> String {
    match s {
        None => "-".into(),
        Some(s) => {
            let mut c = format!("{:.2} ± {:.2}", s.mean, s.std);
            if let Some(b) = base.filter(|b| !is_base && b.mean > 0.0) {
                let _ = write!(c, " ({:+.1} %)", (s.mean / b.mean - 1.0) * 100.0);
            }
            c
        }
    }
}

fn ttft(p: &PointResult) -> Option<Stats> {
    p.latency.ttft_ms.map(|l| Stats {
        n: l.n,
        mean: l.p50,
        std: l.std,
        min: l.p50,
        max: l.p99,
    })
}

/// Writes `report.md`, the charts and `matrix-summary.json` into `out`; returns the report
/// path.
pub fn write(state: &MatrixState, out: &Path) -> Result<PathBuf> {
    let records = load_records(state);
    let baseline = state.plan.presets.first().cloned();
    let base_rec = baseline.as_ref().and_then(|b| {
        state
            .order
            .iter()
            .position(|p| &p.name == b)
            .and_then(|i| records[i].clone())
    });
    let charts_dir = out.join("charts");
    std::fs::create_dir_all(&charts_dir)
        .with_context(|| format!("cannot create {}", charts_dir.display()))?;
    let mut charts = Vec::new();
    let mut chart_notes = Vec::new();
    let bars: Vec<(String, Option<f64>, bool)> = state
        .order
        .iter()
        .zip(&records)
        .map(|(p, r)| {
            (
                p.name.clone(),
                r.as_ref().and_then(|r| mean_of(&r.results, |x| x.tg_tps)),
                p.invalid,
            )
        })
        .collect();
    if bars.iter().any(|b| b.1.is_some()) {
        let path = charts_dir.join("decode-tps.svg");
        decode_chart(&path, &bars)?;
        charts.push("charts/decode-tps.svg".to_owned());
    } else {
        chart_notes.push("no decode figures yet: decode chart not drawn".to_owned());
    }
    for (p, r) in state.order.iter().zip(&records) {
        let Some(r) = r else { continue };
        let series = r
            .resources
            .as_ref()
            .map(|x| x.series.clone())
            .unwrap_or_default();
        if series
            .iter()
            .any(|s| s.gen_tps.is_some() || s.sm_clock_mhz.is_some())
        {
            let file = format!("charts/timeline-{}.svg", safe(&p.name));
            timeline_chart(&out.join(&file), &p.name, r)?;
            charts.push(file);
        } else {
            chart_notes.push(format!(
                "{}: no monitor samples with tok/s or SM clock: timeline not drawn",
                p.name
            ));
        }
    }

    let mut md = String::new();
    // The records of a matrix on hosts name those hosts, not the machine that ran it.
    let host = if state.plan.hosts.is_empty() {
        records
            .iter()
            .flatten()
            .find_map(|r| r.environment.host.hostname.clone())
            .unwrap_or_else(|| "unknown host".into())
    } else {
        format!("hosts {}", state.plan.hosts.join(", "))
    };
    let _ = writeln!(md, "# Matrix {} ({})\n", state.matrix_id, host);
    let _ = writeln!(
        md,
        "Started {} · target {:?} · levels {} · {}\n",
        state.started_at.format("%Y-%m-%d %H:%M UTC"),
        state.plan.target,
        state
            .plan
            .levels
            .iter()
            .map(|l| l.number())
            .collect::<Vec<_>>()
            .join(", "),
        if state.complete() {
            "complete".to_owned()
        } else {
            format!(
                "INCOMPLETE ({} of {} presets finished)",
                state.order.iter().filter(|p| p.status.finished()).count(),
                state.order.len()
            )
        }
    );
    let g = &state.plan.grid;
    let _ = writeln!(
        md,
        "Grid: pp {:?} · tg {:?} · depth {:?} · concurrency {:?} · {} runs ({} warm-up) · endpoint {:?}\n",
        g.pp, g.tg, g.depth, g.concurrency, g.runs, g.warmup, state.plan.endpoint
    );
    if !state.plan.hosts.is_empty() {
        let hosts: Vec<String> = state
            .plan
            .hosts
            .iter()
            .map(|h| match state.plan.host_presets.get(h) {
                Some(list) => format!("{h} (its own: {})", list.join(", ")),
                None => h.clone(),
            })
            .collect();
        let dealt = if state.plan.host_presets.is_empty() {
            "presets dealt out in run order"
        } else {
            "a host with its own presets runs those, the others are dealt out in run order over the rest"
        };
        let _ = writeln!(
            md,
            "Hosts: {} (Docker over SSH; {dealt}, the hosts running at the same time; each record is tagged `host:NAME` and holds that host's environment; GPU readings and the cool-down come from each host's own `mxtune monitor`)\n",
            hosts.join(", ")
        );
    }
    let _ = writeln!(
        md,
        "Order: {} ({}){}\n",
        state
            .order
            .iter()
            .map(|p| p.label())
            .collect::<Vec<_>>()
            .join(" → "),
        match state.plan.seed {
            Some(s) => format!("shuffled, seed {s}"),
            None => "as given".to_owned(),
        },
        if state.resumes > 0 {
            format!(" · resumed {} time(s)", state.resumes)
        } else {
            String::new()
        }
    );

    let _ = writeln!(md, "## Verdicts\n");
    let levels: Vec<TestLevel> = state.plan.levels.clone();
    let _ = writeln!(
        md,
        "| Preset | Status | {} | Run |",
        levels
            .iter()
            .map(|l| l.title())
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(md, "|---|---|{}---|", "---|".repeat(levels.len()));
    for p in &state.order {
        let cells: Vec<String> = levels
            .iter()
            .map(|l| {
                p.levels
                    .iter()
                    .find(|o| o.level == *l)
                    .map(|o| o.verdict.to_uppercase())
                    .unwrap_or_else(|| "-".into())
            })
            .collect();
        let _ = writeln!(
            md,
            "| {} | {:?} | {} | {} |",
            p.label(),
            p.status,
            cells.join(" | "),
            p.run_id.as_deref().unwrap_or("-")
        );
    }
    let _ = writeln!(md);
    for p in &state.order {
        for o in p.levels.iter().filter(|o| o.verdict != "pass") {
            let _ = writeln!(
                md,
                "- {} {}: {} — {}",
                p.label(),
                o.level.title(),
                o.verdict.to_uppercase(),
                o.detail.replace('\n', " ")
            );
        }
    }

    let _ = writeln!(md, "\n## Results\n");
    if let Some(b) = &baseline {
        let _ = writeln!(
            md,
            "Deltas in parentheses are against the baseline preset `{b}`. Mean ± std over {} run(s); TTFT is the p50 in ms.\n",
            g.runs
        );
    }
    let _ = writeln!(
        md,
        "| Preset | Test | pp t/s | tg t/s | TTFT p50 ms | Notes |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|---|");
    for ((p, r), prog) in state.order.iter().zip(&records).zip(&state.order) {
        let Some(r) = r else {
            let _ = writeln!(
                md,
                "| {} | - | - | - | - | no record ({:?}) |",
                p.name, p.status
            );
            continue;
        };
        let is_base = baseline.as_deref() == Some(p.name.as_str());
        if r.results.is_empty() {
            let _ = writeln!(
                md,
                "| {} | - | - | - | - | no results ({:?}) |",
                p.name, p.status
            );
        }
        for (i, pt) in r.results.iter().enumerate() {
            let base = base_rec
                .as_ref()
                .and_then(|b| b.results.iter().find(|x| x.point == pt.point));
            let mut notes = Vec::new();
            if prog.invalid {
                notes.push("INVALID".to_owned());
            }
            if pt.errors > 0 {
                notes.push(format!("{} failed requests", pt.errors));
            }
            if let Some(Some(t)) = prog.point_temps_c.get(i) {
                notes.push(format!("start {t:.0} °C"));
            }
            let _ = writeln!(
                md,
                "| {} | {} c{} | {} | {} | {} | {} |",
                p.name,
                pt.point.label(),
                pt.point.concurrency,
                cell(pt.pp_tps, base.and_then(|b| b.pp_tps), is_base),
                cell(pt.tg_tps, base.and_then(|b| b.tg_tps), is_base),
                cell(ttft(pt), base.and_then(ttft), is_base),
                notes.join(", ")
            );
        }
    }

    let _ = writeln!(md, "\n## Heat and throttling\n");
    let mut any = false;
    for (p, r) in state.order.iter().zip(&records) {
        let Some(res) = r.as_ref().and_then(|r| r.resources.as_ref()) else {
            continue;
        };
        for t in &res.throttle {
            any = true;
            let _ = writeln!(
                md,
                "- WARNING {}: throttled ({}) for {} samples, {} – {}",
                p.name,
                t.reason,
                t.samples,
                t.first_seen.format("%H:%M:%S"),
                t.last_seen.format("%H:%M:%S")
            );
        }
        if let Some(tmax) = res.temp_max_c {
            any = true;
            let _ = writeln!(
                md,
                "- {}: GPU max {tmax:.0} °C, SM clock min {} MHz",
                p.name,
                res.sm_clock_min_mhz
                    .map_or("-".into(), |c| format!("{c:.0}"))
            );
        }
    }
    if let Some(c) = state.plan.cooldown_c {
        let _ = writeln!(
            md,
            "- cool-down before each point until the GPU was below {c:.0} °C (start temperatures in the notes above)"
        );
        any = true;
    }
    if !any {
        let _ = writeln!(
            md,
            "No GPU readings (no NVML on this host): no throttle information."
        );
    }

    let _ = writeln!(md, "\n## Charts\n");
    for c in &charts {
        let _ = writeln!(md, "![{c}]({c})");
    }
    for n in &chart_notes {
        let _ = writeln!(md, "- {n}");
    }
    let path = out.join(REPORT_FILE);
    std::fs::write(&path, md).with_context(|| format!("cannot write {}", path.display()))?;

    let summary = MatrixSummary {
        format: "mxtune.matrix-summary".into(),
        matrix_id: state.matrix_id.clone(),
        complete: state.complete(),
        seed: state.plan.seed,
        order: state.order.iter().map(|p| p.name.clone()).collect(),
        baseline,
        presets: state
            .order
            .iter()
            .zip(&records)
            .map(|(p, r)| SummaryEntry {
                preset: p.name.clone(),
                status: p.status,
                run_id: p.run_id.clone(),
                levels: p
                    .levels
                    .iter()
                    .map(|l| (l.level.number().to_owned(), l.verdict.clone()))
                    .collect(),
                invalid: p.invalid,
                tg_tps_mean: r.as_ref().and_then(|r| mean_of(&r.results, |x| x.tg_tps)),
                pp_tps_mean: r.as_ref().and_then(|r| mean_of(&r.results, |x| x.pp_tps)),
            })
            .collect(),
        charts,
    };
    let spath = out.join(SUMMARY_FILE);
    std::fs::write(
        &spath,
        serde_json::to_string_pretty(&summary).context("serializing the matrix summary")?,
    )
    .with_context(|| format!("cannot write {}", spath.display()))?;
    Ok(path)
}

fn safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn plot_err<E: std::fmt::Debug>(path: &Path) -> impl Fn(E) -> anyhow::Error + '_ {
    move |e| anyhow::anyhow!("drawing chart {}: {e:?}", path.display())
}

/// Bar chart of mean decode t/s per preset; INVALID presets are drawn grey.
fn decode_chart(path: &Path, bars: &[(String, Option<f64>, bool)]) -> Result<()> {
    let err = plot_err(path);
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(&err)?;
    let top = bars
        .iter()
        .filter_map(|b| b.1)
        .fold(0.0_f64, f64::max)
        .max(1e-9)
        * 1.15;
    let n = bars.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "decode tok/s per preset (mean over grid points)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..n as f64, 0f64..top)
        .map_err(&err)?;
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n.max(1) * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.01 && i < names.len() {
                names[i].clone()
            } else {
                String::new()
            }
        })
        .y_desc("tok/s")
        .draw()
        .map_err(&err)?;
    chart
        .draw_series(bars.iter().enumerate().filter_map(|(i, b)| {
            b.1.map(|v| {
                let color = if b.2 {
                    RGBColor(160, 160, 160)
                } else {
                    RGBColor(31, 119, 180)
                };
                Rectangle::new(
                    [(i as f64 + 0.15, 0.0), (i as f64 + 0.85, v)],
                    color.filled(),
                )
            })
        }))
        .map_err(&err)?;
    root.present().map_err(&err)?;
    Ok(())
}

/// Server tok/s (left axis) and SM clock (right axis) over the run.
fn timeline_chart(path: &Path, name: &str, r: &RunRecord) -> Result<()> {
    let err = plot_err(path);
    let series = r
        .resources
        .as_ref()
        .map(|x| x.series.as_slice())
        .unwrap_or(&[]);
    let t_max = series
        .iter()
        .map(|s| s.t_s)
        .fold(0.0_f64, f64::max)
        .max(1.0);
    let tps_max = series
        .iter()
        .filter_map(|s| s.gen_tps)
        .fold(0.0_f64, f64::max)
        .max(1.0)
        * 1.1;
    let clk_max = series
        .iter()
        .filter_map(|s| s.sm_clock_mhz)
        .fold(0.0_f64, f64::max)
        .max(1.0)
        * 1.1;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(&err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{name}: tok/s and SM clock over time"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .right_y_label_area_size(60)
        .build_cartesian_2d(0f64..t_max, 0f64..tps_max)
        .map_err(&err)?
        .set_secondary_coord(0f64..t_max, 0f64..clk_max);
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("generation tok/s (server /metrics)")
        .draw()
        .map_err(&err)?;
    chart
        .configure_secondary_axes()
        .y_desc(if series.iter().any(|s| s.sm_clock_mhz.is_some()) {
            "SM clock MHz"
        } else {
            "SM clock MHz (no NVML readings)"
        })
        .draw()
        .map_err(&err)?;
    chart
        .draw_series(LineSeries::new(
            series.iter().filter_map(|s| s.gen_tps.map(|v| (s.t_s, v))),
            &BLUE,
        ))
        .map_err(&err)?
        .label("tok/s")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLUE));
    chart
        .draw_secondary_series(LineSeries::new(
            series
                .iter()
                .filter_map(|s| s.sm_clock_mhz.map(|v| (s.t_s, v))),
            &RED,
        ))
        .map_err(&err)?
        .label("SM clock")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], RED));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(&err)?;
    root.present().map_err(&err)?;
    Ok(())
}
