//! What a launch contributes to the run record: the target's facts, the environment seen
//! inside the container, and what was observed (kernel-path verdicts, phases, warnings).

use super::follow::Launch;
use super::target::TargetFacts;
use super::verdict::{ValidationReport, Verdict};
use crate::record::schema::{
    DockerFacts, EngineFacts, Environment, KernelPathCheck, Observed, Phase as RecordPhase,
    SourceRepo, TargetInfo, Verdict as RecordVerdict,
};

/// The record's kernel-path checks for a validation report.
pub fn kernel_path_checks(report: &ValidationReport) -> Vec<KernelPathCheck> {
    report
        .checks
        .iter()
        .map(|c| {
            let reason = if !c.forbidden_seen.is_empty() {
                Some("a must-not-see pattern appeared".to_string())
            } else if c.verdict == Verdict::Unknown {
                let missing = if c.missing.is_empty() {
                    String::new()
                } else {
                    format!(" (never saw: {})", c.missing.join(", "))
                };
                Some(format!("{}{missing}", c.note.clone().unwrap_or_default()))
            } else {
                None
            };
            KernelPathCheck {
                flag: c.flag.clone(),
                value: c.value.clone(),
                verdict: match c.verdict {
                    Verdict::Valid => RecordVerdict::Valid,
                    Verdict::Invalid => RecordVerdict::Invalid,
                    Verdict::Unknown => RecordVerdict::Unknown,
                },
                lines: c.forbidden_seen.iter().chain(&c.seen).cloned().collect(),
                reason,
            }
        })
        .collect()
}

/// What the launch observed; `log_file` is the log's path relative to the runs directory.
pub fn observed(launch: &Launch, log_file: Option<String>) -> Observed {
    let report = launch.report();
    let history = launch.history();
    let mut warnings = history.warnings;
    for w in report.warnings() {
        if !warnings.contains(&w) {
            warnings.push(w);
        }
    }
    Observed {
        kernel_path: kernel_path_checks(&report),
        startup_s: history.startup_s,
        phases: history
            .phases
            .into_iter()
            .map(|p| RecordPhase {
                name: p.phase.to_string(),
                at: p.at,
                last_probe: p.last_probe,
            })
            .collect(),
        warnings,
        log_file,
        vllm_version: history.vllm_version,
    }
}

/// Fills the record's target and environment sections from the target's facts.
pub fn apply_facts(facts: &TargetFacts, target: &mut TargetInfo, env: &mut Environment) {
    target.url = Some(facts.url.clone());
    if let Some(image) = &facts.image {
        target.docker = Some(DockerFacts {
            image: image.clone(),
            image_id: facts.image_id.clone(),
            digest: facts.image_digests.first().cloned(),
            container_id: facts.container_id.clone(),
            container_name: Some(facts.name.clone()),
            ..Default::default()
        });
    }
    if let Some(program) = &facts.program {
        target.engine = Some(EngineFacts {
            path: program.clone(),
            ..Default::default()
        });
    }
    for tree in &facts.source_trees {
        let name = tree
            .path
            .rsplit('/')
            .find(|s| !s.is_empty())
            .unwrap_or(&tree.path)
            .to_string();
        env.source_repos.push(SourceRepo {
            name,
            path: tree.path.clone(),
            sha: Some(tree.git_sha.clone()),
            ..Default::default()
        });
    }
    if let Some(freeze) = &facts.pip_freeze {
        env.pip_freeze = Some(
            freeze
                .lines()
                .map(str::to_string)
                .filter(|l| !l.is_empty())
                .collect(),
        );
    }
    if let Some(smi) = &facts.nvidia_smi {
        env.container_nvidia_smi = Some(smi.clone());
    }
    env.nodes = facts.nodes.clone();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::target::SourceTree;
    use crate::launch::verdict::PathScanner;
    use crate::vocab::PathCheck;

    #[test]
    fn verdicts_and_facts_map_into_the_record() {
        let mut s = PathScanner::new(&[
            PathCheck {
                flag: "moe".into(),
                value: "marlin".into(),
                must_see: vec!["marlin".into()],
                must_not_see: vec!["cutlass".into()],
            },
            PathCheck {
                flag: "kv".into(),
                value: "fp8".into(),
                must_see: vec!["fp8".into()],
                must_not_see: vec![],
            },
        ]);
        s.scan("marlin chosen", None);
        s.scan("cutlass too", None);
        let checks = kernel_path_checks(&s.report());
        assert_eq!(checks[0].verdict, RecordVerdict::Invalid);
        assert_eq!(checks[0].lines, vec!["cutlass too", "marlin chosen"]);
        assert_eq!(checks[1].verdict, RecordVerdict::Unknown);
        assert!(
            checks[1]
                .reason
                .as_deref()
                .unwrap()
                .contains("never saw: fp8")
        );

        let facts = TargetFacts {
            kind: "docker".into(),
            name: "mxtune-r1".into(),
            url: "http://127.0.0.1:8000".into(),
            image: Some("vllm:fork".into()),
            image_id: Some("sha256:ab".into()),
            image_digests: vec!["vllm@sha256:cd".into()],
            pip_freeze: Some("torch==2.9\nvllm==0.11\n".into()),
            source_trees: vec![SourceTree {
                path: "/workspace/vllm".into(),
                git_sha: "abc".into(),
            }],
            ..Default::default()
        };
        let mut t = TargetInfo::default();
        let mut e = Environment::default();
        apply_facts(&facts, &mut t, &mut e);
        let d = t.docker.unwrap();
        assert_eq!(
            (d.image.as_str(), d.digest.as_deref()),
            ("vllm:fork", Some("vllm@sha256:cd"))
        );
        assert_eq!(
            e.pip_freeze,
            Some(vec!["torch==2.9".to_string(), "vllm==0.11".to_string()])
        );
        assert_eq!(e.source_repos[0].name, "vllm");
        assert_eq!(e.source_repos[0].sha.as_deref(), Some("abc"));
    }
}
