//! Quick A/B: two configurations alternate A B A B … on one workload; the answer is the
//! ratio B/A per metric with its spread over rounds, which drift and heat cannot fake the
//! way a before/after comparison across sessions can.

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use super::cli::{AbArgs, plan_of};
use super::plan::TestLevel;
use super::progress::{MatrixEvent, Progress};
use super::run::{StartError, Started, measure, prepare, start_on};
use super::state::MatrixPlan;
use crate::bench::workload::{CancelWatch, PointResult};
use crate::launch::Verdict;
use crate::record::RunStatus;
use crate::record::compare::{DEFAULT_NOISE_SIGMAS, Noise, sigmas_text};
use crate::record::schema::WorkloadPoint;

/// One metric's B/A ratio at one point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ratio {
    /// Grid point.
    pub point: WorkloadPoint,
    /// `pp t/s`, `tg t/s` or `TTFT p50 ms`.
    pub metric: String,
    /// B/A of each valid round.
    pub rounds: Vec<f64>,
    /// Mean ratio.
    pub mean: f64,
    /// Standard deviation of the ratios (0 with one round).
    pub std: f64,
}

impl Ratio {
    /// The noise hint at `sigmas` standard deviations: |B/A − 1| against the spread over
    /// rounds; with one round there is no spread and nothing to say.
    pub fn noise(&self, sigmas: f64) -> Noise {
        let spread = (self.rounds.len() > 1).then_some(self.std);
        Noise::of(self.mean - 1.0, spread, sigmas)
    }
}

fn default_noise() -> f64 {
    DEFAULT_NOISE_SIGMAS
}

/// The A/B result file (`ab.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbResult {
    /// Preset A.
    pub a: String,
    /// Preset B.
    pub b: String,
    /// Rounds asked for.
    pub rounds: u32,
    /// Targets were kept running across rounds.
    pub reused: bool,
    /// The hosts.toml host both ran on (`--host`); `None`: this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Run ids of A's and B's records.
    pub records: Vec<(String, String)>,
    /// Rounds left out, and why (a launch failed or a verdict was invalid).
    pub excluded: Vec<String>,
    /// The ratios.
    pub ratios: Vec<Ratio>,
    /// The noise threshold of the hints, in standard deviations (`--noise`; 2 in results
    /// written before it was settable).
    #[serde(default = "default_noise")]
    pub noise: f64,
}

fn metrics(p: &PointResult) -> Vec<(&'static str, Option<f64>)> {
    let r = &p.stats.record;
    vec![
        ("pp t/s", r.pp_tps.map(|s| s.mean)),
        ("tg t/s", r.tg_tps.map(|s| s.mean)),
        ("TTFT p50 ms", r.latency.ttft_ms.map(|l| l.p50)),
    ]
}

