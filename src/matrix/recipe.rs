//! sparkrun / Spark Arena recipes ⇄ presets. A recipe is YAML: `model`, `container` (the
//! image), `runtime`, `metadata`, `env`, `defaults` (port, host, served_model_name,
//! tensor_parallel, gpu_memory_utilization, max_model_len, …) and a `command` template whose
//! `{name}` placeholders take the defaults. Import reads the serving command's flags into a
//! flag set; export renders a preset for Docker and writes the command back as a template.

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::flags::model::FlagSet;
use crate::flags::preset::{PresetStore, SaveRequest, save_dir};
use crate::flags::render::render;
use crate::vocab::TargetKind;

/// A sparkrun recipe (the fields mxtune reads and writes; others are ignored on import).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recipe {
    /// Recipe format version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipe_version: Option<String>,
    /// Recipe name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Hugging Face model id.
    pub model: String,
    /// Runtime, e.g. `vllm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// Container image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Free-form metadata (`description`, `maintainer`, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, Value>,
    /// Environment of the container.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, Value>,
    /// Values for the command's `{placeholders}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub defaults: BTreeMap<String, Value>,
    /// The serving command template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Reads a recipe file.
pub fn load(path: &Path) -> Result<Recipe> {
    let src = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read recipe {}", path.display()))?;
    serde_saphyr::from_str(&src)
        .map_err(|e| anyhow!("recipe {} is not a sparkrun recipe: {e}", path.display()))
}

