//! Test levels of the tuning protocol: correctness (level 2), stress (level 3) and
//! performance (level 4). Each returns pass/fail with the reason for every failed check.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::client::{Endpoint, PromptBody, RequestSpec};
use super::prompt::{Exact, Prompt};
use super::trace::RequestTrace;
use super::workload::{BenchEvent, Runner, WorkloadResult, point_label};

/// Which level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Output sanity: coherent, exact length, valid logprobs, deterministic.
    Correctness,
    /// Stability: many sequential and concurrent requests, one long generation, memory.
    Stress,
    /// The pp/tg/depth/concurrency grid.
    Performance,
}

/// One named check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// Evidence (why it failed, or what was seen; for a skipped check, why it was skipped).
    pub detail: String,
    /// Not run because it means nothing on this target (counts as passed; `detail` says why).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
}

/// A level's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LevelReport {
    /// The level.
    pub level: Level,
    /// All checks passed.
    pub passed: bool,
    /// Every check, in order.
    pub checks: Vec<Check>,
}

impl LevelReport {
    fn new(level: Level, checks: Vec<Check>) -> Self {
        Self {
            level,
            passed: checks.iter().all(|c| c.passed),
            checks,
        }
    }

    /// Names of the skipped checks.
    pub fn skipped(&self) -> Vec<&str> {
        self.checks
            .iter()
            .filter(|c| c.skipped)
            .map(|c| c.name.as_str())
            .collect()
    }

    /// One line for a passed level: how many checks ran and which were skipped, with why.
    pub fn passed_summary(&self) -> String {
        let skipped: Vec<&Check> = self.checks.iter().filter(|c| c.skipped).collect();
        let ran = self.checks.len() - skipped.len();
        if skipped.is_empty() {
            return format!("{ran} checks passed");
        }
        let names: Vec<&str> = skipped.iter().map(|c| c.name.as_str()).collect();
        format!(
            "{ran} checks passed; skipped {}: {}",
            names.join(", "),
            skipped[0].detail
        )
    }

    /// Failed checks' details, then one short line naming the skipped checks and why
    /// (the text before the first `:` of the first skip's detail), for the panel.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = self.reasons();
        let skipped = self.skipped();
        if let Some(first) = self.checks.iter().find(|c| c.skipped) {
            let why = first.detail.split(':').next().unwrap_or_default();
            notes.push(format!("skipped {}: {why}", skipped.join(", ")));
        }
        notes
    }

    /// Details of the failed checks.
    pub fn reasons(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect()
    }
}

fn check(name: &str, passed: bool, detail: impl Into<String>) -> Check {
    Check {
        name: name.to_owned(),
        passed,
        detail: detail.into(),
        skipped: false,
    }
}

fn skip(name: &str, why: &str) -> Check {
    Check {
        name: name.to_owned(),
        passed: true,
        detail: why.to_owned(),
        skipped: true,
    }
}

/// Why text checks are skipped on synthetic weights.
const SYNTHETIC: &str = "the target serves synthetic weights (its /v1/models says so): \
     their tokens are random, so the text means nothing; NaN, determinism, finish reasons, \
     token counts and stop handling are still checked";

/// A stop string taken from a greedy output and the text the server must return when it
/// is sent: everything before its first occurrence. The stop string is a run of four ASCII
/// letters or digits after an ASCII character, from the second third of the text on (so the
/// cut is not trivially at the start).
pub fn stop_probe(text: &str) -> Option<(String, String)> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let from = chars.len() / 3;
    (from.max(1)..chars.len().saturating_sub(3)).find_map(|i| {
        let word = &chars[i..i + 4];
        let ok = chars[i - 1].1.is_ascii() && word.iter().all(|(_, c)| c.is_ascii_alphanumeric());
        if !ok {
            return None;
        }
        let stop: String = word.iter().map(|(_, c)| *c).collect();
        let at = text.find(&stop)?;
        Some((stop, text[..at].to_owned()))
    })
}

/// Reads the target's memory in use (the monitor supplies one; tests use a fake).
pub trait MemoryProbe: Send + Sync {
    /// Bytes in use now.
    fn used_bytes(&self) -> anyhow::Result<u64>;
    /// What is measured, for the report (e.g. "GPU 0 used memory").
    fn describe(&self) -> String;
}

/// Non-empty and printable: no control characters other than whitespace, no U+FFFD.
pub fn printable(text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err("empty output".into());
    }
    if let Some(c) = text
        .chars()
        .find(|c| (c.is_control() && !matches!(c, '\n' | '\r' | '\t')) || *c == '\u{FFFD}')
    {
        return Err(format!(
            "unprintable character U+{:04X} in output",
            c as u32
        ));
    }
    Ok(())
}

