//! Presets: `*.toml` files holding a (partial) `FlagSet`, optionally extending another preset.
//!
//! Loading is strict. Each file is first checked on its own against the schema (unknown key,
//! wrong value → error with the file's line and the valid choices); then the chain of
//! `extends` is merged key by key, parent first, and the result becomes a `FlagSet`.

use super::model::{Axes, Container, EngineSettings, FlagSet, Serving};
use crate::launch::spec::TargetKind;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// The preset the TUI starts with on a fresh machine (no GPU, no Docker needed).
pub const DEFAULT_PRESET: &str = "engine-cpu-tiny";

/// A preset problem, located in a file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct PresetError {
    /// The file at fault.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// What is wrong and what to do.
    pub message: String,
}

impl PresetError {
    fn new(file: &Path, line: Option<usize>, message: impl Into<String>) -> Self {
        PresetError {
            file: file.to_path_buf(),
            line,
            message: message.into(),
        }
    }
}

/// A loaded, resolved preset.
#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    /// Name (the file stem).
    pub name: String,
    /// The file it came from.
    pub path: PathBuf,
    /// One-line description.
    pub description: String,
    /// The parent preset, if any.
    pub extends: Option<String>,
    /// Files of the chain, this preset first, root last.
    pub chain: Vec<PathBuf>,
    /// The resolved flag set.
    pub flags: FlagSet,
}

/// A preset file's schema: the `FlagSet` sections, all optional, plus the preset's own keys.
/// Deserializing into it is the per-file check (with spans); the sections' values are then
/// taken from the raw table, because `extends` merges key by key — hence the unread fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PresetDoc {
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    #[serde(default)]
    extends: Option<Spanned<String>>,
    #[serde(default)]
    #[allow(dead_code)]
    target: Option<TargetKind>,
    #[serde(default)]
    #[allow(dead_code)]
    axes: Option<Axes>,
    #[serde(default)]
    #[allow(dead_code)]
    serving: Option<Serving>,
    #[serde(default)]
    #[allow(dead_code)]
    container: Option<Container>,
    #[serde(default)]
    #[allow(dead_code)]
    engine: Option<EngineSettings>,
}

/// One parsed file: its raw table (minus the preset's own keys) and metadata.
struct ParsedFile {
    path: PathBuf,
    description: String,
    extends: Option<(String, Option<usize>)>,
    table: toml::Table,
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .bytes()
        .filter(|b| *b == b'\n')
        .count()
        + 1
}

/// Reads and checks one preset file on its own (no `extends` resolution).
fn parse_file(path: &Path) -> Result<ParsedFile, PresetError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| PresetError::new(path, None, format!("cannot read preset: {e}")))?;
    let doc: PresetDoc = toml::from_str(&text).map_err(|e| {
        let line = e.span().map(|s| line_of(&text, s.start));
        PresetError::new(path, line, e.message().trim().to_string())
    })?;
    let mut table: toml::Table = toml::from_str(&text)
        .map_err(|e| PresetError::new(path, None, e.message().trim().to_string()))?;
    let description = match table.remove("description") {
        Some(toml::Value::String(s)) => s,
        _ => String::new(),
    };
    table.remove("extends");
    let extends = doc.extends.map(|s| {
        let line = line_of(&text, s.span().start);
        (s.into_inner(), Some(line))
    });
    Ok(ParsedFile {
        path: path.to_path_buf(),
        description,
        extends,
        table,
    })
}

/// Merges `over` into `base`: tables merge key by key, everything else is replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Where presets live: searched in order; the first directory holding a name wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresetStore {
    /// Directories, highest priority first.
    pub dirs: Vec<PathBuf>,
}

/// Env var overriding the project presets directory.
pub const PRESETS_DIR_ENV: &str = "MXTUNE_PRESETS_DIR";

/// The user's presets directory: `$XDG_CONFIG_HOME/mxtune/presets` or `~/.config/mxtune/presets`.
pub fn user_presets_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("mxtune/presets"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".config/mxtune/presets"))
}

/// A preset name found in a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresetEntry {
    /// Name (file stem).
    pub name: String,
    /// Its file.
    pub path: PathBuf,
    /// A file of the same name in a later directory that this one hides.
    pub shadows: Option<PathBuf>,
}