/// `{key}` placeholders of `template` replaced by `defaults`; an unknown one is an error.
pub fn expand(template: &str, defaults: &BTreeMap<String, Value>) -> Result<String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find('}') {
            Some(close)
                if after[..close]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && close > 0 =>
            {
                let key = &after[..close];
                let v = defaults.get(key).ok_or_else(|| {
                    anyhow!("command placeholder {{{key}}} has no value in `defaults`")
                })?;
                out.push_str(&text(v));
                rest = &after[close + 1..];
            }
            // Not a placeholder (e.g. inline JSON): keep the brace.
            _ => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T> {
    v.parse()
        .map_err(|_| anyhow!("recipe command: {flag} {v} is not a number"))
}

/// A flag set from a recipe, and the command-line flags it could not map (kept as notes).
pub fn to_flags(r: &Recipe) -> Result<(FlagSet, Vec<String>)> {
    let mut fs = FlagSet {
        target: TargetKind::Docker,
        ..FlagSet::default()
    };
    fs.serving.model = r.model.clone();
    if let Some(c) = &r.container {
        fs.container.image = c.clone();
    }
    for (k, v) in &r.env {
        fs.container.env.insert(k.clone(), text(v));
    }
    let mut unmapped = Vec::new();
    let Some(cmd) = &r.command else {
        return Ok((fs, unmapped));
    };
    let line = expand(cmd, &r.defaults)?;
    // A recipe command may be a small shell script; the serving command is its `vllm serve`.
    let serve = line
        .split(['\n', ';'])
        .map(|l| l.trim().trim_end_matches('\\').trim())
        .collect::<Vec<_>>()
        .join(" ");
    let words = shell_words::split(&serve)
        .map_err(|e| anyhow!("recipe command does not parse as shell words: {e}"))?;
    let start = words
        .iter()
        .position(|w| w == "serve")
        .map(|i| i + 1)
        .ok_or_else(|| anyhow!("recipe command has no `vllm serve`: cannot read its flags"))?;
    let mut it = words[start..].iter().peekable();
    // The positional model after `serve`.
    if let Some(m) = it.peek()
        && !m.starts_with("--")
    {
        fs.serving.model = (*m).clone();
        it.next();
    }
    while let Some(w) = it.next() {
        let (flag, inline) = match w.split_once('=') {
            Some((f, v)) if w.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (w.clone(), None),
        };
        let mut value = || -> Result<String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it
                    .next()
                    .cloned()
                    .ok_or_else(|| anyhow!("recipe command: {flag} needs a value")),
            }
        };
        let axis = |fs: &mut FlagSet, key: &str, v: &str| {
            fs.set_axis(key, v)
                .map_err(|e| anyhow!("recipe command {flag} {v}: {e}"))
        };
        match flag.as_str() {
            "--port" => fs.serving.port = num(&flag, &value()?)?,
            "--host" => fs.serving.host = Some(value()?),
            "--served-model-name" => fs.serving.served_model_name = Some(value()?),
            "--tensor-parallel-size" | "-tp" => {
                fs.serving.tensor_parallel_size = Some(num(&flag, &value()?)?)
            }
            "--gpu-memory-utilization" => {
                fs.serving.gpu_memory_utilization = Some(num(&flag, &value()?)?)
            }
            "--max-model-len" => fs.serving.max_model_len = Some(num(&flag, &value()?)?),
            "--max-num-seqs" => fs.serving.max_num_seqs = Some(num(&flag, &value()?)?),
            "--max-num-batched-tokens" => {
                fs.serving.max_num_batched_tokens = Some(num(&flag, &value()?)?)
            }
            "--quantization" => fs.serving.quantization = Some(value()?),
            "--load-format" => fs.serving.load_format = Some(value()?),
            "--enable-prefix-caching" => fs.serving.prefix_caching = Some(true),
            "--no-enable-prefix-caching" => fs.serving.prefix_caching = Some(false),
            "--async-scheduling" => fs.serving.async_scheduling = Some(true),
            "--enforce-eager" => axis(&mut fs, "cuda_graphs", "off")?,
            "--kv-cache-dtype" => axis(&mut fs, "kv_cache_dtype", &value()?)?,
            "--mxfp4-backend" => axis(&mut fs, "moe_backend", &value()?.to_lowercase())?,
            "--mxfp4-layers" => axis(&mut fs, "mxfp4_layers", &value()?)?,
            "--attention-backend" => axis(&mut fs, "attention_backend", &value()?)?,
            other if other.starts_with("--") => {
                // Keep the flag and its value (if the next word is not a flag) as a note.
                let v = match &inline {
                    Some(v) => Some(v.clone()),
                    None => it.next_if(|n| !n.starts_with("--")).cloned(),
                };
                unmapped.push(match v {
                    Some(v) => format!("{other} {v}"),
                    None => other.to_owned(),
                });
            }
            other => unmapped.push(other.to_owned()),
        }
    }
    Ok((fs, unmapped))
}

