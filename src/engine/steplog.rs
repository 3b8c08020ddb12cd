//! The served run's step timeline: `mxtune serve --step-log FILE` writes one JSON line per
//! engine step (what the step held, how long its parts took), and `mxtune engine steps FILE`
//! reads it back as a table — where a served run's wall time went, next to the step
//! `engine profile --batch N` measures alone.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// One engine step, as written to the step log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Start of the step's iteration, seconds since the log opened.
    pub t: f64,
    /// Time the engine sat idle (no request) before this iteration, in µs.
    pub idle_us: u64,
    /// Sequences that fed one decode token.
    pub decode_rows: usize,
    /// Sequences that fed a prompt chunk, and the chunks' tokens in all.
    pub prefill_rows: usize,
    pub prefill_tokens: usize,
    /// Largest and mean context (positions before the new token) of the decode rows.
    pub ctx_max: usize,
    pub ctx_mean: f64,
    /// Requests still waiting for a slot after this step's admission.
    pub waiting: usize,
    /// Receiving requests, dropping cancelled ones, admitting (µs).
    pub admit_us: u64,
    /// Building the batch (µs).
    pub plan_us: u64,
    /// The backend's forward with sampling, tokens back on the host (µs).
    pub forward_us: u64,
    /// Handing the tokens to the requests, finishing and freeing (µs).
    pub emit_us: u64,
}

impl StepRecord {
    /// The whole iteration (idle time excluded), in µs.
    pub fn busy_us(&self) -> u64 {
        self.admit_us + self.plan_us + self.forward_us + self.emit_us
    }
}

/// The writer side, owned by the engine thread.
pub struct StepLog {
    out: BufWriter<File>,
    opened: Instant,
    path: PathBuf,
    failed: bool,
}

impl std::fmt::Debug for StepLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepLog").field("path", &self.path).finish()
    }
}

impl StepLog {
    /// Create `path`; an existing file is never replaced.
    pub fn create(path: &Path) -> Result<Self> {
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    anyhow::anyhow!(
                        "--step-log {}: the file exists; name a new file (the log is never \
                         overwritten)",
                        path.display()
                    )
                } else {
                    anyhow::anyhow!("--step-log {}: cannot create it: {e}", path.display())
                }
            })?;
        Ok(Self {
            out: BufWriter::new(file),
            opened: Instant::now(),
            path: path.to_path_buf(),
            failed: false,
        })
    }

    /// Seconds since the log opened, for `StepRecord::t`.
    pub fn since_open(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.opened).as_secs_f64()
    }

    /// Append one step. A write error is reported once on stderr and the log stops; serving
    /// goes on.
    pub fn write(&mut self, r: &StepRecord) {
        if self.failed {
            return;
        }
        let line = serde_json::to_string(r).map_err(std::io::Error::other);
        if let Err(e) = line.and_then(|l| writeln!(self.out, "{l}")) {
            self.failed = true;
            crate::errln!(
                "mxtune serve: the step log {} stopped: {e}",
                self.path.display()
            );
        }
    }

    /// Push what is buffered to the file (the engine calls this when it goes idle).
    pub fn flush(&mut self) {
        if !self.failed && self.out.flush().is_err() {
            self.failed = true;
            crate::errln!(
                "mxtune serve: the step log {} could not be flushed; it stops here",
                self.path.display()
            );
        }
    }
}

impl Drop for StepLog {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Read a step log; a malformed line is an error naming its number.
pub fn read(path: &Path) -> Result<Vec<StepRecord>> {
    let f = File::open(path).with_context(|| format!("opening the step log {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(f).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let r: StepRecord = serde_json::from_str(&line).with_context(|| {
            format!(
                "{} line {}: not a step record (write one with `mxtune serve --step-log`)",
                path.display(),
                i + 1
            )
        })?;
        out.push(r);
    }
    if out.is_empty() {
        bail!(
            "{}: no steps (the server ran no request while it logged)",
            path.display()
        );
    }
    Ok(out)
}