impl PresetStore {
    /// A store over these directories, highest priority first.
    pub fn new(dirs: Vec<PathBuf>) -> Self {
        PresetStore { dirs }
    }

    /// The standard store: `project_dir` (default `./presets`), then the user directory.
    pub fn standard(project_dir: Option<PathBuf>) -> Self {
        let mut dirs = vec![project_dir.unwrap_or_else(|| PathBuf::from("presets"))];
        dirs.extend(user_presets_dir());
        PresetStore { dirs }
    }

    /// Every preset name, sorted, first directory winning.
    pub fn list(&self) -> Result<Vec<PresetEntry>, PresetError> {
        let mut out: Vec<PresetEntry> = Vec::new();
        for dir in &self.dirs {
            let rd = match std::fs::read_dir(dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    return Err(PresetError::new(
                        dir,
                        None,
                        format!("cannot list presets: {e}"),
                    ));
                }
            };
            let mut found = Vec::new();
            for ent in rd {
                let ent = ent.map_err(|e| {
                    PresetError::new(dir, None, format!("cannot list presets: {e}"))
                })?;
                let p = ent.path();
                if p.extension().is_some_and(|x| x == "toml")
                    && let Some(stem) = p.file_stem()
                {
                    found.push((stem.to_string_lossy().into_owned(), p));
                }
            }
            for (name, path) in found {
                match out.iter_mut().find(|e| e.name == name) {
                    Some(e) => e.shadows = Some(path),
                    None => out.push(PresetEntry {
                        name,
                        path,
                        shadows: None,
                    }),
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The file of preset `name`.
    pub fn find(&self, name: &str) -> Option<PathBuf> {
        self.dirs
            .iter()
            .map(|d| d.join(format!("{name}.toml")))
            .find(|p| p.is_file())
    }

    /// Loads preset `name`, resolving `extends`.
    pub fn load(&self, name: &str) -> Result<Preset, PresetError> {
        let path = self.find(name).ok_or_else(|| {
            let known: Vec<String> = self
                .list()
                .map(|l| l.into_iter().map(|e| e.name).collect())
                .unwrap_or_default();
            PresetError::new(
                &self
                    .dirs
                    .first()
                    .cloned()
                    .unwrap_or_default()
                    .join(format!("{name}.toml")),
                None,
                format!(
                    "no preset named `{name}` in {}; known: {}",
                    self.dirs
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    if known.is_empty() {
                        "(none)".into()
                    } else {
                        known.join(", ")
                    }
                ),
            )
        })?;
        self.load_file(&path)
    }

    /// Loads a preset file (which may extend presets of this store).
    pub fn load_file(&self, path: &Path) -> Result<Preset, PresetError> {
        let first = parse_file(path)?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut seen = vec![name.clone()];
        let mut files = vec![first];
        while let Some((parent, line)) = files.last().and_then(|f| f.extends.clone()) {
            let child = files.last().map(|f| f.path.clone()).unwrap_or_default();
            if seen.contains(&parent) {
                seen.push(parent);
                return Err(PresetError::new(
                    &child,
                    line,
                    format!("`extends` cycle: {}", seen.join(" → ")),
                ));
            }
            let ppath = self.find(&parent).ok_or_else(|| {
                let known: Vec<String> = self
                    .list()
                    .map(|l| l.into_iter().map(|e| e.name).collect())
                    .unwrap_or_default();
                PresetError::new(
                    &child,
                    line,
                    format!(
                        "extends = \"{parent}\": no such preset; known: {}",
                        if known.is_empty() {
                            "(none)".into()
                        } else {
                            known.join(", ")
                        }
                    ),
                )
            })?;
            seen.push(parent);
            files.push(parse_file(&ppath)?);
        }
        let mut merged = toml::Table::new();
        for f in files.iter().rev() {
            merge(&mut merged, f.table.clone());
        }
        let flags: FlagSet =
            toml::Value::Table(merged)
                .try_into()
                .map_err(|e: toml::de::Error| {
                    PresetError::new(
                        path,
                        None,
                        format!("after merging `extends`: {}", e.message().trim()),
                    )
                })?;
        Ok(Preset {
            name,
            path: path.to_path_buf(),
            description: files[0].description.clone(),
            extends: files[0].extends.as_ref().map(|(p, _)| p.clone()),
            chain: files.iter().map(|f| f.path.clone()).collect(),
            flags,
        })
    }

    /// File and line where the nearest preset of the chain sets one of `keys` (`section.key`).
    pub fn locate(&self, preset: &Preset, keys: &[&str]) -> Option<(PathBuf, usize)> {
        for file in &preset.chain {
            let Ok(text) = std::fs::read_to_string(file) else {
                continue;
            };
            let mut current = String::new();
            for (i, raw) in text.lines().enumerate() {
                let l = raw.trim();
                if let Some(h) = l.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
                    current = h.trim().to_string();
                    continue;
                }
                let Some((k, _)) = l.split_once('=') else {
                    continue;
                };
                let hit = keys.iter().any(|key| {
                    let (section, leaf) = key.split_once('.').unwrap_or(("", key));
                    current == section && k.trim() == leaf
                });
                if hit {
                    return Some((file.clone(), i + 1));
                }
            }
        }
        None
    }
}

/// Whether `name` is usable as a preset file name.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with('.')
}

/// Keys of `full` whose values differ from `base` (tables recursively).
fn diff_table(full: &toml::Table, base: &toml::Table) -> toml::Table {
    let mut out = toml::Table::new();
    for (k, v) in full {
        match (v, base.get(k)) {
            (toml::Value::Table(f), Some(toml::Value::Table(b))) => {
                let d = diff_table(f, b);
                if !d.is_empty() {
                    out.insert(k.clone(), toml::Value::Table(d));
                }
            }
            (v, Some(b)) if v == b => {}
            (v, _) => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

/// What to save as a preset.
#[derive(Debug, Clone, PartialEq)]
pub struct SaveRequest<'a> {
    /// Preset name (file stem): letters, digits, `-`, `_`, `.`.
    pub name: &'a str,
    /// One-line description.
    pub description: &'a str,
    /// Parent preset: only keys differing from it are written.
    pub extends: Option<&'a str>,
    /// The flag set to store.
    pub flags: &'a FlagSet,
    /// Replace an existing file of that name.
    pub overwrite: bool,
}

impl PresetStore {
    /// Saves a preset into `dir`, refusing to replace a file unless `overwrite` is set.
    /// Loading the result gives back exactly `req.flags`.
    pub fn save(&self, dir: &Path, req: &SaveRequest<'_>) -> anyhow::Result<PathBuf> {
        use anyhow::{Context, bail};
        if !valid_name(req.name) {
            bail!(
                "preset name `{}` is not usable; use letters, digits, '-', '_', '.'",
                req.name
            );
        }
        let path = dir.join(format!("{}.toml", req.name));
        if path.exists() && !req.overwrite {
            bail!("{} exists; pass overwrite to replace it", path.display());
        }
        let full = toml::Table::try_from(req.flags).context("serializing the flag set")?;
        let body = match req.extends {
            Some(parent) => {
                let p = self.load(parent).map_err(anyhow::Error::new)?;
                let base = toml::Table::try_from(&p.flags).context("serializing the parent")?;
                diff_table(&full, &base)
            }
            None => full,
        };
        let mut head = toml::Table::new();
        head.insert("description".into(), req.description.into());
        if let Some(p) = req.extends {
            head.insert("extends".into(), p.into());
        }
        let text = format!(
            "{}{}",
            toml::to_string(&head).context("serializing the preset header")?,
            toml::to_string(&body).context("serializing the preset")?
        );
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let tmp = dir.join(format!(".{}.toml.tmp", req.name));
        std::fs::write(&tmp, &text).with_context(|| format!("writing {}", tmp.display()))?;
        if req.overwrite {
            std::fs::rename(&tmp, &path)
                .with_context(|| format!("renaming into {}", path.display()))?;
        } else {
            // A hard link fails if the name exists, so a file created meanwhile is never replaced.
            let linked = std::fs::hard_link(&tmp, &path);
            let _ = std::fs::remove_file(&tmp);
            linked
                .with_context(|| format!("creating {} (not replacing anything)", path.display()))?;
        }
        let back = self
            .load_file(&path)
            .map_err(anyhow::Error::new)
            .context("re-reading the saved preset")?;
        if &back.flags != req.flags {
            bail!(
                "{} does not load back to the same flag set; this is a bug",
                path.display()
            );
        }
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::axes::{CudaGraphs, MoeBackend, Sinks, Speculative, Tile};

    fn store_with(files: &[(&str, &str)]) -> (tempfile::TempDir, PresetStore) {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(format!("{name}.toml")), text).unwrap();
        }
        let store = PresetStore::new(vec![dir.path().to_path_buf()]);
        (dir, store)
    }

    #[test]
    fn unknown_key_names_file_line_and_choices() {
        let (_d, s) = store_with(&[(
            "p",
            "description = \"x\"\n[axes]\nmoe_backend = \"marlin\"\nmoe_kernal = \"gemv\"\n",
        )]);
        let e = s.load("p").unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.file.ends_with("p.toml"));
        assert!(
            e.message.contains("moe_kernal") && e.message.contains("moe_backend"),
            "{e}"
        );
        let (_d, s) = store_with(&[("p", "colour = 1\n")]);
        let e = s.load("p").unwrap_err();
        assert_eq!(e.line, Some(1));
        assert!(
            e.message.contains("extends") && e.message.contains("axes"),
            "{e}"
        );
    }

    #[test]
    fn wrong_value_names_line_and_valid_values() {
        let (_d, s) = store_with(&[("p", "[axes]\n\ntile = \"32x32\"\n")]);
        let e = s.load("p").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(
            e.message.contains("64x128") && e.message.contains("128x128"),
            "{e}"
        );
        let (_d, s) = store_with(&[("p", "[serving]\nport = \"eighty\"\n")]);
        assert_eq!(s.load("p").unwrap_err().line, Some(2));
        let (_d, s) = store_with(&[("p", "target = \"kubernetes\"\n")]);
        let e = s.load("p").unwrap_err();
        assert!(
            e.message.contains("docker") && e.message.contains("engine"),
            "{e}"
        );
        let (_d, s) = store_with(&[("p", "[axes\n")]);
        assert_eq!(s.load("p").unwrap_err().line, Some(1));
    }

    #[test]
    fn extends_cycle_and_missing_parent_are_errors() {
        let (_d, s) = store_with(&[
            ("a", "description = \"a\"\nextends = \"b\"\n"),
            ("b", "extends = \"c\"\n"),
            ("c", "\nextends = \"a\"\n"),
        ]);
        let e = s.load("a").unwrap_err();
        assert!(
            e.message.contains("cycle") && e.message.contains("a → b → c → a"),
            "{e}"
        );
        assert!(e.file.ends_with("c.toml") && e.line == Some(2), "{e}");
        let (_d, s) = store_with(&[("a", "extends = \"nope\"\n"), ("b", "")]);
        let e = s.load("a").unwrap_err();
        assert!(
            e.message.contains("nope") && e.message.contains("known: a, b"),
            "{e}"
        );
        assert_eq!(e.line, Some(1));
        let (_d, s) = store_with(&[("a", "extends = \"a\"\n")]);
        assert!(s.load("a").unwrap_err().message.contains("cycle"));
        let e = s.load("missing").unwrap_err();
        assert!(e.message.contains("no preset named `missing`"), "{e}");
    }

    #[test]
    fn extends_merges_key_by_key() {
        let (_d, s) = store_with(&[
            (
                "base",
                "[axes]\nmoe_backend = \"marlin\"\ncuda_graphs = \"off\"\n[container]\nenv = { A = \"1\" }\n",
            ),
            (
                "mid",
                "extends = \"base\"\n[axes]\ntile = \"64x128\"\n[container]\nenv = { B = \"2\" }\n",
            ),
            (
                "top",
                "description = \"top\"\nextends = \"mid\"\n[axes]\nmoe_backend = \"cutlass\"\n",
            ),
        ]);
        let p = s.load("top").unwrap();
        assert_eq!(p.description, "top");
        assert_eq!(p.extends.as_deref(), Some("mid"));
        assert_eq!(p.chain.len(), 3);
        let a = &p.flags.axes;
        assert_eq!(a.moe_backend, MoeBackend::Cutlass);
        assert_eq!(a.tile, Tile::T64x128);
        assert_eq!(a.cuda_graphs, CudaGraphs::Off);
        assert_eq!(a.sinks, Sinks::Auto, "unset keys take the defaults");
        assert_eq!(p.flags.container.env.len(), 2, "tables merge");
        let (file, line) = s.locate(&p, &["axes.tile"]).unwrap();
        assert!(file.ends_with("mid.toml") && line == 3);
    }

    #[test]
    fn save_round_trips_and_never_overwrites_silently() {
        let (d, s) = store_with(&[("base", "[axes]\nmoe_backend = \"marlin\"\n")]);
        let mut flags = s.load("base").unwrap().flags;
        flags.axes.speculative = Speculative::Eagle3Short;
        flags.serving.gpu_memory_utilization = Some(0.7);
        flags
            .container
            .env
            .insert("FLASHINFER_LOGLEVEL".into(), "3".into());
        let req = SaveRequest {
            name: "mine",
            description: "saved",
            extends: Some("base"),
            flags: &flags,
            overwrite: false,
        };
        let path = s.save(d.path(), &req).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("extends = \"base\"") && !text.contains("moe_backend"),
            "{text}"
        );
        let back = s.load("mine").unwrap();
        assert_eq!(back.flags, flags);
        assert_eq!(back.description, "saved");
        let err = s.save(d.path(), &req).unwrap_err().to_string();
        assert!(err.contains("exists"), "{err}");
        let full = SaveRequest {
            extends: None,
            overwrite: true,
            ..req.clone()
        };
        s.save(d.path(), &full).unwrap();
        assert_eq!(s.load("mine").unwrap().flags, flags);
        assert!(
            s.save(
                d.path(),
                &SaveRequest {
                    name: "../x",
                    ..full
                }
            )
            .is_err()
        );
    }

