//! Kernel-path validation: each flag value's must-see / must-not-see log patterns, evaluated
//! over every log line as it arrives (early lines — the kernel choice — must not be lost when
//! the in-memory buffer rolls over), reported once the target is ready.

use crate::vocab::PathCheck;
use regex::Regex;
use serde::{Deserialize, Serialize};

/// Matching lines kept per pattern, as evidence for the run record.
const EVIDENCE_PER_PATTERN: usize = 5;

/// Did a flag really take effect?
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every must-see pattern appeared and no must-not-see pattern did.
    Valid,
    /// A must-not-see pattern appeared: the flag did not take effect (or something else ran).
    Invalid,
    /// No evidence either way (a must-see pattern never appeared, or no patterns, or no log).
    Unknown,
}

/// The verdict for one flag value, with the evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathVerdict {
    /// Axis name.
    pub flag: String,
    /// Chosen value.
    pub value: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Lines that matched a must-see pattern.
    pub seen: Vec<String>,
    /// Lines that matched a must-not-see pattern.
    pub forbidden_seen: Vec<String>,
    /// Must-see patterns that never matched.
    pub missing: Vec<String>,
    /// Why the verdict is unknown, or a broken pattern.
    pub note: Option<String>,
}

/// Everything kernel-path validation found, for the run record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ValidationReport {
    /// One verdict per check.
    pub checks: Vec<PathVerdict>,
    /// Environment variables the target said it does not know: setting them did nothing.
    pub unknown_env: Vec<String>,
    /// Log lines examined.
    pub lines_scanned: u64,
}

impl ValidationReport {
    /// Invalid if any check is invalid, valid if all are valid, unknown otherwise
    /// (also when there is nothing to check).
    pub fn overall(&self) -> Verdict {
        if self.checks.iter().any(|c| c.verdict == Verdict::Invalid) {
            Verdict::Invalid
        } else if !self.checks.is_empty() && self.checks.iter().all(|c| c.verdict == Verdict::Valid)
        {
            Verdict::Valid
        } else {
            Verdict::Unknown
        }
    }

    /// One warning per unknown environment variable.
    pub fn warnings(&self) -> Vec<String> {
        self.unknown_env
            .iter()
            .map(|v| {
                format!("the target does not know environment variable {v}: setting it did nothing")
            })
            .collect()
    }
}

#[derive(Debug)]
struct PatternState {
    source: String,
    regex: Option<Regex>,
    hits: Vec<String>,
}

impl PatternState {
    fn new(source: &str, broken: &mut Vec<String>) -> Self {
        let regex = match Regex::new(source) {
            Ok(r) => Some(r),
            Err(e) => {
                broken.push(format!("pattern {source:?} is not a valid regex: {e}"));
                None
            }
        };
        Self {
            source: source.to_string(),
            regex,
            hits: Vec::new(),
        }
    }

    /// Whether the line was new evidence (a first hit changes the verdict).
    fn scan(&mut self, line: &str) -> bool {
        let hit = self.hits.len() < EVIDENCE_PER_PATTERN
            && self.regex.as_ref().is_some_and(|r| r.is_match(line));
        if hit {
            self.hits.push(line.to_string());
        }
        hit
    }
}

#[derive(Debug)]
struct CheckState {
    check: PathCheck,
    must_see: Vec<PatternState>,
    must_not_see: Vec<PatternState>,
    broken: Vec<String>,
}

/// Accumulates evidence line by line.
#[derive(Debug)]
pub struct PathScanner {
    checks: Vec<CheckState>,
    unknown_env: Vec<String>,
    lines: u64,
}

impl PathScanner {
    /// A scanner for these checks. Broken regexes make that check `unknown` with a note
    /// rather than failing the launch.
    pub fn new(checks: &[PathCheck]) -> Self {
        let checks = checks
            .iter()
            .map(|c| {
                let mut broken = Vec::new();
                let must_see = c
                    .must_see
                    .iter()
                    .map(|p| PatternState::new(p, &mut broken))
                    .collect();
                let must_not_see = c
                    .must_not_see
                    .iter()
                    .map(|p| PatternState::new(p, &mut broken))
                    .collect();
                CheckState {
                    check: c.clone(),
                    must_see,
                    must_not_see,
                    broken,
                }
            })
            .collect();
        Self {
            checks,
            unknown_env: Vec::new(),
            lines: 0,
        }
    }

    /// Scans one line; `unknown_env` is the variable the line says is unknown, if any.
    /// Returns whether the line added evidence, so that a report already shown can be
    /// refreshed when a kernel-path line arrives after the target answered ready.
    pub fn scan(&mut self, line: &str, unknown_env: Option<String>) -> bool {
        self.lines += 1;
        let mut new = false;
        for c in &mut self.checks {
            for p in c.must_see.iter_mut().chain(c.must_not_see.iter_mut()) {
                new |= p.scan(line);
            }
        }
        if let Some(v) = unknown_env
            && !self.unknown_env.contains(&v)
        {
            self.unknown_env.push(v);
            new = true;
        }
        new
    }