/// What kind of step a record is, for grouping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StepKind {
    /// Only decode rows: the batch the graphs of `engine profile --batch N` time.
    Decode { batch: usize },
    /// Prompt chunks (with or without decode rows riding along).
    Prefill,
}

/// One group of the summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Group {
    #[serde(flatten)]
    pub kind: StepKind,
    pub steps: usize,
    /// Mean forward and whole-iteration time, ms; median forward, ms.
    pub forward_ms: f64,
    pub forward_p50_ms: f64,
    pub busy_ms: f64,
    /// Tokens generated (decode rows) and prompt tokens fed, over the group.
    pub decode_tokens: usize,
    pub prefill_tokens: usize,
    /// Mean decode context of the group's steps.
    pub ctx_mean: f64,
    /// Seconds in the group and its share of the log's wall time.
    pub seconds: f64,
    pub share: f64,
}

/// The whole timeline in a few numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub steps: usize,
    /// From the first step's start to the last one's end, idle gaps included.
    pub wall_s: f64,
    pub idle_s: f64,
    /// Host time around the forward (admit + plan + emit) over all steps.
    pub host_s: f64,
    pub forward_s: f64,
    pub decode_tokens: usize,
    pub prefill_tokens: usize,
    pub groups: Vec<Group>,
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Group the steps by kind and add up where the time went.
pub fn summarize(steps: &[StepRecord]) -> Summary {
    let us = |v: u64| v as f64 * 1e-6;
    let first = steps.first().map_or(0.0, |s| s.t);
    let end = steps
        .iter()
        .map(|s| s.t + us(s.busy_us()))
        .fold(first, f64::max);
    // The first record's idle time is before the timeline starts.
    let idle_s: f64 = steps.iter().skip(1).map(|s| us(s.idle_us)).sum();
    let wall_s = end - first;
    let mut by: BTreeMap<StepKind, Vec<&StepRecord>> = BTreeMap::new();
    for s in steps {
        let kind = if s.prefill_tokens > 0 {
            StepKind::Prefill
        } else {
            StepKind::Decode {
                batch: s.decode_rows,
            }
        };
        by.entry(kind).or_default().push(s);
    }
    let groups = by
        .into_iter()
        .map(|(kind, v)| {
            let n = v.len().max(1) as f64;
            let seconds: f64 = v.iter().map(|s| us(s.busy_us())).sum();
            let mut fwd: Vec<f64> = v.iter().map(|s| us(s.forward_us) * 1e3).collect();
            Group {
                kind,
                steps: v.len(),
                forward_ms: fwd.iter().sum::<f64>() / n,
                forward_p50_ms: median(&mut fwd),
                busy_ms: seconds * 1e3 / n,
                decode_tokens: v.iter().map(|s| s.decode_rows).sum(),
                prefill_tokens: v.iter().map(|s| s.prefill_tokens).sum(),
                ctx_mean: v.iter().map(|s| s.ctx_mean).sum::<f64>() / n,
                seconds,
                share: if wall_s > 0.0 { seconds / wall_s } else { 0.0 },
            }
        })
        .collect();
    Summary {
        steps: steps.len(),
        wall_s,
        idle_s,
        host_s: steps
            .iter()
            .map(|s| us(s.admit_us + s.plan_us + s.emit_us))
            .sum(),
        forward_s: steps.iter().map(|s| us(s.forward_us)).sum(),
        decode_tokens: steps.iter().map(|s| s.decode_rows).sum(),
        prefill_tokens: steps.iter().map(|s| s.prefill_tokens).sum(),
        groups,
    }
}

