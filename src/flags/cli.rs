//! `mxtune presets …`: list, show, diff, check, docs.

use super::preset::{Preset, PresetError, PresetOrigin, PresetStore, user_presets_dir};
use super::render::{RenderContext, docker_run_argv, render_with};
use super::rules::{GpuArch, evaluate};
use crate::vocab::{LaunchSpec, TargetKind};
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `mxtune presets`.
#[derive(clap::Args, Debug)]
pub struct PresetsArgs {
    /// Presets directory searched first, before ~/.config/mxtune/presets and the bundled presets.
    #[arg(long, env = "MXTUNE_PRESETS_DIR", global = true)]
    pub presets_dir: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: PresetsCommand,
}

/// The `presets` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum PresetsCommand {
    /// List presets: name, target, source (bundled, user, or the directory), description.
    List,
    /// Show a resolved preset, or exactly what it would run.
    Show {
        /// Preset name, or a path to a .toml file.
        name: String,
        /// Print the docker run command, the vllm command, its env, the engine command, or TOML.
        #[arg(long = "as", value_enum)]
        format: Option<ShowAs>,
        /// GPU architecture for the conflict rules (e.g. sm121); unknown when omitted.
        #[arg(long)]
        arch: Option<GpuArch>,
    },
    /// Show the keys on which two presets differ.
    Diff {
        /// First preset.
        a: String,
        /// Second preset.
        b: String,
    },
    /// Check preset files (every preset when none is given); non-zero exit on any error.
    Check {
        /// Files to check.
        files: Vec<PathBuf>,
        /// GPU architecture for the conflict rules (e.g. sm121); unknown when omitted.
        #[arg(long)]
        arch: Option<GpuArch>,
    },
    /// Print docs/flags.md as generated from the flag tables.
    Docs,
}

/// Output forms of `presets show --as`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShowAs {
    /// A complete `docker run …` command.
    DockerRun,
    /// `env K=V … vllm serve …` as run inside the container.
    Vllm,
    /// `export K=V` lines of the container environment.
    Env,
    /// The `mxtune serve …` command of the bundled engine.
    Engine,
    /// The resolved flag set as TOML.
    Toml,
    /// The rendered `LaunchSpec` for the preset's target as JSON (argv, env, container, checks).
    Json,
}

