//! `docs/flags.md`, generated from the tables so the page cannot drift from the code.

use super::axes::{
    Activation, AxisInfo, AxisValue, EngineReport, MoeBackend, VllmEffect, all_axes,
};
use super::dialect::{Upstream, upstream_moe};
use super::model::{CONTAINER_SETTINGS, FlagSet, SETTINGS};
use super::names::{self, NameKind};
use super::rules::{RULES, Severity};
use std::fmt::Write as _;

/// Repository path of the generated page.
pub const DOCS_PATH: &str = "docs/flags.md";

fn vllm_cell(v: Option<&[VllmEffect]>) -> String {
    let Some(effects) = v else {
        return "n/a".into();
    };
    if effects.is_empty() {
        return "(nothing)".into();
    }
    effects
        .iter()
        .map(|e| match e {
            VllmEffect::Env(n, v) => format!("`{}={v}` ({})", n.name, n.provenance.as_str()),
            VllmEffect::Flag(n) => format!("`{}` ({})", n.name, n.provenance.as_str()),
            VllmEffect::Arg(n, v) => format!("`{} {v}` ({})", n.name, n.provenance.as_str()),
            VllmEffect::File(p, c) => format!("file `{p}` = `{c}`"),
            VllmEffect::SpecConfig { method, drafter } => format!(
                "`--speculative-config` method `{method}`{} (upstream)",
                drafter
                    .map(|d| format!(", model `{d}`"))
                    .unwrap_or_default()
            ),
        })
        .collect::<Vec<_>>()
        .join(" + ")
}

