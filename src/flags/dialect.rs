//! The dialect of a stock vLLM image (`container.vllm = "upstream"`): how each axis value is
//! said in upstream vLLM's own names, which log lines prove it, and — for a value upstream
//! cannot say — why not and the nearest value it can.
//!
//! Upstream picks its MXFP4 MoE backend from environment variables checked in a fixed order
//! (`VLLM_USE_FLASHINFER_MOE_MXFP4_BF16`, `…_MXFP8`, `…_MXFP8_CUTLASS`, `VLLM_MXFP4_USE_MARLIN`,
//! then a default by device), so `moe_backend` and `activation` are rendered as one pair: the
//! variable that selects the backend, and every variable checked before it set to `0` so an
//! image's own environment cannot win. Sources are listed in `docs/flags.md`.

use super::axes::{Activation, AxisValue, Evidence, MoeBackend, NO_EVIDENCE, VllmEffect};
use super::names;

/// How one axis value is said on a stock vLLM image.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Upstream {
    /// The fork rendering uses upstream names only: rendered the same way.
    Same,
    /// Upstream's own names, and the log lines that prove them.
    Own(&'static [VllmEffect], Evidence),
    /// Upstream cannot say it.
    Not(NotUpstream),
}

/// A value a stock vLLM image cannot express: why, and the nearest one it can.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotUpstream {
    /// The preset key at fault, e.g. `axes.tile`.
    pub path: &'static str,
    /// Its value.
    pub value: &'static str,
    /// The nearest upstream-expressible setting, as preset text, e.g. `tile = "auto"`.
    pub nearest: &'static str,
    /// Why upstream cannot say it.
    pub why: &'static str,
}

impl std::fmt::Display for NotUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} = \"{}\" cannot be expressed on a stock vLLM image (container.vllm = \"upstream\"): {}; nearest upstream value: {}",
            self.path, self.value, self.why, self.nearest
        )
    }
}

/// The upstream rendering of a MoE backend and activation pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UpstreamMoe {
    /// Environment variables, in the order upstream checks them.
    pub effects: &'static [VllmEffect],
    /// Evidence for `moe_backend`.
    pub moe: Evidence,
    /// Evidence for `activation`.
    pub activation: Evidence,
}

use VllmEffect::Env;
use names::{
    VLLM_MXFP4_USE_MARLIN as MARLIN, VLLM_USE_FLASHINFER_MOE_MXFP4_BF16 as BF16,
    VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8 as MXFP8,
    VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS as MXFP8_CUTLASS,
};

/// Upstream's fatal verdict on an explicitly chosen backend the device or build cannot run.
pub const REFUSED: &str = r"Mxfp4 MoE backend '?[A-Z0-9_]+'? does not support the deployment configuration|No MXFP4 MoE backend supports the deployment configuration|VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1 is set but the current device capability is not supported";

/// Any backend announced (`Using 'MARLIN' Mxfp4 MoE backend.`, or `Using MARLIN Mxfp4 MoE
/// backend out of potential backends: [...]`).
pub const ANY_BACKEND: &str = r"Using '?[A-Z0-9_]+'? Mxfp4 MoE backend";

const MARLIN_SEEN: &str = r"Using '?(BATCHED_)?MARLIN'? Mxfp4 MoE backend";
const NOT_MARLIN: &str =
    r"Using '?(FLASHINFER_[A-Z0-9_]+|TRITON[A-Z_]*|CK|XPU)'? Mxfp4 MoE backend";