    #[test]
    fn first_directory_wins_and_shadowing_is_listed() {
        let (d1, _) = store_with(&[("p", "description = \"one\"\n")]);
        let (d2, _) = store_with(&[("p", "description = \"two\"\n"), ("q", "")]);
        let s = PresetStore::new(vec![d1.path().into(), d2.path().into()]);
        assert_eq!(s.load("p").unwrap().description, "one");
        let l = s.list().unwrap();
        assert_eq!(l.len(), 2);
        assert!(
            l[0].shadows
                .as_ref()
                .is_some_and(|p| p.starts_with(d2.path()))
        );
    }

    #[test]
    fn repository_presets_all_load_and_render() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("presets");
        let s = PresetStore::new(vec![dir]);
        let names: Vec<String> = s.list().unwrap().into_iter().map(|e| e.name).collect();
        for want in [
            "baseline",
            "test-a",
            "test-b",
            "test-c",
            "test-d",
            "test-e",
            "test-f",
            "eagle3-short",
            "eagle3-long",
            "eagle3-throughput",
            "final",
            DEFAULT_PRESET,
            "engine-cuda-120b",
            "engine-cuda-20b",
        ] {
            assert!(names.iter().any(|n| n == want), "missing preset {want}");
        }
        let ctx = crate::flags::RenderContext {
            home: Some("/home/op".into()),
        };
        for n in &names {
            let p = s.load(n).unwrap_or_else(|e| panic!("{e}"));
            crate::flags::render_with(&p.flags, p.flags.target, &ctx)
                .unwrap_or_else(|e| panic!("{n}: {e:#}"));
            let blocking: Vec<_> = crate::flags::rules::evaluate(&p.flags, p.flags.target, None)
                .into_iter()
                .filter(|f| f.blocks())
                .collect();
            assert!(blocking.is_empty(), "{n}: {blocking:?}");
        }
        let tiny = s.load(DEFAULT_PRESET).unwrap();
        assert_eq!(tiny.flags.target, TargetKind::Engine);
        assert_eq!(tiny.flags.engine.device, crate::flags::Device::Cpu);
    }
}