fn engine_cell(a: &AxisInfo, e: Option<&[super::axes::EngineArg]>, report: EngineReport) -> String {
    let Some(args) = e else { return "n/a".into() };
    let mut s = if args.is_empty() {
        "(nothing)".to_string()
    } else {
        args.iter()
            .map(|a| format!("`{} {}`", a.0, a.1))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if let Some(k) = a.engine_key {
        match report {
            EngineReport::Exactly(v) => write!(s, "; reports `{k}={v}`").ok(),
            EngineReport::Any => write!(s, "; reports `{k}=<any>`").ok(),
        };
    }
    s
}

fn evidence_cell(ev: &super::axes::Evidence) -> String {
    let mut out = Vec::new();
    for r in ev.must_see {
        out.push(format!("see `{}`", esc(r)));
    }
    for r in ev.must_not_see {
        out.push(format!("not `{}`", esc(r)));
    }
    if out.is_empty() {
        "—".into()
    } else {
        out.join("; ")
    }
}

/// The section on stock images: every value in both dialects, and the MoE pair table.
fn flavours(w: &mut String) {
    let _ = writeln!(
        w,
        "\n## Fork and stock images: each value in both dialects\n"
    );
    let _ = writeln!(w, "{}\n", FLAVOURS.trim());
    let _ = writeln!(
        w,
        "| key | value | fork image (`vllm = \"fork\"`) | stock image (`vllm = \"upstream\"`) |"
    );
    let _ = writeln!(w, "|---|---|---|---|");
    for a in all_axes() {
        if a.path == super::axes::Device::PATH {
            continue;
        }
        for ((name, _, spec), up) in a.values.iter().zip(&a.upstream) {
            let stock = match up {
                Upstream::Same => match spec.vllm {
                    Some(_) => "same".to_string(),
                    None => "n/a".to_string(),
                },
                Upstream::Own(e, _) => vllm_cell(Some(e)),
                Upstream::Not(n) => format!("no: {}; nearest {}", n.why, n.nearest),
            };
            let _ = writeln!(
                w,
                "| `{}` | `{name}` | {} | {} |",
                a.path,
                esc(&vllm_cell(spec.vllm)),
                esc(&stock)
            );
        }
    }
    let _ = writeln!(
        w,
        "\nOn a stock image `moe_backend` and `activation` render as one pair:\n"
    );
    let _ = writeln!(
        w,
        "| moe_backend | activation | stock image | `moe_backend` evidence | `activation` evidence |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|");
    for b in MoeBackend::all() {
        for a in Activation::all() {
            match upstream_moe(*b, *a) {
                Ok(p) => {
                    let _ = writeln!(
                        w,
                        "| `{b}` | `{a}` | {} | {} | {} |",
                        esc(&vllm_cell(Some(p.effects))),
                        evidence_cell(&p.moe),
                        evidence_cell(&p.activation)
                    );
                }
                Err(n) => {
                    let _ = writeln!(
                        w,
                        "| `{b}` | `{a}` | error: {}; nearest {} | — | — |",
                        esc(n.why),
                        esc(n.nearest)
                    );
                }
            }
        }
    }
    let _ = writeln!(w, "\n{}", FLAVOUR_SOURCES.trim());
}

fn versions(w: &mut String) {
    use super::versions::{HISTORY, NEWEST_KNOWN, release_str};
    let _ = writeln!(w, "\n### vLLM versions\n");
    let _ = writeln!(w, "{}\n", VERSIONS.trim());
    let _ = writeln!(w, "| name | read since | releases before that | source |");
    let _ = writeln!(w, "|---|---|---|---|");
    for h in HISTORY {
        let before = match h.before {
            Some(old) => format!("`{}` (same value)", old.name),
            None => "cannot say it: a value needing it is refused, a `=0` is left out".into(),
        };
        let _ = writeln!(
            w,
            "| `{}` | {} | {before} | {} |",
            h.name.name,
            release_str(h.since),
            esc(h.source)
        );
    }
    let _ = writeln!(
        w,
        "\nNewest release checked: {NEWEST_KNOWN}. {}",
        VERSIONS_TAIL.trim()
    );
}

fn esc(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The whole page.
pub fn markdown() -> String {
    let mut o = String::new();
    let w = &mut o;
    let defaults = toml::Table::try_from(FlagSet::default()).unwrap_or_default();
    let default_of = |section: &str, key: &str| -> String {
        defaults
            .get(section)
            .and_then(|t| t.get(key))
            .map(|v| v.to_string())
            .unwrap_or_else(|| "unset".into())
    };
    let _ = writeln!(w, "# Flags, presets and the kernel-path contract\n");
    let _ = writeln!(
        w,
        "<!-- Generated from src/flags (axes.rs, names.rs, model.rs, rules.rs) by `mxtune presets docs`. \
         Do not edit: `MXTUNE_BLESS=1 cargo test flags_docs` rewrites it, and a test fails when it drifts. -->\n"
    );
    let _ = writeln!(w, "{}", INTRO.trim());
    let _ = writeln!(w, "\n## The axes (`[axes]`, engine `device`)\n");
    for a in all_axes() {
        let engine = match a.engine_key {
            Some(k) if a.cpu_applies => {
                format!("Engine `kernel-path` key: `{k}` (CPU backend too).")
            }
            Some(k) => format!("Engine `kernel-path` key: `{k}` (CPU backend reports `n/a`)."),
            None => "The engine reports no `kernel-path` line for it.".into(),
        };
        let _ = writeln!(
            w,
            "### `{}` — {}\n\nDefault `{}`. {engine}\n",
            a.path, a.doc, a.default
        );
        let _ = writeln!(
            w,
            "| value | meaning | vLLM container | bundled engine | vLLM log evidence |"
        );
        let _ = writeln!(w, "|---|---|---|---|---|");
        for (name, doc, spec) in &a.values {
            let mut ev = Vec::new();
            for r in spec.vllm_check.must_see {
                ev.push(format!("see `{}`", esc(r)));
            }
            for r in spec.vllm_check.must_not_see {
                ev.push(format!("not `{}`", esc(r)));
            }
            let _ = writeln!(
                w,
                "| `{name}` | {} | {} | {} | {} |",
                esc(doc),
                esc(&vllm_cell(spec.vllm)),
                esc(&engine_cell(&a, spec.engine, spec.engine_report)),
                if ev.is_empty() {
                    "—".into()
                } else {
                    ev.join("; ")
                }
            );
        }
        let _ = writeln!(w);
    }
    let _ = writeln!(w, "## Other settings\n");
    let _ = writeln!(w, "| key | default | meaning | vLLM | engine |");
    let _ = writeln!(w, "|---|---|---|---|---|");
    for s in SETTINGS {
        let _ = writeln!(
            w,
            "| `{}.{}` | `{}` | {} | {} | {} |",
            s.section,
            s.key,
            esc(&default_of(s.section, s.key)),
            esc(s.doc),
            s.vllm
                .map(|n| format!("`{}` ({})", n.name, n.provenance.as_str()))
                .unwrap_or_else(|| "—".into()),
            esc(&s
                .engine
                .map(|e| format!("`{e}`"))
                .unwrap_or_else(|| "n/a".into())),
        );
    }
    for (k, doc) in CONTAINER_SETTINGS {
        let _ = writeln!(
            w,
            "| `container.{k}` | `{}` | {} | Docker Engine API | n/a |",
            esc(&default_of("container", k)),
            esc(doc)
        );
    }
    flavours(w);
    versions(w);
    let _ = writeln!(w, "\n## Every vLLM-side name and where it comes from\n");
    let _ = writeln!(w, "| name | kind | provenance | note |");
    let _ = writeln!(w, "|---|---|---|---|");
    for n in names::ALL {
        let kind = match n.kind {
            NameKind::Env => "env",
            NameKind::Cli => "cli",
        };
        let _ = writeln!(
            w,
            "| `{}` | {kind} | {} | {} |",
            n.name,
            n.provenance.as_str(),
            esc(n.note)
        );
    }
    let _ = writeln!(w, "\n## Conflict rules\n");
    let _ = writeln!(
        w,
        "Evaluated by `flags::rules::evaluate(flags, target, arch)`. An error blocks a launch, a warning asks \
         for confirmation. With the GPU unknown, a rule tied to an architecture is reported as *may apply*.\n"
    );
    let _ = writeln!(w, "| rule | severity | targets | GPUs | keys | reason |");
    let _ = writeln!(w, "|---|---|---|---|---|---|");
    let _ = writeln!(
        w,
        "| `{}` | error | both | any GPU | the axis | a value with no rendering on the target (from the axis table) |",
        super::rules::NOT_ON_TARGET
    );
    let _ = writeln!(
        w,
        "| `{}` | error | docker | any GPU | the axis, `container.vllm` | on a stock image (`vllm = \"upstream\"`): a value upstream cannot express, with the nearest one it can (from the dialect table above) |",
        super::rules::NOT_UPSTREAM
    );
    let _ = writeln!(
        w,
        "| `{}` | error | engine | any GPU | the option's key | whatever `mxtune serve` refuses from its arguments alone (asked of the engine: `engine::serve::refusals` on the rendered command line), e.g. `max_model_len` below 2 or above the synthetic model's context, `tile` without the grouped MoE, an unknown synthetic model |",
        super::rules::ENGINE_REFUSES
    );
    for r in RULES {
        let targets: Vec<String> = r
            .targets
            .iter()
            .map(|t| format!("{t:?}").to_ascii_lowercase())
            .collect();
        let _ = writeln!(
            w,
            "| `{}` | {} | {} | {} | {} | {} |",
            r.id,
            match r.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            },
            targets.join(", "),
            r.arch.describe(),
            r.keys
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", "),
            esc(r.reason)
        );
    }
    let _ = writeln!(w, "\n{}", TAIL.trim());
    o
}