/// Imports `path` as preset `name` into `dir`; returns the preset file and the unmapped
/// flags (also written into the preset's description).
pub fn import(
    path: &Path,
    name: &str,
    dir: &Path,
    overwrite: bool,
) -> Result<(PathBuf, Vec<String>)> {
    let r = load(path)?;
    let (fs, unmapped) = to_flags(&r)?;
    let mut description = r
        .metadata
        .get("description")
        .map(text)
        .or_else(|| r.name.clone())
        .unwrap_or_else(|| format!("imported from {}", path.display()));
    if !unmapped.is_empty() {
        description.push_str(&format!(
            " [imported recipe flags mxtune has no axis for: {}]",
            unmapped.join(" ")
        ));
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // The standard store, so a name that would hide a bundled or user preset is refused
    // without `overwrite`, as in the panel.
    let store = PresetStore::standard(Some(dir.to_path_buf()));
    let file = store.save(
        dir,
        &SaveRequest {
            name,
            description: &description,
            extends: None,
            flags: &fs,
            overwrite,
        },
    )?;
    Ok((file, unmapped))
}

/// A recipe for `preset`, rendered for Docker: the rendered `vllm serve …` with the port,
/// host and served name as placeholders.
pub fn export(store: &PresetStore, preset: &str) -> Result<Recipe> {
    let p = store.load(preset).map_err(|e| anyhow!("{e}"))?;
    if p.flags.target != TargetKind::Docker {
        bail!(
            "preset {} targets the bundled engine; a sparkrun recipe describes a container (use a docker preset)",
            p.name
        );
    }
    let spec = render(&p.flags, TargetKind::Docker)
        .with_context(|| format!("rendering preset {} for Docker", p.name))?;
    let mut defaults = BTreeMap::new();
    let mut argv = spec.argv.clone();
    for (flag, key) in [
        ("--port", "port"),
        ("--host", "host"),
        ("--served-model-name", "served_model_name"),
    ] {
        if let Some(i) = argv.iter().position(|a| a == flag)
            && i + 1 < argv.len()
        {
            defaults.insert(key.to_owned(), Value::String(argv[i + 1].clone()));
            argv[i + 1] = format!("{{{key}}}");
        }
    }
    let mut metadata = BTreeMap::new();
    metadata.insert(
        "description".to_owned(),
        Value::String(p.description.clone()),
    );
    metadata.insert(
        "exported_by".to_owned(),
        Value::String(format!("mxtune {}", env!("CARGO_PKG_VERSION"))),
    );
    Ok(Recipe {
        recipe_version: Some("2".into()),
        name: Some(p.name.clone()),
        model: p.flags.serving.model.clone(),
        runtime: Some("vllm".into()),
        container: spec.container.as_ref().map(|c| c.image.clone()),
        metadata,
        env: spec
            .env
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect(),
        defaults,
        command: Some(shell_words::join(&argv)),
    })
}

/// Serializes a recipe as YAML.
pub fn to_yaml(r: &Recipe) -> Result<String> {
    serde_saphyr::to_string(r).map_err(|e| anyhow!("serializing the recipe as YAML: {e}"))
}

/// Arguments of `mxtune recipe`.
#[derive(Debug, Clone, clap::Args)]
pub struct RecipeArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: RecipeAction,
}