const CUTLASS_MXFP8_SEEN: &str = r"Using '?FLASHINFER_CUTLASS_MXFP4_MXFP8'? Mxfp4 MoE backend";
const NOT_CUTLASS_MXFP8: &str = r"Using '?(FLASHINFER_TRTLLM_[A-Z0-9_]+|FLASHINFER_CUTLASS_MXFP4_BF16|(BATCHED_)?MARLIN|TRITON[A-Z_]*|CK|XPU)'? Mxfp4 MoE backend";
const CUTLASS_BF16_SEEN: &str = r"Using '?FLASHINFER_CUTLASS_MXFP4_BF16'? Mxfp4 MoE backend";
const NOT_CUTLASS_BF16: &str = r"Using '?(FLASHINFER_TRTLLM_[A-Z0-9_]+|FLASHINFER_CUTLASS_MXFP4_MXFP8|(BATCHED_)?MARLIN|TRITON[A-Z_]*|CK|XPU)'? Mxfp4 MoE backend";
const TRTLLM_BF16_SEEN: &str = r"Using '?FLASHINFER_TRTLLM_MXFP4_BF16'? Mxfp4 MoE backend";
const NOT_TRTLLM_BF16: &str = r"Using '?(FLASHINFER_TRTLLM_MXFP4_MXFP8|FLASHINFER_CUTLASS_[A-Z0-9_]+|(BATCHED_)?MARLIN|TRITON[A-Z_]*|CK|XPU)'? Mxfp4 MoE backend";
const TRTLLM_MXFP8_SEEN: &str = r"Using '?FLASHINFER_TRTLLM_MXFP4_MXFP8'? Mxfp4 MoE backend";
const NOT_TRTLLM_MXFP8: &str = r"Using '?(FLASHINFER_TRTLLM_MXFP4_BF16|FLASHINFER_CUTLASS_[A-Z0-9_]+|(BATCHED_)?MARLIN|TRITON[A-Z_]*|CK|XPU)'? Mxfp4 MoE backend";
const MXFP8_SEEN: &str = r"Using '?[A-Z0-9_]*_MXFP8'? Mxfp4 MoE backend";

const fn ev(must_see: &'static [&'static str], must_not_see: &'static [&'static str]) -> Evidence {
    Evidence {
        must_see,
        must_not_see,
    }
}

const BF16_ACT: Evidence = ev(&[ANY_BACKEND], &[MXFP8_SEEN, REFUSED]);
const MXFP8_ACT: Evidence = ev(&[MXFP8_SEEN], &[REFUSED]);

fn not(
    path: &'static str,
    value: &'static str,
    nearest: &'static str,
    why: &'static str,
) -> NotUpstream {
    NotUpstream {
        path,
        value,
        nearest,
        why,
    }
}