const INTRO: &str = r#"
A run configuration is a `FlagSet`: orthogonal axes (`[axes]`), serving limits (`[serving]`),
container settings (`[container]`, vLLM target) and engine settings (`[engine]`, bundled
engine). A preset (`presets/NAME.toml`) holds some of these keys; the rest come from the
preset it `extends`, and in the end from the defaults below. `mxtune presets show NAME --as
docker-run|vllm|env|engine|toml|json` prints exactly what would run (`json`: the whole
`LaunchSpec`, kernel-path checks included).

Provenance of a vLLM name: `upstream` (upstream vLLM / FlashInfer), `fork` (only the operators'
tuning fork), `fork-deprecated` (fork, mapped onto a newer name), `planned` (never built: the image
ignores it). Rendering warns for `planned` and `fork-deprecated` names. On a stock image
(`container.vllm = "upstream"`) every value renders in upstream's own names or is refused before
launch, naming the nearest value upstream can express (see "Fork and stock images" below).
"#;

const FLAVOURS: &str = r#"
`container.vllm` says which vLLM the image carries. On `fork` (the operators' tuning fork) the
axes render through the fork's names (the tables above). On `upstream` (a stock `vllm/vllm-openai`
or NVIDIA vLLM image) each value renders in upstream vLLM's own names: `same` below means the
fork's rendering already uses upstream names only. A value marked `no` is a rule error
(`not-in-upstream-dialect`) before launch — `presets check`, the panel and `launch` all say why and
which value is nearest — rather than a variable the image would silently ignore.
"#;