/// The summary as the table `mxtune engine steps` prints.
pub fn render(s: &Summary) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} steps over {:.3} s: forward {:.3} s, host around it {:.3} s, idle {:.3} s; \
         {} tokens generated ({:.1} tok/s over the wall time), {} prompt tokens",
        s.steps,
        s.wall_s,
        s.forward_s,
        s.host_s,
        s.idle_s,
        s.decode_tokens,
        if s.wall_s > 0.0 {
            s.decode_tokens as f64 / s.wall_s
        } else {
            0.0
        },
        s.prefill_tokens
    );
    let _ = writeln!(
        o,
        "{:<12} {:>6} {:>11} {:>11} {:>10} {:>8} {:>9} {:>9} {:>7}",
        "step",
        "steps",
        "forward ms",
        "fwd p50 ms",
        "step ms",
        "ctx",
        "gen tok",
        "seconds",
        "share"
    );
    for g in &s.groups {
        let name = match g.kind {
            StepKind::Decode { batch } => format!("decode b{batch}"),
            StepKind::Prefill => "prefill".to_string(),
        };
        let _ = writeln!(
            o,
            "{:<12} {:>6} {:>11.3} {:>11.3} {:>10.3} {:>8.0} {:>9} {:>9.3} {:>6.1}%",
            name,
            g.steps,
            g.forward_ms,
            g.forward_p50_ms,
            g.busy_ms,
            g.ctx_mean,
            g.decode_tokens,
            g.seconds,
            g.share * 100.0
        );
    }
    o
}

/// Arguments of `mxtune engine steps`.
#[derive(Debug, Clone, clap::Args)]
pub struct StepsArgs {
    /// A step log written by `mxtune serve --step-log FILE`.
    pub file: PathBuf,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Run `mxtune engine steps`.
pub fn run(args: &StepsArgs) -> Result<()> {
    let steps = read(&args.file)?;
    let s = summarize(&steps);
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        crate::out!("{}", render(&s));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(t: f64, decode: usize, prefill: usize, fwd: u64) -> StepRecord {
        StepRecord {
            t,
            idle_us: 0,
            decode_rows: decode,
            prefill_rows: usize::from(prefill > 0),
            prefill_tokens: prefill,
            ctx_max: 10,
            ctx_mean: 10.0,
            waiting: 0,
            admit_us: 10,
            plan_us: 5,
            forward_us: fwd,
            emit_us: 5,
        }
    }

    #[test]
    fn groups_by_kind_and_adds_up_the_time() {
        let steps = vec![
            rec(0.0, 0, 512, 90_000),
            rec(0.09, 2, 0, 4_000),
            rec(0.0941, 2, 0, 6_000),
            rec(0.1002, 1, 0, 3_000),
        ];
        let s = summarize(&steps);
        assert_eq!(s.steps, 4);
        assert_eq!(s.decode_tokens, 5);
        assert_eq!(s.prefill_tokens, 512);
        assert_eq!(s.groups.len(), 3);
        let b2 = &s.groups[1];
        assert_eq!(b2.kind, StepKind::Decode { batch: 2 });
        assert_eq!(b2.steps, 2);
        assert!((b2.forward_ms - 5.0).abs() < 1e-9);
        assert!((b2.busy_ms - 5.02).abs() < 1e-9);
        assert_eq!(s.groups[2].kind, StepKind::Prefill);
        assert!((s.host_s - 4.0 * 20e-6).abs() < 1e-12);
        // The last step ends at 0.1002 + 3.02 ms.
        assert!((s.wall_s - 0.10322).abs() < 1e-9);
        let table = render(&s);
        assert!(table.contains("decode b2"), "{table}");
        assert!(table.contains("prefill"), "{table}");
    }

    #[test]
    fn the_log_is_never_overwritten_and_reads_back() {
        let dir = std::env::temp_dir().join(format!("mxtune-steplog-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("steps.jsonl");
        let mut log = StepLog::create(&p).unwrap();
        log.write(&rec(0.0, 1, 0, 1000));
        drop(log);
        let err = StepLog::create(&p).unwrap_err().to_string();
        assert!(err.contains("exists"), "{err}");
        let back = read(&p).unwrap();
        assert_eq!(back, vec![rec(0.0, 1, 0, 1000)]);
        std::fs::write(&p, "{\"t\":1}\n").unwrap();
        let err = format!("{:#}", read(&p).unwrap_err());
        assert!(err.contains("line 1"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