/// `mxtune recipe import|export`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum RecipeAction {
    /// Import a sparkrun / Spark Arena recipe YAML as a preset.
    Import {
        /// The recipe file.
        file: PathBuf,
        /// Preset name to save as (default: the recipe's name).
        #[arg(long)]
        name: Option<String>,
        /// Directory to save the preset into [default: MXTUNE_PRESETS_DIR if set, else
        /// ~/.config/mxtune/presets].
        #[arg(long, env = "MXTUNE_PRESETS_DIR")]
        dir: Option<PathBuf>,
        /// Replace an existing preset of that name.
        #[arg(long)]
        overwrite: bool,
    },
    /// Export a Docker preset as a sparkrun recipe YAML (stdout, or --out).
    Export {
        /// Preset name.
        preset: String,
        /// Presets directory searched first, before ~/.config/mxtune/presets and the bundled presets.
        #[arg(long, env = "MXTUNE_PRESETS_DIR")]
        presets_dir: Option<PathBuf>,
        /// Write here instead of stdout (a new file: an existing one is never replaced).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// Runs `mxtune recipe`.
pub fn run(args: RecipeArgs) -> Result<std::process::ExitCode> {
    match args.action {
        RecipeAction::Import {
            file,
            name,
            dir,
            overwrite,
        } => {
            let name = match name {
                Some(n) => n,
                None => load(&file)?
                    .name
                    .ok_or_else(|| anyhow!("recipe {} has no name: pass --name", file.display()))?,
            };
            let dir = save_dir(dir).ok_or_else(|| {
                anyhow!("neither HOME nor XDG_CONFIG_HOME is set, so there is no ~/.config/mxtune/presets: pass --dir DIR")
            })?;
            let (path, unmapped) = import(&file, &name, &dir, overwrite)?;
            println!("preset {name}: {}", path.display());
            for u in unmapped {
                println!("  not mapped to an axis (kept in the description): {u}");
            }
        }
        RecipeAction::Export {
            preset,
            presets_dir,
            out,
        } => {
            let yaml = to_yaml(&export(&PresetStore::standard(presets_dir), &preset)?)?;
            match out {
                Some(p) => crate::record::export::write_new(&p, yaml.as_bytes())?,
                None => print!("{yaml}"),
            }
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECIPE: &str = r#"
recipe_version: "2"
name: gpt-oss-120b-cutlass
model: openai/gpt-oss-120b
runtime: vllm
container: vllm-node-mxfp4
metadata:
  description: CUTLASS MoE, all layers MXFP4
env:
  VLLM_MXFP4_ACTIVATION: mxfp8
  OMP_NUM_THREADS: 4
defaults:
  port: 8000
  host: 0.0.0.0
  served_model_name: gpt-oss
  max_model_len: 131072
command: |
  vllm serve openai/gpt-oss-120b \
    --host {host} --port {port} \
    --served-model-name {served_model_name} \
    --mxfp4-backend CUTLASS --mxfp4-layers moe,qkv,o,lm_head \
    --kv-cache-dtype fp8 --max-model-len {max_model_len} \
    --enable-prefix-caching --enforce-eager \
    --speculative-config '{"method":"eagle3","num_speculative_tokens":3}' --trust-remote-code
"#;

    #[test]
    fn import_maps_command_flags_defaults_and_env() {
        let r: Recipe = serde_saphyr::from_str(RECIPE).unwrap();
        let (fs, unmapped) = to_flags(&r).unwrap();
        assert_eq!(fs.container.image, "vllm-node-mxfp4");
        assert_eq!(fs.serving.port, 8000);
        assert_eq!(fs.serving.max_model_len, Some(131072));
        assert_eq!(fs.serving.served_model_name.as_deref(), Some("gpt-oss"));
        assert_eq!(fs.serving.prefix_caching, Some(true));
        assert_eq!(fs.axis_value("moe_backend"), Some("cutlass"));
        assert_eq!(fs.axis_value("kv_cache_dtype"), Some("fp8"));
        assert_eq!(fs.axis_value("cuda_graphs"), Some("off"));
        assert_eq!(fs.container.env["OMP_NUM_THREADS"], "4");
        assert!(
            unmapped
                .iter()
                .any(|u| u.starts_with("--speculative-config {")),
            "{unmapped:?}"
        );
        assert!(
            unmapped.contains(&"--trust-remote-code".to_owned()),
            "{unmapped:?}"
        );
    }

    #[test]
    fn unknown_placeholder_and_missing_serve_are_named() {
        let e = expand("--port {nope}", &BTreeMap::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("{nope}"), "{e}");
        let r = Recipe {
            model: "m".into(),
            command: Some("python app.py".into()),
            ..Recipe::default()
        };
        assert!(to_flags(&r).unwrap_err().to_string().contains("vllm serve"));
    }

    #[test]
    fn export_then_import_keeps_the_serving_command() {
        let dir = tempfile::tempdir().unwrap();
        let store = PresetStore::new(vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("presets")]);
        let recipe = export(&store, "baseline").unwrap();
        let yaml = to_yaml(&recipe).unwrap();
        let path = dir.path().join("r.yaml");
        std::fs::write(&path, &yaml).unwrap();
        let back = load(&path).unwrap();
        assert_eq!(back, recipe);
        assert!(
            back.command.as_deref().unwrap().contains("{port}"),
            "{yaml}"
        );
        let (fs, _) = to_flags(&back).unwrap();
        let original = store.load("baseline").unwrap().flags;
        assert_eq!(fs.serving.port, original.serving.port);
        assert_eq!(fs.serving.max_model_len, original.serving.max_model_len);
        assert_eq!(fs.container.image, original.container.image);
        assert!(export(&store, "engine-cpu-tiny").is_err());
        let (file, _) = import(&path, "roundtrip", dir.path(), false).unwrap();
        assert!(file.exists());
        assert!(import(&path, "roundtrip", dir.path(), false).is_err());
    }
}
