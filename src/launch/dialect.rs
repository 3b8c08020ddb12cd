//! A stock image's vLLM version at launch: asked of the image before the launch, so the launch
//! is rendered in that release's names (`flags::versions`), and read again from the start-up
//! banner once the container runs, for the run record and to catch a disagreement.

use crate::flags::versions::{ImageVersion, VllmVersion};
use crate::flags::{FlagSet, RenderContext, VllmFlavor, render_with};
use crate::vocab::{LaunchSpec, TargetKind};
use anyhow::Result;
use bollard::Docker;
use regex::Regex;
use std::sync::OnceLock;
use std::time::Duration;

/// How long `vllm --version` may take: it imports vLLM (and torch), seconds when the image's
/// files are cached, up to a minute on a cold disk.
pub const PROBE_LIMIT: Duration = Duration::from_secs(120);

/// What the spec records as the source of a version asked of the image.
pub const FROM_IMAGE: &str = "vllm --version";

/// Renders `flags` for `kind`. For a stock vLLM image (`container.vllm = "upstream"`) on Docker
/// it first asks the image for its vLLM version, so the names are that release's; when that
/// fails the launch goes on, rendered for the newest known release, and the spec's `dialect`
/// says why.
pub async fn render_for_launch(
    flags: &FlagSet,
    kind: TargetKind,
    docker: Option<&Docker>,
) -> Result<LaunchSpec> {
    let mut ctx = RenderContext::from_env();
    if matches!(kind, TargetKind::Docker | TargetKind::DockerCluster)
        && flags.container.vllm == VllmFlavor::Upstream
    {
        let image = &flags.container.image;
        match docker {
            Some(d) => match super::docker::probe_vllm_version(d, image, PROBE_LIMIT).await {
                Ok(line) => {
                    ctx.vllm_version = VllmVersion::parse(&line).map(|version| ImageVersion {
                        version,
                        source: FROM_IMAGE.into(),
                    })
                }
                Err(e) => ctx.version_note = Some(format!("{e:#}")),
            },
            None => ctx.version_note = Some("no Docker engine to ask the image".into()),
        }
    }
    render_with(flags, kind, &ctx)
}

/// The vLLM version a start-up line announces: the API server's `vLLM API server version X`
/// or the engine's `Initializing a V1 LLM engine (vX) with config: …`.
pub fn banner_version(line: &str) -> Option<VllmVersion> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let re = RE
        .get_or_init(|| {
            Regex::new(
                r"vLLM API server version v?(\S+)|Initializing a V\d LLM engine \(v([^)\s]+)\)",
            )
            .ok()
        })
        .as_ref()?;
    let caps = re.captures(line)?;
    let text = caps.get(1).or_else(|| caps.get(2))?.as_str();
    VllmVersion::parse(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn banner_lines_of_upstream_releases_give_the_version() {
        for (line, want) in [
            (
                "(APIServer pid=1) INFO 10-02 09:12:01 [api_server.py:1839] vLLM API server version 0.11.0",
                "0.11.0",
            ),
            (
                "INFO 08-20 10:00:00 [api_server.py:1805] vLLM API server version 0.10.1.1",
                "0.10.1.1",
            ),
            (
                "INFO 11-25 10:00:00 [core.py:93] Initializing a V1 LLM engine (v0.11.2) with config: model='openai/gpt-oss-120b'",
                "0.11.2",
            ),
            (
                "INFO 01-10 [api_server.py:1] vLLM API server version 0.14.0rc1.dev3+gabc",
                "0.14.0rc1.dev3+gabc",
            ),
        ] {
            let v = banner_version(line).unwrap_or_else(|| panic!("{line}"));
            assert_eq!(v.raw, want, "{line}");
        }
        for line in [
            "INFO Uvicorn running on http://0.0.0.0:8000",
            "vLLM API server version",
            "Using 'MARLIN' Mxfp4 MoE backend.",
        ] {
            assert_eq!(banner_version(line), None, "{line}");
        }
    }
}