/// How a stock vLLM image says `moe_backend` = `b` with `activation` = `a`.
pub fn upstream_moe(b: MoeBackend, a: Activation) -> Result<UpstreamMoe, NotUpstream> {
    use Activation as A;
    use MoeBackend as M;
    const MOE: &str = MoeBackend::PATH;
    const ACT: &str = Activation::PATH;
    let pair = |effects, moe, activation| {
        Ok(UpstreamMoe {
            effects,
            moe,
            activation,
        })
    };
    if a == A::Q8 {
        return Err(not(
            ACT,
            "q8",
            "activation = \"bf16\"",
            "int8 activation blocks exist only in the bundled engine",
        ));
    }
    if a == A::Fp8 {
        return Err(not(
            ACT,
            "fp8",
            "activation = \"mxfp8\" with moe_backend = \"cutlass\"",
            "upstream's MXFP4 MoE backends take BF16 or MXFP8 activations, never plain FP8",
        ));
    }
    match (b, a) {
        (M::Auto, A::Auto) => pair(&[], ev(&[ANY_BACKEND], &[REFUSED]), NO_EVIDENCE),
        // Upstream's default candidates are all BF16 backends; naming the MXFP8 switches
        // off keeps an image's own environment from choosing one.
        (M::Auto, A::Bf16) => pair(
            &[Env(&MXFP8, "0"), Env(&MXFP8_CUTLASS, "0")],
            ev(&[ANY_BACKEND], &[REFUSED]),
            BF16_ACT,
        ),
        (M::Auto, _) => Err(not(
            ACT,
            a.as_str(),
            "moe_backend = \"cutlass\" (or \"trtllm-mxfp8\" on SM100)",
            "upstream selects an MXFP8 backend only by naming it",
        )),
        (M::Marlin, A::Auto | A::Bf16) => pair(
            &[
                Env(&BF16, "0"),
                Env(&MXFP8, "0"),
                Env(&MXFP8_CUTLASS, "0"),
                Env(&MARLIN, "1"),
            ],
            ev(&[MARLIN_SEEN], &[NOT_MARLIN, REFUSED]),
            if a == A::Bf16 { BF16_ACT } else { NO_EVIDENCE },
        ),
        (M::Marlin, _) => Err(not(
            ACT,
            a.as_str(),
            "activation = \"bf16\" (or moe_backend = \"cutlass\" for MXFP8)",
            "Marlin runs BF16 activations only (weight-only FP4)",
        )),
        (M::Cutlass, A::Auto | A::Mxfp8) => pair(
            &[Env(&BF16, "0"), Env(&MXFP8, "0"), Env(&MXFP8_CUTLASS, "1")],
            ev(&[CUTLASS_MXFP8_SEEN], &[NOT_CUTLASS_MXFP8, REFUSED]),
            MXFP8_ACT,
        ),
        // On SM90 the BF16 switch means CUTLASS; on SM100 it means TRT-LLM (a rule says so).
        (M::Cutlass, A::Bf16) => pair(
            &[Env(&BF16, "1")],
            ev(&[CUTLASS_BF16_SEEN], &[NOT_CUTLASS_BF16, REFUSED]),
            BF16_ACT,
        ),
        (M::Trtllm, A::Auto | A::Bf16) => pair(
            &[Env(&BF16, "1")],
            ev(&[TRTLLM_BF16_SEEN], &[NOT_TRTLLM_BF16, REFUSED]),
            if a == A::Bf16 { BF16_ACT } else { NO_EVIDENCE },
        ),
        (M::Trtllm, _) => Err(not(
            MOE,
            "trtllm",
            "moe_backend = \"trtllm-mxfp8\"",
            "upstream's TRT-LLM backend with MXFP8 activations is its own switch",
        )),
        (M::TrtllmMxfp8, A::Auto | A::Mxfp8) => pair(
            &[Env(&BF16, "0"), Env(&MXFP8, "1")],
            ev(&[TRTLLM_MXFP8_SEEN], &[NOT_TRTLLM_MXFP8, REFUSED]),
            MXFP8_ACT,
        ),
        (M::TrtllmMxfp8, _) => Err(not(
            ACT,
            a.as_str(),
            "activation = \"mxfp8\"",
            "trtllm-mxfp8 runs MXFP8 activations",
        )),
        (M::Triton, _) => Err(not(
            MOE,
            "triton",
            "moe_backend = \"auto\" (upstream picks Triton by itself on SM90)",
            "no upstream switch forces the Triton MoE",
        )),
        (M::Gemv, _) => Err(not(
            MOE,
            "gemv",
            "moe_backend = \"marlin\"",
            "the GEMV MoE exists only in the fork's legacy selector and the bundled engine",
        )),
        (M::Grouped, _) => Err(not(
            MOE,
            "grouped",
            "moe_backend = \"cutlass\"",
            "the grouped MoE kernel exists only in the bundled engine",
        )),
        (M::Cutlass, _) => Err(not(
            ACT,
            a.as_str(),
            "activation = \"mxfp8\"",
            "upstream's CUTLASS MoE takes MXFP8 or BF16 activations",
        )),
    }
}

/// Why upstream cannot say a fork-only value (tile, layers, sinks), with its nearest value.
pub(crate) const fn fork_only(
    path: &'static str,
    value: &'static str,
    nearest: &'static str,
    why: &'static str,
) -> Upstream {
    Upstream::Not(NotUpstream {
        path,
        value,
        nearest,
        why,
    })
}