    /// The report for what has been seen so far.
    pub fn report(&self) -> ValidationReport {
        let checks = self
            .checks
            .iter()
            .map(|c| {
                let seen: Vec<String> = c.must_see.iter().flat_map(|p| p.hits.clone()).collect();
                let forbidden_seen: Vec<String> =
                    c.must_not_see.iter().flat_map(|p| p.hits.clone()).collect();
                let missing: Vec<String> = c
                    .must_see
                    .iter()
                    .filter(|p| p.hits.is_empty())
                    .map(|p| p.source.clone())
                    .collect();
                let (verdict, note) = if !forbidden_seen.is_empty() {
                    (Verdict::Invalid, None)
                } else if !c.broken.is_empty() {
                    (Verdict::Unknown, Some(c.broken.join("; ")))
                } else if c.must_see.is_empty() && c.must_not_see.is_empty() {
                    (
                        Verdict::Unknown,
                        Some("this flag value has no log patterns".to_string()),
                    )
                } else if c.must_see.is_empty() {
                    (
                        Verdict::Unknown,
                        Some(
                            "only must-not-see patterns: absence alone proves nothing".to_string(),
                        ),
                    )
                } else if missing.is_empty() {
                    (Verdict::Valid, None)
                } else if self.lines == 0 {
                    (
                        Verdict::Unknown,
                        Some("no log lines from the target".to_string()),
                    )
                } else {
                    (
                        Verdict::Unknown,
                        Some("a must-see pattern never appeared in the log".to_string()),
                    )
                };
                PathVerdict {
                    flag: c.check.flag.clone(),
                    value: c.check.value.clone(),
                    verdict,
                    seen,
                    forbidden_seen,
                    missing,
                    note,
                }
            })
            .collect();
        ValidationReport {
            checks,
            unknown_env: self.unknown_env.clone(),
            lines_scanned: self.lines,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(flag: &str, see: &[&str], not: &[&str]) -> PathCheck {
        PathCheck {
            flag: flag.into(),
            value: "v".into(),
            must_see: see.iter().map(|s| s.to_string()).collect(),
            must_not_see: not.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn verdicts_follow_the_evidence() {
        let mut s = PathScanner::new(&[
            check("moe", &["(?i)marlin"], &["cutlass.*moe"]),
            check("attn", &["TRITON_ATTN"], &[]),
            check("kv", &["fp8"], &["bf16 kv"]),
            check("graphs", &[], &["enforce_eager"]),
            check("broken", &["("], &[]),
        ]);
        // Each call says whether the line was new evidence.
        assert!(s.scan("Using Marlin MXFP4 MoE kernel", None));
        assert!(s.scan("Using cutlass fused moe for layer 3", None));
        assert!(s.scan("attention backend TRITON_ATTN", None));
        assert!(!s.scan("an unrelated line", None));
        assert!(s.scan(
            "Unknown vLLM environment variable detected: X",
            Some("X".into()),
        ));
        assert!(!s.scan("again", Some("X".into())));
        let r = s.report();
        let v: Vec<Verdict> = r.checks.iter().map(|c| c.verdict).collect();
        assert_eq!(
            v,
            vec![
                Verdict::Invalid,
                Verdict::Valid,
                Verdict::Unknown,
                Verdict::Unknown,
                Verdict::Unknown
            ]
        );
        assert_eq!(
            r.checks[0].forbidden_seen,
            vec!["Using cutlass fused moe for layer 3"]
        );
        assert_eq!(r.checks[0].seen, vec!["Using Marlin MXFP4 MoE kernel"]);
        assert_eq!(r.checks[2].missing, vec!["fp8"]);
        assert!(
            r.checks[4]
                .note
                .as_deref()
                .unwrap()
                .contains("not a valid regex")
        );
        assert_eq!(r.unknown_env, vec!["X"]);
        assert_eq!(r.overall(), Verdict::Invalid);
        assert_eq!(r.lines_scanned, 6);
        assert!(r.warnings()[0].contains("X"));
    }

    #[test]
    fn overall_is_valid_only_when_every_check_is() {
        let mut s = PathScanner::new(&[check("a", &["x"], &[]), check("b", &["y"], &[])]);
        s.scan("x", None);
        assert_eq!(s.report().overall(), Verdict::Unknown);
        s.scan("y", None);
        assert_eq!(s.report().overall(), Verdict::Valid);
        assert_eq!(PathScanner::new(&[]).report().overall(), Verdict::Unknown);
    }
}
