//! Log rules as data: phase patterns, fatal patterns and the unknown-environment-variable
//! pattern, loaded from TOML (the built-in table is `log-rules.toml` beside this file).

use super::Phase;
use anyhow::{Context, Result};
use regex::Regex;
use serde::Deserialize;
use std::path::Path;

/// The rules shipped with mxtune.
pub const BUILTIN_RULES: &str = include_str!("log-rules.toml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    phase: Vec<PhaseRuleFile>,
    fatal: FatalFile,
    unknown_env: UnknownEnvFile,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PhaseRuleFile {
    phase: Phase,
    patterns: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FatalFile {
    patterns: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UnknownEnvFile {
    pattern: String,
}

/// Compiled log rules.
#[derive(Debug, Clone)]
pub struct LogRules {
    phases: Vec<(Phase, Vec<Regex>)>,
    fatal: Vec<Regex>,
    unknown_env: Regex,
}

fn compile(pattern: &str, origin: &str, key: &str) -> Result<Regex> {
    Regex::new(pattern)
        .with_context(|| format!("{origin}: invalid regex {pattern:?} in [{key}]; fix the pattern"))
}

impl LogRules {
    /// The built-in rules.
    pub fn builtin() -> Result<Self> {
        Self::parse(BUILTIN_RULES, "built-in log-rules.toml")
    }

    /// Rules from a TOML file with the same layout as the built-in table.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read log rules {}", path.display()))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses rules from TOML text; `origin` names the source in error messages.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let file: RulesFile = toml::from_str(text)
            .with_context(|| format!("{origin}: not a valid log-rules table"))?;
        let mut phases = Vec::new();
        for rule in file.phase {
            let regexes = rule
                .patterns
                .iter()
                .map(|p| compile(p, origin, "phase"))
                .collect::<Result<Vec<_>>>()?;
            phases.push((rule.phase, regexes));
        }
        let fatal = file
            .fatal
            .patterns
            .iter()
            .map(|p| compile(p, origin, "fatal"))
            .collect::<Result<Vec<_>>>()?;
        let unknown_env = compile(&file.unknown_env.pattern, origin, "unknown_env")?;
        if unknown_env.captures_len() < 2 {
            anyhow::bail!(
                "{origin}: [unknown_env] pattern needs a capture group for the variable name"
            );
        }
        Ok(Self {
            phases,
            fatal,
            unknown_env,
        })
    }

    /// The phase a line announces, if any (the latest phase in table order wins).
    pub fn phase_of(&self, line: &str) -> Option<Phase> {
        self.phases
            .iter()
            .rev()
            .find(|(_, res)| res.iter().any(|r| r.is_match(line)))
            .map(|(p, _)| *p)
    }

    /// The fatal pattern a line matches, if any.
    pub fn fatal_match(&self, line: &str) -> Option<&str> {
        self.fatal
            .iter()
            .find(|r| r.is_match(line))
            .map(|r| r.as_str())
    }

    /// The environment variable an "unknown vLLM environment variable" line names.
    pub fn unknown_env(&self, line: &str) -> Option<String> {
        self.unknown_env
            .captures(line)
            .and_then(|c| c.get(1))
            .map(|m| m.as_str().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_rules_classify_vllm_lines() {
        let r = LogRules::builtin().unwrap();
        assert_eq!(
            r.phase_of("INFO 11-21 [default_loader.py:262] Loading weights took 41.2 seconds"),
            Some(Phase::LoadingWeights)
        );
        assert_eq!(
            r.phase_of("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%"),
            Some(Phase::CapturingGraphs)
        );
        assert_eq!(
            r.phase_of("INFO: Uvicorn running on http://0.0.0.0:8000"),
            Some(Phase::StartingServer)
        );
        assert_eq!(r.phase_of("hello"), None);
        // The bundled engine's own start-up lines.
        assert_eq!(
            r.phase_of("mxtune serve: model synthetic:tiny (4 layers, hidden 64)"),
            Some(Phase::LoadingWeights)
        );
        assert_eq!(
            r.phase_of("mxtune serve: ready on http://127.0.0.1:8000"),
            Some(Phase::StartingServer)
        );
        assert!(
            r.fatal_match("RuntimeError: Engine core proc EngineCore_DP0 died unexpectedly")
                .is_some()
        );
        assert!(
            r.fatal_match(
                "torch.AcceleratorError: CUDA error: an illegal instruction was encountered"
            )
            .is_some()
        );
        assert!(r.fatal_match("all good").is_none());
        assert_eq!(
            r.unknown_env("WARNING [envs.py:1] Unknown vLLM environment variable detected: VLLM_MXFP4_ACTIVATION").as_deref(),
            Some("VLLM_MXFP4_ACTIVATION")
        );
        assert_eq!(
            r.unknown_env("Unknown vLLM environment variable: FOO_BAR")
                .as_deref(),
            Some("FOO_BAR")
        );
    }

    #[test]
    fn bad_rules_name_the_origin_and_pattern() {
        let text = "[[phase]]\nphase = \"loading_weights\"\npatterns = [\"(\"]\n[fatal]\npatterns = []\n[unknown_env]\npattern = \"x(y)\"\n";
        let err = LogRules::parse(text, "my.toml").unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("my.toml") && msg.contains("\"(\""), "{msg}");
        let no_group = "[[phase]]\nphase = \"loading_weights\"\npatterns = []\n[fatal]\npatterns = []\n[unknown_env]\npattern = \"x\"\n";
        assert!(
            format!("{:#}", LogRules::parse(no_group, "b.toml").unwrap_err())
                .contains("capture group")
        );
    }
}