/// Runs `mxtune presets …`.
pub fn run(args: PresetsArgs) -> Result<ExitCode> {
    let store = PresetStore::standard(args.presets_dir);
    match args.command {
        PresetsCommand::List => list(&store),
        PresetsCommand::Show { name, format, arch } => show(&store, &name, format, arch),
        PresetsCommand::Diff { a, b } => diff(&store, &a, &b),
        PresetsCommand::Check { files, arch } => check(&store, &files, arch),
        PresetsCommand::Docs => {
            print!("{}", super::docs::markdown());
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn load(store: &PresetStore, name: &str) -> Result<Preset, PresetError> {
    if name.ends_with(".toml") || name.contains('/') {
        store.load_file(Path::new(name))
    } else {
        store.load(name)
    }
}

fn target_name(t: TargetKind) -> &'static str {
    t.name()
}

/// Where a preset comes from, in a word where one is enough: `bundled`, `user` (the user
/// directory), else the directory holding it.
fn source_label(origin: &PresetOrigin) -> String {
    match origin {
        PresetOrigin::Bundled(_) => "bundled".into(),
        PresetOrigin::File(p) => {
            let dir = p.parent().unwrap_or(Path::new("."));
            if user_presets_dir().is_some_and(|u| u == dir) {
                "user".into()
            } else {
                dir.display().to_string()
            }
        }
    }
}

fn list(store: &PresetStore) -> Result<ExitCode> {
    let entries = store.list()?;
    if entries.is_empty() {
        println!("no presets in {}", store.sources());
        return Ok(ExitCode::SUCCESS);
    }
    let width = entries.iter().map(|e| e.name.len()).max().unwrap_or(0);
    let swidth = entries
        .iter()
        .map(|e| source_label(&e.origin).chars().count())
        .max()
        .unwrap_or(0);
    let mut failed = false;
    for e in entries {
        let source = source_label(&e.origin);
        match store.load_origin(&e.origin) {
            Ok(p) => println!(
                "{:width$}  {:6}  {source:swidth$}  {}",
                e.name,
                target_name(p.flags.target),
                p.description
            ),
            Err(err) => {
                failed = true;
                println!("{:width$}  BROKEN  {source:swidth$}  {err}", e.name)
            }
        }
        for s in e.shadows {
            println!("{:width$}  (hides {s})", "");
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The vLLM target a preset renders for in `show`: its own two-node target, else Docker.
fn vllm_target(p: &Preset) -> TargetKind {
    match p.flags.target {
        TargetKind::DockerCluster => TargetKind::DockerCluster,
        _ => TargetKind::Docker,
    }
}

fn render_for(p: &Preset, target: TargetKind) -> Result<LaunchSpec> {
    render_with(&p.flags, target, &RenderContext::from_env()).map_err(|e| {
        e.context(format!(
            "rendering preset `{}` for {}",
            p.name,
            target_name(target)
        ))
    })
}

fn show(
    store: &PresetStore,
    name: &str,
    format: Option<ShowAs>,
    arch: Option<GpuArch>,
) -> Result<ExitCode> {
    let p = load(store, name)?;
    let quote = |argv: &[String]| shell_words::join(argv);
    match format {
        Some(ShowAs::DockerRun) => {
            let spec = render_for(&p, vllm_target(&p))?;
            print_warnings(&spec);
            println!("{}", quote(&docker_run_argv(&spec)?));
        }
        Some(ShowAs::Vllm) => {
            let spec = render_for(&p, vllm_target(&p))?;
            print_warnings(&spec);
            if let Some(c) = &spec.container {
                for (path, contents) in &c.files {
                    println!("# the container also gets {path} containing {contents}");
                }
            }
            let mut argv: Vec<String> = vec!["env".into()];
            argv.extend(spec.env.iter().map(|(k, v)| format!("{k}={v}")));
            argv.extend(spec.argv.iter().cloned());
            println!("{}", quote(&argv));
        }
        Some(ShowAs::Env) => {
            let spec = render_for(&p, vllm_target(&p))?;
            print_warnings(&spec);
            for (k, v) in &spec.env {
                println!("export {k}={}", shell_words::quote(v));
            }
        }
        Some(ShowAs::Engine) => {
            let spec = render_for(&p, TargetKind::Engine)?;
            print_warnings(&spec);
            println!("{}", quote(&spec.argv));
        }
        Some(ShowAs::Toml) => print!("{}", toml::to_string(&p.flags)?),
        Some(ShowAs::Json) => {
            let spec = render_for(&p, p.flags.target)?;
            println!("{}", serde_json::to_string_pretty(&spec)?);
        }
        None => {
            println!("preset:      {} ({})", p.name, p.origin);
            println!("description: {}", p.description);
            if p.chain.len() > 1 {
                let names: Vec<String> = p
                    .chain
                    .iter()
                    .map(|o| format!("{} ({})", o.name(), source_label(o)))
                    .collect();
                println!("extends:     {}", names.join(" → "));
            }
            println!("target:      {}", target_name(p.flags.target));
            for f in evaluate(&p.flags, p.flags.target, arch) {
                println!("{f}");
            }
            match render_for(&p, p.flags.target) {
                Ok(spec) => {
                    for w in &spec.warnings {
                        println!("warning: {w}");
                    }
                    if let Some(n) = spec.dialect.as_ref().and_then(|d| d.note.as_ref()) {
                        println!("note: {n}");
                    }
                    println!("command:     {}", quote(&spec.argv));
                }
                Err(e) => println!("error: {e:#}"),
            }
            println!();
            print!("{}", toml::to_string(&p.flags)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_warnings(spec: &LaunchSpec) {
    for w in &spec.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(n) = spec.dialect.as_ref().and_then(|d| d.note.as_ref()) {
        eprintln!("note: {n}");
    }
}

fn diff(store: &PresetStore, a: &str, b: &str) -> Result<ExitCode> {
    let (pa, pb) = (load(store, a)?, load(store, b)?);
    let changes = pa.flags.diff(&pb.flags)?;
    for (k, va, vb) in &changes {
        println!("{k}: {va} → {vb}");
    }
    if changes.is_empty() {
        println!("{a} and {b} resolve to the same flags");
    }
    Ok(ExitCode::SUCCESS)
}

fn check(store: &PresetStore, files: &[PathBuf], arch: Option<GpuArch>) -> Result<ExitCode> {
    let origins: Vec<PresetOrigin> = if files.is_empty() {
        store.list()?.into_iter().map(|e| e.origin).collect()
    } else {
        files.iter().cloned().map(PresetOrigin::File).collect()
    };
    let (mut errors, mut warnings) = (0usize, 0usize);
    for origin in &origins {
        let path = origin.display_path();
        let p = match store.load_origin(origin) {
            Ok(p) => p,
            Err(e) => {
                errors += 1;
                println!("{e}");
                continue;
            }
        };
        let at = |keys: &[&str]| -> String {
            store
                .locate(&p, keys)
                .map(|(o, l)| format!("{o}:{l}"))
                .unwrap_or_else(|| path.display().to_string())
        };
        let findings = evaluate(&p.flags, p.flags.target, arch);
        for f in &findings {
            if f.blocks() {
                errors += 1;
            } else {
                warnings += 1;
            }
            println!("{}: {f}", at(&f.keys));
        }
        if findings.iter().any(|f| f.blocks()) {
            continue;
        }
        match render_with(&p.flags, p.flags.target, &RenderContext::from_env()) {
            Ok(spec) => {
                for w in &spec.warnings {
                    warnings += 1;
                    println!("{}: warning: {w}", path.display());
                }
            }
            Err(e) => {
                errors += 1;
                println!("{}: error: {e:#}", path.display());
            }
        }
    }
    eprintln!(
        "checked {} preset(s): {errors} error(s), {warnings} warning(s)",
        origins.len()
    );
    Ok(if errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