/// Detect degenerate repetition such as "a is the is a is the": a short period of words (or of
/// characters, for text without spaces) that repeats over most of the output.
pub fn degenerate(text: &str) -> Option<String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    if let Some(r) = periodic(&words, 8) {
        return Some(format!(
            "a {}-word pattern repeats over {} of {} words (\"{}\")",
            r.0,
            r.1,
            words.len(),
            words[r.2..r.2 + r.0].join(" ")
        ));
    }
    let chars: Vec<char> = text.chars().filter(|c| !c.is_whitespace()).collect();
    if words.len() >= 4 || chars.len() < 16 {
        return None;
    }
    periodic(&chars, 4).map(|r| {
        format!(
            "a {}-character pattern repeats over {} of {} characters",
            r.0,
            r.1,
            chars.len()
        )
    })
}

/// (period, covered length, start) of the longest stretch where `x[i] == x[i + p]`, when it
/// covers at least half the sequence and at least three repeats of the period.
fn periodic<T: PartialEq>(x: &[T], max_period: usize) -> Option<(usize, usize, usize)> {
    if x.len() < 8 {
        return None;
    }
    let mut best: Option<(usize, usize, usize)> = None;
    for p in 1..=max_period.min(x.len() / 3) {
        let mut run = 0;
        let mut start = 0;
        for i in 0..x.len() - p {
            if x[i] == x[i + p] {
                if run == 0 {
                    start = i;
                }
                run += 1;
                let covered = run + p;
                if covered * 2 >= x.len() && covered >= 3 * p && best.is_none_or(|b| covered > b.1)
                {
                    best = Some((p, covered, start));
                }
            } else {
                run = 0;
            }
        }
    }
    best
}

/// Settings of the correctness level.
#[derive(Debug, Clone, PartialEq)]
pub struct CorrectnessPlan {
    /// Endpoint.
    pub endpoint: Endpoint,
    /// Tokens to generate.
    pub tokens: u32,
    /// Seed sent with both requests.
    pub seed: u64,
}

impl Default for CorrectnessPlan {
    fn default() -> Self {
        Self {
            endpoint: Endpoint::Chat,
            tokens: 64,
            seed: 1234,
        }
    }
}

const QUESTION: &str =
    "Describe in three sentences how a lighthouse keeper spends a stormy winter night.";

fn question() -> Prompt {
    let ids = tiktoken_rs::o200k_base_singleton().encode_ordinary(QUESTION);
    Prompt {
        context: Exact {
            text: String::new(),
            ids: Vec::new(),
        },
        prompt: Exact {
            text: QUESTION.to_owned(),
            ids,
        },
    }
}

impl Runner {
    /// Level 2: two identical greedy requests with a seed and logprobs, then a greedy
    /// completion and the same with a stop string taken from it. On synthetic weights (the
    /// target says so in `/v1/models`) the checks of the text itself are skipped.
    pub async fn correctness(&self, plan: &CorrectnessPlan) -> LevelReport {
        let mut checks = Vec::new();
        let weights = self.client.model_weights(&self.model).await;
        let synthetic = matches!(&weights, Ok(Some(w)) if w == "synthetic");
        checks.push(check(
            "weights served",
            true,
            match &weights {
                Ok(Some(w)) => format!("{w} (the server's /v1/models entry for {})", self.model),
                Ok(None) => "not stated by the server: every check runs".to_owned(),
                Err(e) => format!("/v1/models unreadable ({e:#}): every check runs"),
            },
        ));
        let spec = RequestSpec {
            endpoint: plan.endpoint,
            model: self.model.clone(),
            prompt: PromptBody::Text(question()),
            max_tokens: plan.tokens,
            exact_output: true,
            temperature: Some(0.0),
            seed: Some(plan.seed),
            logprobs: true,
            stop: Vec::new(),
        };
        let epoch = Instant::now();
        let a = self.client.stream(&spec, epoch).await;
        let b = self.client.stream(&spec, epoch).await;
        for (i, t) in [&a, &b].into_iter().enumerate() {
            let n = i + 1;
            checks.push(match &t.error {
                None => check(&format!("request {n} completes"), true, "ok"),
                Some(e) => check(&format!("request {n} completes"), false, e.message.clone()),
            });
        }
        let text = full_text(&a);
        checks.push(if synthetic {
            skip("non-empty printable text", SYNTHETIC)
        } else {
            match printable(&text) {
                Ok(()) => check("non-empty printable text", true, excerpt(&text)),
                Err(e) => check("non-empty printable text", false, e),
            }
        });
        checks.push(if synthetic {
            skip("no degenerate repetition", SYNTHETIC)
        } else {
            match degenerate(&text) {
                None => check("no degenerate repetition", true, "ok"),
                Some(why) => check("no degenerate repetition", false, why),
            }
        });
        checks.push(check(
            "token count as requested",
            a.completion_tokens == u64::from(plan.tokens),
            format!(
                "{} of {} tokens ({}); usage said {:?}",
                a.completion_tokens,
                plan.tokens,
                a.count_method.label(),
                a.usage_completion_tokens
            ),
        ));
        checks.push(check(
            "finish reason length",
            a.finish_reason.as_deref() == Some("length"),
            format!(
                "finish_reason {} after {} tokens with ignore_eos",
                a.finish_reason.as_deref().unwrap_or("none"),
                a.completion_tokens
            ),
        ));
        checks.push(logprob_check(&a));
        let same = full_text(&a) == full_text(&b);
        checks.push(check(
            "deterministic at temperature 0 with a seed",
            same && a.error.is_none() && b.error.is_none(),
            if same {
                "both outputs identical".to_owned()
            } else {
                format!(
                    "outputs differ: {:?} vs {:?}",
                    excerpt(&full_text(&a)),
                    excerpt(&full_text(&b))
                )
            },
        ));
        checks.push(self.stop_check(plan, epoch).await);
        let report = LevelReport::new(Level::Correctness, checks);
        self.emit(BenchEvent::LevelDone(Box::new(report.clone())));
        report
    }