/// The upstream rendering of `moe_backend` with `activation` left at `auto`, and of
/// `activation` with `moe_backend` at `auto`, for the per-value tables.
pub(crate) fn moe_alone(b: MoeBackend) -> Upstream {
    match upstream_moe(b, Activation::Auto) {
        Ok(p) => Upstream::Own(p.effects, p.moe),
        Err(n) => Upstream::Not(n),
    }
}

/// See [`moe_alone`].
pub(crate) fn activation_alone(a: Activation) -> Upstream {
    match upstream_moe(MoeBackend::Auto, a) {
        Ok(p) => Upstream::Own(p.effects, p.activation),
        Err(n) => Upstream::Not(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::model::{FlagSet, VllmFlavor};
    use crate::flags::render::{RenderContext, render_with};
    use crate::vocab::TargetKind;

    /// What one flag set adds to the all-default launch: env pairs, extra argv, or the error.
    fn delta(fs: &FlagSet) -> String {
        delta_at(fs, None)
    }

    /// [`delta`] for a stock image of vLLM `release` (`None`: unknown).
    fn delta_at(fs: &FlagSet, release: Option<&str>) -> String {
        let ctx = RenderContext {
            home: Some("/home/op".into()),
            vllm_version: release.map(|r| crate::flags::versions::ImageVersion {
                version: crate::flags::versions::VllmVersion::parse(r).unwrap(),
                source: "test".into(),
            }),
            ..Default::default()
        };
        let mut base_fs = FlagSet::default();
        base_fs.container.vllm = fs.container.vllm;
        let base = render_with(&base_fs, TargetKind::Docker, &ctx).unwrap();
        let spec = match render_with(fs, TargetKind::Docker, &ctx) {
            Ok(s) => s,
            // The key at fault and the nearest value: the rest of the message is prose.
            Err(e) => {
                let e = e.to_string();
                let (fault, rest) = e.split_once(" cannot be expressed").unwrap_or((&e, ""));
                let nearest = rest.split("nearest upstream value: ").nth(1).unwrap_or("?");
                return match rest {
                    "" => format!("error: {e}"),
                    _ => format!("not upstream: {fault} -> {nearest}"),
                };
            }
        };
        let env: Vec<String> = spec
            .env
            .iter()
            .filter(|(k, v)| base.env.get(*k) != Some(v))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(spec.argv[..base.argv.len()], base.argv[..], "argv prefix");
        let argv = spec.argv[base.argv.len()..].join(" ");
        let files: Vec<String> = spec
            .container
            .map(|c| c.files.keys().cloned().collect())
            .unwrap_or_default();
        let mut out = format!("env [{}] argv [{argv}]", env.join(" "));
        if !files.is_empty() {
            out.push_str(&format!(" files [{}]", files.join(" ")));
        }
        if !spec.warnings.is_empty() {
            out.push_str(&format!(" warnings {}", spec.warnings.len()));
        }
        out
    }

    fn flavour_name(f: VllmFlavor) -> &'static str {
        match f {
            VllmFlavor::Fork => "fork",
            VllmFlavor::Upstream => "upstream",
        }
    }

    /// Every axis value alone, on both flavours, and every MoE pair on a stock image.
    fn table() -> String {
        let mut lines = Vec::new();
        for flavour in [VllmFlavor::Fork, VllmFlavor::Upstream] {
            for a in crate::flags::axes::all_axes() {
                if a.path == crate::flags::axes::Device::PATH {
                    continue;
                }
                for (value, _, _) in &a.values {
                    let mut fs = FlagSet::default();
                    fs.container.vllm = flavour;
                    fs.set_axis(a.key, value).unwrap();
                    if a.key == "speculative" && *value == "eagle3" {
                        fs.axes.spec_model = Some("d/v3".into());
                    }
                    lines.push(format!(
                        "{} {}={value}: {}",
                        flavour_name(flavour),
                        a.key,
                        delta(&fs)
                    ));
                }
            }
        }
        for b in MoeBackend::all() {
            for act in Activation::all() {
                if *act == Activation::Auto || *b == MoeBackend::Auto {
                    continue;
                }
                let mut fs = FlagSet::default();
                fs.axes.moe_backend = *b;
                fs.axes.activation = *act;
                lines.push(format!("upstream {b}+{act}: {}", delta(&fs)));
            }
        }
        lines.join("\n")
    }

    #[test]
    fn every_value_renders_in_each_flavours_dialect() {
        let got = table();
        let want = EXPECTED.trim();
        for (g, w) in got.lines().zip(want.lines()) {
            assert_eq!(g, w);
        }
        assert_eq!(got.lines().count(), want.lines().count(), "{got}");
    }

    /// Names upstream renamed or added across releases render as the image's release says them.
    #[test]
    fn names_follow_the_image_release() {
        let cases: &[(&str, &str, &str)] = &[
            ("attention_backend", "TRITON_ATTN", "0.11.2"),
            ("attention_backend", "TRITON_ATTN", "0.12.0"),
            ("attention_backend", "TRITON_ATTN", "0.13.0"),
            ("attention_backend", "FLASHINFER", "0.10.2"),
            ("moe_backend", "cutlass", "0.10.1"),
            ("moe_backend", "cutlass", "0.10.2"),
            ("moe_backend", "marlin", "0.10.1"),
            ("moe_backend", "trtllm-mxfp8", "0.10.1"),
            ("moe_backend", "trtllm", "0.9.2"),
            ("moe_backend", "marlin", "0.9.2"),
            ("activation", "bf16", "0.10.1"),
            ("moe_backend", "marlin", "0.29.0"),
        ];
        let mut got = Vec::new();
        for (key, value, release) in cases {
            let mut fs = FlagSet::default();
            fs.container.vllm = VllmFlavor::Upstream;
            fs.set_axis(key, value).unwrap();
            got.push(format!(
                "{release} {key}={value}: {}",
                delta_at(&fs, Some(release))
            ));
        }
        let want = RELEASES.trim().lines().collect::<Vec<_>>();
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g, w);
        }
        assert_eq!(got.len(), want.len(), "{got:#?}");

        let mut cfg = FlagSet::default();
        cfg.container.vllm = VllmFlavor::Upstream;
        cfg.axes.attention_config = Some(r#"{"backend": "TRITON_ATTN"}"#.into());
        let ctx = |r: &str| RenderContext {
            home: Some("/home/op".into()),
            vllm_version: Some(crate::flags::versions::ImageVersion {
                version: crate::flags::versions::VllmVersion::parse(r).unwrap(),
                source: "test".into(),
            }),
            ..Default::default()
        };
        let err = render_with(&cfg, TargetKind::Docker, &ctx("0.12.0"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--attention-config first appears in vLLM 0.13.0"),
            "{err}"
        );
        let spec = render_with(&cfg, TargetKind::Docker, &ctx("0.13.0")).unwrap();
        assert!(spec.argv.contains(&"--attention-config".to_string()));
        let d = spec.dialect.unwrap();
        assert_eq!(
            (d.flavour.as_str(), d.vllm_version.as_deref(), d.note),
            ("upstream", Some("0.13.0"), None)
        );
    }

    const RELEASES: &str = r#"
0.11.2 attention_backend=TRITON_ATTN: env [VLLM_ATTENTION_BACKEND=TRITON_ATTN] argv []
0.12.0 attention_backend=TRITON_ATTN: env [VLLM_ATTENTION_BACKEND=TRITON_ATTN] argv []
0.13.0 attention_backend=TRITON_ATTN: env [] argv [--attention-backend TRITON_ATTN]
0.10.2 attention_backend=FLASHINFER: env [VLLM_ATTENTION_BACKEND=FLASHINFER] argv []
0.10.1 moe_backend=cutlass: not upstream: axes.moe_backend = "cutlass" -> moe_backend = "auto" (or an image of vLLM 0.10.2 or newer)
0.10.2 moe_backend=cutlass: env [VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS=1] argv []
0.10.1 moe_backend=marlin: env [VLLM_MXFP4_USE_MARLIN=1 VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=0] argv []
0.10.1 moe_backend=trtllm-mxfp8: env [VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1] argv []
0.9.2 moe_backend=trtllm: not upstream: axes.moe_backend = "trtllm" -> moe_backend = "auto" (or an image of vLLM 0.10.1 or newer)
0.9.2 moe_backend=marlin: not upstream: axes.moe_backend = "marlin" -> moe_backend = "auto" (or an image of vLLM 0.10.1 or newer)
0.10.1 activation=bf16: env [VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=0] argv []
0.29.0 moe_backend=marlin: env [VLLM_MXFP4_USE_MARLIN=1 VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS=0] argv []
"#;

    const EXPECTED: &str = r#"
fork moe_backend=auto: env [] argv []
fork moe_backend=marlin: env [VLLM_MXFP4_BACKEND=MARLIN] argv []
fork moe_backend=cutlass: env [VLLM_MXFP4_BACKEND=CUTLASS] argv []
fork moe_backend=triton: env [VLLM_MXFP4_BACKEND=TRITON] argv []
fork moe_backend=trtllm: env [VLLM_MXFP4_BACKEND=TRTLLM] argv []
fork moe_backend=trtllm-mxfp8: env [VLLM_MXFP4_BACKEND=TRTLLM_MXFP8] argv []
fork moe_backend=gemv: env [VLLM_MXFP4_MOE_KERNEL=gemv] argv [] warnings 1
fork moe_backend=grouped: error: axes.moe_backend = "grouped" has no vLLM rendering; valid on vLLM: auto, marlin, cutlass, triton, trtllm, trtllm-mxfp8, gemv
fork activation=auto: env [] argv []
fork activation=bf16: env [VLLM_MXFP4_ACTIVATION=bf16] argv [] warnings 1
fork activation=mxfp8: env [VLLM_MXFP4_ACTIVATION=mxfp8] argv [] warnings 1
fork activation=fp8: env [VLLM_MXFP4_ACTIVATION=fp8] argv [] warnings 1
fork activation=q8: error: axes.activation = "q8" has no vLLM rendering; valid on vLLM: auto, bf16, mxfp8, fp8
fork tile=auto: env [] argv []
fork tile=128x128: env [FLASHINFER_DEBUG_TILE_OVERRIDE=1] argv [] files [/tmp/flashinfer_moe_tile]
fork tile=64x128: env [FLASHINFER_DEBUG_TILE_OVERRIDE=1] argv [] files [/tmp/flashinfer_moe_tile]
fork mxfp4_layers=moe: env [] argv []
fork mxfp4_layers=moe,qkv,o: env [] argv [--mxfp4-layers moe,qkv,o]
fork mxfp4_layers=moe,qkv,o,lm_head: env [] argv [--mxfp4-layers moe,qkv,o,lm_head]
fork attention_backend=auto: env [] argv []
fork attention_backend=TRITON_ATTN: env [] argv [--attention-backend TRITON_ATTN]
fork attention_backend=FLASHINFER: env [] argv [--attention-backend FLASHINFER]
fork attention_backend=FLASH_ATTN: env [] argv [--attention-backend FLASH_ATTN]
fork sinks=auto: env [] argv []
fork sinks=on: env [VLLM_ATTENTION_SINKS=true] argv []
fork sinks=off: env [VLLM_ATTENTION_SINKS=false] argv []
fork kv_cache_dtype=auto: env [] argv []
fork kv_cache_dtype=bf16: env [] argv [--kv-cache-dtype bfloat16]
fork kv_cache_dtype=fp8: env [] argv [--kv-cache-dtype fp8]
fork speculative=off: env [] argv []
fork speculative=eagle3-short: env [] argv [--speculative-config {"method":"eagle3","model":"nvidia/gpt-oss-120b-Eagle3-short-context","num_speculative_tokens":3}]
fork speculative=eagle3-long: env [] argv [--speculative-config {"method":"eagle3","model":"nvidia/gpt-oss-120b-Eagle3-long-context","num_speculative_tokens":3}]
fork speculative=eagle3-throughput: env [] argv [--speculative-config {"method":"eagle3","model":"nvidia/gpt-oss-120b-Eagle3-throughput","num_speculative_tokens":3}]
fork speculative=eagle3: env [] argv [--speculative-config {"method":"eagle3","model":"d/v3","num_speculative_tokens":3}]
fork speculative=ngram: env [] argv [--speculative-config {"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":5,"prompt_lookup_min":1}]
fork speculative=suffix: env [] argv [--speculative-config {"method":"suffix","num_speculative_tokens":3}]
fork cuda_graphs=on: env [] argv []
fork cuda_graphs=off: env [] argv [--enforce-eager]
upstream moe_backend=auto: env [] argv []
upstream moe_backend=marlin: env [VLLM_MXFP4_USE_MARLIN=1 VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS=0] argv []
upstream moe_backend=cutlass: env [VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS=1] argv []
upstream moe_backend=triton: not upstream: axes.moe_backend = "triton" -> moe_backend = "auto" (upstream picks Triton by itself on SM90)
upstream moe_backend=trtllm: env [VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1] argv []
upstream moe_backend=trtllm-mxfp8: env [VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1] argv []
upstream moe_backend=gemv: not upstream: axes.moe_backend = "gemv" -> moe_backend = "marlin"
upstream moe_backend=grouped: not upstream: axes.moe_backend = "grouped" -> moe_backend = "cutlass"
upstream activation=auto: env [] argv []
upstream activation=bf16: env [VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS=0] argv []
upstream activation=mxfp8: not upstream: axes.activation = "mxfp8" -> moe_backend = "cutlass" (or "trtllm-mxfp8" on SM100)
upstream activation=fp8: not upstream: axes.activation = "fp8" -> activation = "mxfp8" with moe_backend = "cutlass"
upstream activation=q8: not upstream: axes.activation = "q8" -> activation = "bf16"
upstream tile=auto: env [] argv []
upstream tile=128x128: not upstream: axes.tile = "128x128" -> tile = "auto"
upstream tile=64x128: not upstream: axes.tile = "64x128" -> tile = "auto"
upstream mxfp4_layers=moe: env [] argv []
upstream mxfp4_layers=moe,qkv,o: not upstream: axes.mxfp4_layers = "moe,qkv,o" -> mxfp4_layers = "moe"
upstream mxfp4_layers=moe,qkv,o,lm_head: not upstream: axes.mxfp4_layers = "moe,qkv,o,lm_head" -> mxfp4_layers = "moe"
upstream attention_backend=auto: env [] argv []
upstream attention_backend=TRITON_ATTN: env [] argv [--attention-backend TRITON_ATTN]
upstream attention_backend=FLASHINFER: env [] argv [--attention-backend FLASHINFER]
upstream attention_backend=FLASH_ATTN: env [] argv [--attention-backend FLASH_ATTN]
upstream sinks=auto: env [] argv []
upstream sinks=on: not upstream: axes.sinks = "on" -> sinks = "auto"
upstream sinks=off: not upstream: axes.sinks = "off" -> sinks = "auto"
upstream kv_cache_dtype=auto: env [] argv []
upstream kv_cache_dtype=bf16: env [] argv [--kv-cache-dtype bfloat16]
upstream kv_cache_dtype=fp8: env [] argv [--kv-cache-dtype fp8]
upstream speculative=off: env [] argv []
upstream speculative=eagle3-short: env [] argv [--speculative-config {"method":"eagle3","model":"nvidia/gpt-oss-120b-Eagle3-short-context","num_speculative_tokens":3}]
upstream speculative=eagle3-long: env [] argv [--speculative-config {"method":"eagle3","model":"nvidia/gpt-oss-120b-Eagle3-long-context","num_speculative_tokens":3}]
upstream speculative=eagle3-throughput: env [] argv [--speculative-config {"method":"eagle3","model":"nvidia/gpt-oss-120b-Eagle3-throughput","num_speculative_tokens":3}]
upstream speculative=eagle3: env [] argv [--speculative-config {"method":"eagle3","model":"d/v3","num_speculative_tokens":3}]
upstream speculative=ngram: env [] argv [--speculative-config {"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":5,"prompt_lookup_min":1}]
upstream speculative=suffix: env [] argv [--speculative-config {"method":"suffix","num_speculative_tokens":3}]
upstream cuda_graphs=on: env [] argv []
upstream cuda_graphs=off: env [] argv [--compilation-config {"cudagraph_mode": "NONE"}]
upstream marlin+bf16: env [VLLM_MXFP4_USE_MARLIN=1 VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS=0] argv []
upstream marlin+mxfp8: not upstream: axes.activation = "mxfp8" -> activation = "bf16" (or moe_backend = "cutlass" for MXFP8)
upstream marlin+fp8: not upstream: axes.activation = "fp8" -> activation = "mxfp8" with moe_backend = "cutlass"
upstream marlin+q8: not upstream: axes.activation = "q8" -> activation = "bf16"
upstream cutlass+bf16: env [VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1] argv []
upstream cutlass+mxfp8: env [VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS=1] argv []
upstream cutlass+fp8: not upstream: axes.activation = "fp8" -> activation = "mxfp8" with moe_backend = "cutlass"
upstream cutlass+q8: not upstream: axes.activation = "q8" -> activation = "bf16"
upstream triton+bf16: not upstream: axes.moe_backend = "triton" -> moe_backend = "auto" (upstream picks Triton by itself on SM90)
upstream triton+mxfp8: not upstream: axes.moe_backend = "triton" -> moe_backend = "auto" (upstream picks Triton by itself on SM90)
upstream triton+fp8: not upstream: axes.activation = "fp8" -> activation = "mxfp8" with moe_backend = "cutlass"
upstream triton+q8: not upstream: axes.activation = "q8" -> activation = "bf16"
upstream trtllm+bf16: env [VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1] argv []
upstream trtllm+mxfp8: not upstream: axes.moe_backend = "trtllm" -> moe_backend = "trtllm-mxfp8"
upstream trtllm+fp8: not upstream: axes.activation = "fp8" -> activation = "mxfp8" with moe_backend = "cutlass"
upstream trtllm+q8: not upstream: axes.activation = "q8" -> activation = "bf16"
upstream trtllm-mxfp8+bf16: not upstream: axes.activation = "bf16" -> activation = "mxfp8"
upstream trtllm-mxfp8+mxfp8: env [VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=0 VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1] argv []
upstream trtllm-mxfp8+fp8: not upstream: axes.activation = "fp8" -> activation = "mxfp8" with moe_backend = "cutlass"
upstream trtllm-mxfp8+q8: not upstream: axes.activation = "q8" -> activation = "bf16"
upstream gemv+bf16: not upstream: axes.moe_backend = "gemv" -> moe_backend = "marlin"
upstream gemv+mxfp8: not upstream: axes.moe_backend = "gemv" -> moe_backend = "marlin"
upstream gemv+fp8: not upstream: axes.activation = "fp8" -> activation = "mxfp8" with moe_backend = "cutlass"
upstream gemv+q8: not upstream: axes.activation = "q8" -> activation = "bf16"
upstream grouped+bf16: not upstream: axes.moe_backend = "grouped" -> moe_backend = "cutlass"
upstream grouped+mxfp8: not upstream: axes.moe_backend = "grouped" -> moe_backend = "cutlass"
upstream grouped+fp8: not upstream: axes.activation = "fp8" -> activation = "mxfp8" with moe_backend = "cutlass"
upstream grouped+q8: not upstream: axes.activation = "q8" -> activation = "bf16"
"#;
}