/// Mean and sample standard deviation.
pub fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let m = v.iter().sum::<f64>() / n;
    let s = if v.len() > 1 {
        (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (m, s)
}

/// Ratios B/A per point and metric from rounds of (A points, B points).
pub fn ratios(rounds: &[(Vec<PointResult>, Vec<PointResult>)]) -> Vec<Ratio> {
    let mut out: Vec<Ratio> = Vec::new();
    for (a, b) in rounds {
        for pa in a {
            let Some(pb) = b.iter().find(|p| p.point == pa.point) else {
                continue;
            };
            for ((metric, va), (_, vb)) in metrics(pa).into_iter().zip(metrics(pb)) {
                let (Some(va), Some(vb)) = (va, vb) else {
                    continue;
                };
                if va <= 0.0 {
                    continue;
                }
                match out
                    .iter_mut()
                    .find(|r| r.point == pa.point && r.metric == metric)
                {
                    Some(r) => r.rounds.push(vb / va),
                    None => out.push(Ratio {
                        point: pa.point,
                        metric: metric.to_owned(),
                        rounds: vec![vb / va],
                        mean: 0.0,
                        std: 0.0,
                    }),
                }
            }
        }
    }
    for r in &mut out {
        (r.mean, r.std) = mean_std(&r.rounds);
    }
    out
}

/// Launches one preset, here or (as a matrix with `--host` does) on `host`'s Docker engine.
async fn launch_one(
    plan: &MatrixPlan,
    name: &str,
    host: Option<&str>,
    tags: &[String],
    cancel: &CancelWatch,
    progress: &Progress,
) -> Result<Option<Started>, String> {
    let prepared = prepare(plan, name).map_err(|e| format!("{name}: {e:#}"))?;
    match start_on(plan, &prepared, host, tags, cancel, progress).await {
        Ok(s) => {
            if s.report.overall() == Verdict::Invalid {
                let mut s = s;
                let _ = s.launch.stop(Duration::from_secs(30), false).await;
                let _ = s
                    .record
                    .finish(RunStatus::Failed, Some("kernel path invalid".into()));
                return Err(format!(
                    "{name}: kernel-path verdict invalid: the flags did not take effect"
                ));
            }
            Ok(Some(s))
        }
        Err(StartError::Interrupted(_)) => Ok(None),
        Err(StartError::Failed(m, _)) => Err(format!("{name}: {m}")),
    }
}

async fn finish(s: Started, interrupted: bool) {
    let mut s = s;
    let _ = s.launch.stop(Duration::from_secs(30), false).await;
    let status = if interrupted {
        RunStatus::Aborted
    } else {
        RunStatus::Completed
    };
    let _ = s.record.finish(status, None);
}

/// The A/B result file in `--out`.
pub const JSON_FILE: &str = "ab.json";
/// The A/B report in `--out`.
pub const MD_FILE: &str = "ab.md";

/// How an A/B ended.
#[derive(Debug, Clone, PartialEq)]
pub struct AbOutcome {
    /// The result, as written to ab.json.
    pub result: AbResult,
    /// Rounds with both A and B measured.
    pub valid_rounds: usize,
    /// Cancelled before the last round.
    pub interrupted: bool,
    /// ab.md's text.
    pub markdown: String,
    /// The report written (ab.md, or a numbered name if one appeared during the run).
    pub md: PathBuf,
    /// The result written (ab.json, likewise).
    pub json: PathBuf,
}

/// Runs the A/B and writes ab.md and ab.json into `--out`. Rounds and the ratios so far go
/// to `progress`; nothing is printed and no signal handler is installed (the caller owns
/// those); `watch` cancels.
pub async fn execute(args: &AbArgs, progress: &Progress, watch: &CancelWatch) -> Result<AbOutcome> {
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    // Checked before anything runs: an A/B takes minutes, and its output must not replace
    // an earlier result.
    for file in [JSON_FILE, MD_FILE] {
        let p = args.out.join(file);
        if p.exists() {
            bail!(
                "{} already holds an A/B result ({}): pick another --out, or move it away",
                args.out.display(),
                p.display()
            );
        }
    }
    let host = match args.common.hosts.as_slice() {
        [] => None,
        [one] if one.contains('=') => bail!(
            "--host {one}: an A/B runs its two presets on one host and takes no list of presets for it; give --host NAME"
        ),
        [one] => Some(one.trim().to_string()),
        more => bail!(
            "--host is given {} times ({}): an A/B runs A and B on the same machine, so that the ratio compares the presets and not the machines; give one --host",
            more.len(),
            more.join(", ")
        ),
    };
    let plan = plan_of(
        &args.common,
        vec![args.preset_a.clone(), args.preset_b.clone()],
        vec![
            TestLevel::Smoke,
            TestLevel::KernelPath,
            TestLevel::Performance,
        ],
    )?;
    let (pa, pb) = (
        prepare(&plan, &args.preset_a)?,
        prepare(&plan, &args.preset_b)?,
    );
    if args.reuse {
        if pa.spec.port == pb.spec.port {
            bail!(
                "--reuse keeps A and B running together, but both listen on port {}: give one preset another serving.port",
                pa.spec.port
            );
        }
        let names = (
            pa.spec.container.as_ref().and_then(|c| c.name.clone()),
            pb.spec.container.as_ref().and_then(|c| c.name.clone()),
        );
        if let (Some(x), Some(y)) = &names
            && x == y
        {
            bail!("--reuse keeps A and B running together, but both name their container {x}");
        }
    }
    let ab_id = ulid::Ulid::generate().to_string();
    let mut tags = vec![format!("ab:{ab_id}")];
    if let Some(h) = &host {
        tags.push(format!("host:{h}"));
    }
    if args.reuse {
        tags.push("ab-reused-targets".into());
    }
    let watch = watch.clone();
    let mut rounds = Vec::new();
    let mut excluded = Vec::new();
    let mut records = Vec::new();
    let mut interrupted = false;
    let names = [args.preset_a.clone(), args.preset_b.clone()];
    let mut kept: Vec<Started> = Vec::new();
    if args.reuse {
        for name in &names {
            match launch_one(&plan, name, host.as_deref(), &tags, &watch, progress).await {
                Ok(Some(s)) => {
                    records.push((name.clone(), s.record.record().identity.run_id.to_string()));
                    kept.push(s);
                }
                Ok(None) => interrupted = true,
                Err(m) => excluded.push(format!("every round: {m}")),
            }
        }
    }
    let launched_ok = !args.reuse || kept.len() == 2;
    for round in 1..=args.rounds {
        if interrupted || watch.is_cancelled() || !launched_ok {
            interrupted |= watch.is_cancelled();
            break;
        }
        progress.emit(MatrixEvent::AbRound {
            round,
            rounds: args.rounds,
        });
        let mut pair: Vec<Vec<PointResult>> = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let measured = if args.reuse {
                measure(&plan, &mut kept[i], &plan.levels, &watch, progress).await
            } else {
                match launch_one(&plan, name, host.as_deref(), &tags, &watch, progress).await {
                    Ok(Some(mut s)) => {
                        records.push((name.clone(), s.record.record().identity.run_id.to_string()));
                        let m = measure(&plan, &mut s, &plan.levels, &watch, progress).await;
                        finish(s, watch.is_cancelled()).await;
                        m
                    }
                    Ok(None) => {
                        interrupted = true;
                        break;
                    }
                    Err(m) => {
                        excluded.push(format!("round {round}: {m}"));
                        break;
                    }
                }
            };
            // A measuring error excludes the round; the targets still get stopped below.
            let points = match measured {
                Ok(p) => p,
                Err(e) => {
                    excluded.push(format!("round {round}: {name}: {e:#}"));
                    break;
                }
            };
            if points.interrupted {
                interrupted = true;
                break;
            }
            pair.push(points.points);
        }
        if !interrupted && pair.len() == 2 {
            let b = pair.pop().unwrap_or_default();
            let a = pair.pop().unwrap_or_default();
            rounds.push((a, b));
            progress.emit(MatrixEvent::AbRatios {
                valid_rounds: rounds.len(),
                ratios: ratios(&rounds),
            });
        }
    }
    for s in kept {
        finish(s, interrupted).await;
    }
    let result = AbResult {
        a: args.preset_a.clone(),
        b: args.preset_b.clone(),
        rounds: args.rounds,
        reused: args.reuse,
        host: host.clone(),
        records,
        excluded,
        ratios: ratios(&rounds),
        noise: args.noise,
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    // Fresh names rather than an error if another A/B wrote here meanwhile: the rounds are done.
    let json = crate::record::export::write_fresh(
        &args.out.join(JSON_FILE),
        serde_json::to_string_pretty(&result)
            .context("serializing the A/B result")?
            .as_bytes(),
    )?;
    let md = render(&result, rounds.len());
    let mdp = crate::record::export::write_fresh(&args.out.join(MD_FILE), md.as_bytes())?;
    Ok(AbOutcome {
        result,
        valid_rounds: rounds.len(),
        interrupted,
        markdown: md,
        md: mdp,
        json,
    })
}

/// The A/B result as markdown.
pub fn render(r: &AbResult, valid_rounds: usize) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# A/B: {} (A) vs {} (B)\n", r.a, r.b);
    let _ = writeln!(
        md,
        "{valid_rounds} valid of {} rounds, A B alternating; targets {}{}.\n",
        r.rounds,
        if r.reused {
            "kept running across rounds (--reuse)"
        } else {
            "relaunched every round"
        },
        match &r.host {
            Some(h) => format!(", both on host {h} (Docker over SSH)"),
            None => String::new(),
        }
    );
    let _ = writeln!(md, "| Test | Metric | B/A | ± std | noise | rounds |");
    let _ = writeln!(md, "|---|---|---:|---:|---|---|");
    for x in &r.ratios {
        let _ = writeln!(
            md,
            "| {} c{} | {} | {:.3} | {:.3} | {} | {} |",
            x.point.label(),
            x.point.concurrency,
            x.metric,
            x.mean,
            x.std,
            x.noise(r.noise).text(),
            x.rounds
                .iter()
                .map(|v| format!("{v:.3}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let _ = writeln!(
        md,
        "\n\"within noise\": |B/A − 1| < {} of the ratios over rounds; one round has no spread \
         (\"noise unknown\").",
        sigmas_text(r.noise)
    );
    for e in &r.excluded {
        let _ = writeln!(md, "- excluded {e}");
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stats::PointStats;
    use crate::record::schema::{PointResult as RecordPoint, Stats};

    fn point(tg: f64) -> PointResult {
        let p = WorkloadPoint {
            pp: 16,
            tg: 4,
            depth: 0,
            concurrency: 1,
        };
        PointResult {
            point: p,
            stats: PointStats {
                record: RecordPoint {
                    point: p,
                    tg_tps: Some(Stats {
                        n: 1,
                        mean: tg,
                        std: 0.0,
                        min: tg,
                        max: tg,
                    }),
                    ..RecordPoint::default()
                },
                ..PointStats::default()
            },
            runs: Vec::new(),
            errors: Vec::new(),
            partial: false,
        }
    }

    #[test]
    fn ratio_is_b_over_a_per_round_with_spread() {
        let rounds = vec![
            (vec![point(10.0)], vec![point(11.0)]),
            (vec![point(10.0)], vec![point(13.0)]),
        ];
        let r = ratios(&rounds);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].metric, "tg t/s");
        assert_eq!(r[0].rounds.len(), 2);
        assert!((r[0].mean - 1.2).abs() < 1e-9);
        assert!((r[0].std - 0.141_421_356).abs() < 1e-6);
        // 0.2 away from 1 with a std of 0.14: within 2·std, beyond 1·std.
        assert_eq!(r[0].noise(2.0), Noise::Within);
        assert_eq!(r[0].noise(1.0), Noise::Beyond);
        let mut result = AbResult {
            a: "x".into(),
            b: "y".into(),
            rounds: 2,
            reused: true,
            host: None,
            records: vec![],
            excluded: vec![],
            ratios: r,
            noise: 2.0,
        };
        let md = render(&result, 2);
        assert!(md.contains("| 1.200 | 0.141 | within noise |"), "{md}");
        assert!(md.contains("< 2·std"), "{md}");
        result.noise = 1.0;
        let md = render(&result, 2);
        assert!(md.contains("| 1.200 | 0.141 | beyond noise |"), "{md}");
        assert!(md.contains("< 1·std"), "{md}");
    }

    #[test]
    fn one_round_has_no_spread_to_judge_by() {
        let r = ratios(&[(vec![point(10.0)], vec![point(15.0)])]);
        assert_eq!(r[0].noise(2.0), Noise::Unknown);
    }

    #[test]
    fn results_written_before_the_threshold_read_as_two_std() {
        let old =
            r#"{"a":"x","b":"y","rounds":3,"reused":false,"records":[],"excluded":[],"ratios":[]}"#;
        let r: AbResult = serde_json::from_str(old).unwrap();
        assert_eq!(r.noise, 2.0);
    }
}