    /// A greedy completion, then the same request with a stop string taken from its text:
    /// the second must end with `finish_reason` `stop` and return exactly the text before
    /// the stop string's first occurrence.
    async fn stop_check(&self, plan: &CorrectnessPlan, epoch: Instant) -> Check {
        const NAME: &str = "stop string ends the output";
        let mut spec = RequestSpec {
            endpoint: Endpoint::Completions,
            model: self.model.clone(),
            prompt: PromptBody::Text(question()),
            max_tokens: plan.tokens,
            exact_output: false,
            temperature: Some(0.0),
            seed: Some(plan.seed),
            logprobs: false,
            stop: Vec::new(),
        };
        let free = self.client.stream(&spec, epoch).await;
        if let Some(e) = &free.error {
            return check(
                NAME,
                false,
                format!("the request without a stop string failed: {}", e.message),
            );
        }
        let Some((stop, expected)) = stop_probe(&free.content) else {
            return skip(
                NAME,
                &format!(
                    "the greedy completion ({} characters) has no four ASCII letters or digits \
                     to stop at: {:?}",
                    free.content.chars().count(),
                    excerpt(&free.content)
                ),
            );
        };
        spec.stop = vec![stop.clone()];
        let cut = self.client.stream(&spec, epoch).await;
        if let Some(e) = &cut.error {
            return check(
                NAME,
                false,
                format!("the request with stop {stop:?} failed: {}", e.message),
            );
        }
        let reason = cut.finish_reason.as_deref().unwrap_or("none");
        if cut.content == expected && reason == "stop" {
            check(
                NAME,
                true,
                format!(
                    "stop {stop:?} cut the output after {} characters",
                    expected.chars().count()
                ),
            )
        } else {
            check(
                NAME,
                false,
                format!(
                    "stop {stop:?}: expected {:?} with finish_reason stop, got {:?} with finish_reason {reason}",
                    excerpt(&expected),
                    excerpt(&cut.content)
                ),
            )
        }
    }