const FLAVOUR_SOURCES: &str = r#"
What these rows rest on (upstream vLLM, read in `vllm/model_executor/layers/fused_moe/oracle/mxfp4.py`,
`select_mxfp4_moe_backend`, and the log lines of upstream's own PRs and issues):

* The environment is checked in this order, the first match deciding: `VLLM_USE_FLASHINFER_MOE_MXFP4_BF16`
  (`=1`: FlashInfer CUTLASS MXFP4×BF16 on SM90, TRT-LLM MXFP4×BF16 on the SM100 family, a
  `ValueError` "… is set but the current device capability is not supported" elsewhere; `=0`: both
  dropped from the candidates), `VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1` (TRT-LLM MXFP4×MXFP8),
  `VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS=1` (CUTLASS MXFP4×MXFP8), `VLLM_MXFP4_USE_MARLIN=1`
  (Marlin); otherwise the first supported of TRT-LLM BF16, CK, Triton (SM90 up to SM11x with
  `triton_kernels`), CUTLASS BF16, Triton unfused, Marlin. Hence the competing variables checked
  earlier are rendered `=0`, and `triton` cannot be forced.
* The chosen backend is logged as `Using 'MARLIN' Mxfp4 MoE backend.` (enum values `MARLIN`,
  `FLASHINFER_CUTLASS_MXFP4_MXFP8`, `FLASHINFER_CUTLASS_MXFP4_BF16`, `FLASHINFER_TRTLLM_MXFP4_BF16`,
  `FLASHINFER_TRTLLM_MXFP4_MXFP8`, `TRITON`, …); builds that log `Using MARLIN Mxfp4 MoE backend out
  of potential backends: [...]` match the same patterns. An explicit choice the device or build
  cannot run raises `ValueError: Mxfp4 MoE backend '<X>' does not support the deployment
  configuration[ since <reason>].` at start: a fatal log line (`src/launch/log-rules.toml`) and a
  must-not-see pattern of every `moe_backend` check, so the launch fails with `moe_backend`
  `invalid` and that line as evidence. Older releases (before the oracle: `Using FlashInfer MXFP4
  MXFP8 CUTLASS backend for SM100`, `Using Marlin backend`) match none of these patterns: verdict
  `unknown`, never a false `valid`.
* Attention: `Using FLASHINFER attention backend out of potential backends: ['FLASHINFER',
  'TRITON_ATTN']` when vLLM chooses, `Using AttentionBackendEnum.TRITON_ATTN backend.` when
  `--attention-backend` names it; both match the attention patterns above.
* CUDA graphs: `Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%` and `Graph capturing
  finished in 8 secs, took 0.31 GiB`; `--compilation-config '{"cudagraph_mode": "NONE"}'` keeps
  torch.compile and shows `'cudagraph_mode': <CUDAGraphMode.NONE: 0>` in the engine's config line.
"#;

const VERSIONS: &str = r#"
Upstream renames and adds names between releases, so a stock image is rendered for the vLLM
release it carries. Rendering happens before the container runs, so the release is asked of the
image first: `launch`, the panel and `matrix` run `vllm --version` in a short-lived container of
the same image (no GPU, network `none`, no mounts, removed at once; it costs a container start and
vLLM's import, seconds) and render for the answer. Why the image and not a `vllm_version` key in
the preset or an image label: tags such as `vllm/vllm-openai:latest` or a nightly move under the
same reference, so a version written in a preset goes stale without a sign, and a label is there
only if whoever built the image put one; `vllm --version` answers for exactly the image about to
run. When the release cannot be known (the probe failed, or rendering without Docker: `presets
show`, the panel's command view) the names are rendered for the newest release in the table below
and mxtune says so (`note:` from `launch` and `presets show`, the panel's launch view,
`dialect.version_source = "assumed"` in the run record). Once the container runs, its banner
(`vLLM API server version X`, or the engine's `Initializing a V1 LLM engine (vX)` line) is read
too: the run record keeps it as `observed.vllm_version`, and a banner naming a release that says
some name of the table differently from the release rendered for is a warning. The rule checks (`not-in-upstream-dialect`) do not know the
release; a value the image's release cannot say is refused by rendering, at launch, naming the
release that first can.
"#;

const VERSIONS_TAIL: &str = r#"
(0.14 still warns that `VLLM_ATTENTION_BACKEND` is deprecated in favour of the attention config,
EuroEval/EuroEval#1488 on 0.14.1, and the MXFP4 switches were still read in early 2026, when
vllm-project/vllm#30647 discussed retiring them.) Newer images are rendered with the same names
and a note: later releases select MoE backends with `--moe-backend` — `VLLM_FLASHINFER_MOE_BACKEND`
is deprecated for removal in v0.23 (quoted from `vllm/envs.py` in vllm-project/vllm#43487) and 0.26
reports it as an unknown variable (Blackwellboy/model-serving-minefield#19, on a GB10) — and when the MXFP4 switches go the same way, the table grows a
row. `VLLM_MXFP4_USE_MARLIN`'s row is a lower bound (no MXFP4 MoE switch before gpt-oss support in
0.10.1): the release that introduced it is not established here.
"#;

const TAIL: &str = r#"
## Kernel-path contract (is the flag really in effect?)

Every rendered `LaunchSpec` carries `checks`: per axis value, regexes that must / must not match
some line of the target's log once it is up. Each regex is matched against each log line on its
own. The vLLM patterns come from the operators' validation table and logs; they are evidence,
not proof, and a value with no known log line has no check (verdict `unknown`).

The bundled engine prints, at start-up and before its readiness line, exactly one line per gated
path on stdout:

```
kernel-path <key>=<value>
```

with keys `backend`, `moe_kernel`, `activation`, `tile`, `mxfp4_layers`, `kv_dtype`, `sinks`,
`cuda_graphs`, and value `n/a` where the backend has no such path (the CPU backend has only
`backend` and `sinks`). The check for an axis is `^kernel-path <key>=<value>(?:\s|$)`; when the
chosen value is `auto` any resolved value is accepted (`\S+`); with `device = "cpu"` the keys the
CPU lacks must report `n/a`, and with `device = "auto"` either the value or `n/a` is accepted.
`serving.prefix_caching`, when set, renders `--enable-prefix-caching` or
`--no-enable-prefix-caching` for the engine too, and its check is the engine's start-up line
`^mxtune serve: prefix caching on \(` (or `off`), the other one forbidden.

## Presets

* Where presets come from, searched in this order, the first source holding a name winning:
  1. `--presets-dir DIR` or `MXTUNE_PRESETS_DIR`, when given;
  2. the user's `$XDG_CONFIG_HOME/mxtune/presets` (default `~/.config/mxtune/presets`);
  3. the presets bundled into the binary: the repository's `presets/*.toml` at build time, so an
     installed `mxtune` has them in any directory.

  A user or `--presets-dir` preset named like a bundled one replaces it everywhere the name is
  used, also as the parent of bundled presets that extend it. `presets list` gives each
  preset's source (`bundled`, `user`, or the directory) and a `(hides …)` line for each preset
  of the same name it hides; `presets show` names the file, errors in a bundled preset name
  `bundled:presets/NAME.toml`.
* New presets (the panel's `s`, `recipe import`) are saved into `--presets-dir` /
  `MXTUNE_PRESETS_DIR` when given, else into the user directory; the bundled presets are never
  written. Saving under a name that exists, or that hides a preset elsewhere, needs a `y`
  (panel) or `--overwrite` (`recipe import`).
* Keys: `description`, `extends`, `target` (`docker` | `engine`), and the sections above.
  `extends = "NAME"` merges key by key: the child's keys replace the parent's, tables merge.
  A preset extending its own name (`baseline.toml` with `extends = "baseline"`) extends the
  preset of that name further down the sources: that is how to adjust a bundled preset.
* Loading is strict: an unknown key, a wrong value, an `extends` cycle or a missing parent is an
  error naming the file, the line and the valid choices. `mxtune presets check [FILE…]` prints
  `file:line: message` and exits non-zero on any error; a rule tied to a GPU architecture counts
  as an error only when `--arch` (e.g. `sm121`) says it applies, else it prints as *may apply*.
* Saving (`PresetStore::save`) writes only what differs from the parent when it extends one, never
  replaces an existing file unless asked to, and re-reads the file to prove it round-trips.
* `engine-cpu-tiny` is the default preset on a fresh machine: it needs no GPU and no Docker.
* Stock vLLM images: `upstream-baseline` (nothing forced) and one preset per MoE backend upstream
  can select — `upstream-marlin`, `upstream-cutlass-mxfp8`, `upstream-cutlass-bf16` (SM90),
  `upstream-trtllm` and `upstream-trtllm-mxfp8` (SM100). All take their image from
  `upstream-baseline`: a user or `--presets-dir` file `upstream-baseline.toml` with
  `extends = "upstream-baseline"` and `[container] image = "…"` (e.g. NVIDIA's vLLM container for
  the Spark) moves every one of them to that image.
"#;