    /// Level 3: sequential and concurrent requests, one long generation, memory before/after.
    pub async fn stress(&self, plan: &StressPlan, probe: Option<&dyn MemoryProbe>) -> LevelReport {
        let mut checks = Vec::new();
        let before = probe.map(|p| p.used_bytes());
        let epoch = Instant::now();
        let short = |unique: &str| -> anyhow::Result<RequestSpec> {
            Ok(RequestSpec {
                endpoint: plan.endpoint,
                model: self.model.clone(),
                prompt: PromptBody::Text(Prompt::build(plan.prompt_tokens, 0, Some(unique))?),
                max_tokens: plan.short_tokens,
                exact_output: false,
                temperature: None,
                seed: None,
                logprobs: false,
                stop: Vec::new(),
            })
        };
        let mut failures = Vec::new();
        let mut ok = 0;
        for i in 0..plan.sequential {
            if self.cancel.is_cancelled() {
                break;
            }
            match short(&format!("seq {i}")) {
                Ok(spec) => {
                    let t = self.client.stream(&spec, epoch).await;
                    match t.error {
                        Some(e) if e.is_fatal() => failures.push(format!("#{i}: {}", e.message)),
                        _ => ok += 1,
                    }
                }
                Err(e) => failures.push(format!("#{i}: {e:#}")),
            }
        }
        checks.push(check(
            &format!("{} sequential requests", plan.sequential),
            ok == plan.sequential,
            summary(ok, plan.sequential, &failures),
        ));
        let specs: anyhow::Result<Vec<RequestSpec>> = (0..plan.concurrent)
            .map(|i| short(&format!("par {i}")))
            .collect();
        let (ok, failures) = match specs {
            Ok(specs) => match self.batch(specs, epoch, 0, false).await {
                Some(traces) => tally(&traces),
                None => (0, vec!["cancelled".to_owned()]),
            },
            Err(e) => (0, vec![format!("{e:#}")]),
        };
        checks.push(check(
            &format!("{} concurrent requests", plan.concurrent),
            ok == plan.concurrent,
            summary(ok, plan.concurrent, &failures),
        ));
        let long = match short("long") {
            Ok(mut spec) => {
                spec.max_tokens = plan.long_tokens;
                spec.exact_output = true;
                let t = self.client.stream(&spec, epoch).await;
                match t.error {
                    None => check(
                        &format!("{}-token generation", plan.long_tokens),
                        true,
                        format!(
                            "{} tokens in {:.1} s",
                            t.completion_tokens,
                            t.end_s - t.start_s
                        ),
                    ),
                    Some(e) => check(
                        &format!("{}-token generation", plan.long_tokens),
                        false,
                        e.message,
                    ),
                }
            }
            Err(e) => check("long generation", false, format!("{e:#}")),
        };
        checks.push(long);
        if let Some(probe) = probe {
            let after = probe.used_bytes();
            checks.push(memory_check(
                &probe.describe(),
                before,
                after,
                plan.memory_tolerance,
            ));
        }
        let report = LevelReport::new(Level::Stress, checks);
        self.emit(BenchEvent::LevelDone(Box::new(report.clone())));
        report
    }
}

/// Level 4 verdict: every point measured, no failed request, no early end.
pub fn performance_report(result: &WorkloadResult) -> LevelReport {
    let mut checks = Vec::new();
    checks.push(check(
        "grid completed",
        !result.aborted && result.points.len() == result.workload.points().len(),
        format!(
            "{} of {} points{}",
            result.points.len(),
            result.workload.points().len(),
            if result.aborted { " (aborted)" } else { "" }
        ),
    ));
    for p in &result.points {
        let s = &p.stats.record;
        let mut why = Vec::new();
        if s.errors > 0 {
            why.push(format!("{} failed requests", s.errors));
        }
        if s.early_ended > 0 {
            why.push(format!("{} responses ended early", s.early_ended));
        }
        if s.pp_tps.is_none() {
            why.push("no pp figure".to_owned());
        }
        if s.tg_tps.is_none() {
            why.push("no tg figure".to_owned());
        }
        for (message, n) in p.errors.iter().take(3) {
            why.push(format!("{n}× {message}"));
        }
        checks.push(check(
            &format!("{} c{}", point_label(&p.point), p.point.concurrency),
            why.is_empty(),
            if why.is_empty() {
                format!("{} requests ok", s.requests)
            } else {
                why.join("; ")
            },
        ));
    }
    LevelReport::new(Level::Performance, checks)
}

/// Settings of the stress level.
#[derive(Debug, Clone, PartialEq)]
pub struct StressPlan {
    /// Endpoint.
    pub endpoint: Endpoint,
    /// Sequential requests.
    pub sequential: usize,
    /// Concurrent requests (one batch).
    pub concurrent: usize,
    /// Prompt tokens of each short request.
    pub prompt_tokens: usize,
    /// Tokens each short request generates.
    pub short_tokens: u32,
    /// Tokens of the long generation.
    pub long_tokens: u32,
    /// Allowed relative memory change (0.10 = 10 %).
    pub memory_tolerance: f64,
}

impl Default for StressPlan {
    fn default() -> Self {
        Self {
            endpoint: Endpoint::Chat,
            sequential: 100,
            concurrent: 10,
            prompt_tokens: 128,
            short_tokens: 32,
            long_tokens: 1024,
            memory_tolerance: 0.10,
        }
    }
}

fn memory_check(
    what: &str,
    before: Option<anyhow::Result<u64>>,
    after: anyhow::Result<u64>,
    tolerance: f64,
) -> Check {
    let name = format!("memory stable within {:.0} %", tolerance * 100.0);
    match (before, after) {
        (Some(Ok(b)), Ok(a)) if b > 0 => {
            let delta = (a as f64 - b as f64) / b as f64;
            check(
                &name,
                delta.abs() <= tolerance,
                format!(
                    "{what}: {:.1} MiB before, {:.1} MiB after ({:+.1} %)",
                    b as f64 / 1048576.0,
                    a as f64 / 1048576.0,
                    delta * 100.0
                ),
            )
        }
        (Some(Ok(_)), Ok(_)) => check(&name, false, format!("{what}: read 0 bytes before")),
        (Some(Err(e)), _) | (_, Err(e)) => check(&name, false, format!("{what}: {e:#}")),
        (None, Ok(_)) => check(&name, false, format!("{what}: no reading before the run")),
    }
}

fn tally(traces: &[RequestTrace]) -> (usize, Vec<String>) {
    let mut ok = 0;
    let mut failures = Vec::new();
    for (i, t) in traces.iter().enumerate() {
        match &t.error {
            Some(e) if e.is_fatal() => failures.push(format!("#{i}: {}", e.message)),
            _ => ok += 1,
        }
    }
    (ok, failures)
}

fn summary(ok: usize, total: usize, failures: &[String]) -> String {
    let mut s = format!("{ok} of {total} completed");
    for f in failures.iter().take(3) {
        s.push_str("; ");
        s.push_str(f);
    }
    if failures.len() > 3 {
        s.push_str(&format!("; and {} more", failures.len() - 3));
    }
    s
}

fn full_text(t: &RequestTrace) -> String {
    format!("{}{}", t.reasoning, t.content)
}

fn excerpt(text: &str) -> String {
    let mut s: String = text.chars().take(120).collect();
    if s.len() < text.len() {
        s.push('…');
    }
    s
}

fn logprob_check(t: &RequestTrace) -> Check {
    const NAME: &str = "valid logprobs";
    if t.invalid_logprobs {
        return check(NAME, false, "a logprob entry was null");
    }
    if t.logprobs.is_empty() {
        return check(NAME, false, "no logprobs returned although requested");
    }
    if let Some(bad) = t.logprobs.iter().find(|v| !v.is_finite() || **v > 1e-6) {
        return check(
            NAME,
            false,
            format!("logprob {bad} is not a finite value ≤ 0"),
        );
    }
    check(
        NAME,
        true,
        format!("{} finite values ≤ 0", t.logprobs.len()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repetition_detector() {
        assert!(degenerate("a is the is a is the is a is the is a is the").is_some());
        assert!(degenerate("the the the the the the the the the the").is_some());
        assert!(degenerate("aaaaaaaaaaaaaaaaaaaaaaaa").is_some());
        assert!(degenerate(include_str!("corpus.txt")).is_none());
        assert!(
            degenerate("The keeper climbed the stairs, wiped the lens and lit the lamp.").is_none()
        );
    }

    #[test]
    fn printable_rejects_control_and_replacement_characters() {
        assert!(printable("fine text\n").is_ok());
        assert!(printable("   ").is_err());
        assert!(printable("bad \u{0007} bell").is_err());
        assert!(printable("bad \u{FFFD} byte").is_err());
    }

    #[test]
    fn stop_probe_cuts_before_the_first_occurrence() {
        let (stop, before) =
            stop_probe(" The keeper wrote down the weather and the ships").unwrap();
        assert_eq!(stop, "down");
        assert_eq!(before, " The keeper wrote ");
        // A later word that also occurs earlier: the cut is at the first occurrence.
        let (stop, before) = stop_probe("the ships, ... , ... , the ships").unwrap();
        assert_eq!(stop, "ship");
        assert_eq!(before, "the ");
        assert_eq!(
            stop_probe("\u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD}"),
            None
        );
        assert_eq!(stop_probe(""), None);
    }

    #[test]
    fn memory_check_tolerance() {
        let ok = memory_check("m", Some(Ok(1000)), Ok(1090), 0.10);
        assert!(ok.passed, "{}", ok.detail);
        let bad = memory_check("m", Some(Ok(1000)), Ok(1200), 0.10);
        assert!(!bad.passed);
        let err = memory_check("m", Some(Err(anyhow::anyhow!("nvml gone"))), Ok(1), 0.10);
        assert!(!err.passed && err.detail.contains("nvml gone"));
    }
}
