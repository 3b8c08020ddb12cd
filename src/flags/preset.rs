//! Presets: `*.toml` files holding a (partial) `FlagSet`, optionally extending another preset.
//!
//! Loading is strict. Each file is first checked on its own against the schema (unknown key,
//! wrong value → error with the file's line and the valid choices); then the chain of
//! `extends` is merged key by key, parent first, and the result becomes a `FlagSet`.

use super::model::{Axes, Container, EngineSettings, FlagSet, Serving};
use crate::vocab::TargetKind;
use serde::Deserialize;
use std::borrow::Cow;
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

/// Where one preset's text comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PresetOrigin {
    /// Compiled into the binary from the repository's `presets/NAME.toml`.
    Bundled(&'static str),
    /// A file on disk.
    File(PathBuf),
}

impl PresetOrigin {
    /// The path messages name: the file, or `bundled:presets/NAME.toml` for a bundled preset
    /// (the repository file it was built from).
    pub fn display_path(&self) -> PathBuf {
        match self {
            PresetOrigin::Bundled(n) => PathBuf::from(format!("bundled:presets/{n}.toml")),
            PresetOrigin::File(p) => p.clone(),
        }
    }

    /// The preset's name: the file stem.
    pub fn name(&self) -> String {
        match self {
            PresetOrigin::Bundled(n) => (*n).to_string(),
            PresetOrigin::File(p) => p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
        }
    }

    fn text(&self) -> Result<Cow<'static, str>, PresetError> {
        match self {
            PresetOrigin::Bundled(n) => super::bundled::text(n)
                .map(|(_, t)| Cow::Borrowed(t))
                .ok_or_else(|| {
                    PresetError::new(&self.display_path(), None, "no such bundled preset")
                }),
            PresetOrigin::File(p) => std::fs::read_to_string(p)
                .map(Cow::Owned)
                .map_err(|e| PresetError::new(p, None, format!("cannot read preset: {e}"))),
        }
    }

    /// Whether both name the same preset text; files are compared by their real path, so a
    /// chain reached once as `presets/a.toml` and once as `./presets/a.toml` is still a cycle.
    fn same(&self, other: &PresetOrigin) -> bool {
        match (self, other) {
            (PresetOrigin::File(a), PresetOrigin::File(b)) => same_path(a, b),
            (a, b) => a == b,
        }
    }
}

impl std::fmt::Display for PresetOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.display_path().display())
    }
}

fn same_path(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// A loaded, resolved preset.
#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    /// Name (the file stem).
    pub name: String,
    /// Where its text came from.
    pub origin: PresetOrigin,
    /// One-line description.
    pub description: String,
    /// The parent preset, if any.
    pub extends: Option<String>,
    /// Origins of the chain, this preset first, root last.
    pub chain: Vec<PresetOrigin>,
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
    #[serde(default)]
    #[allow(dead_code)]
    cluster: Option<super::model::Cluster>,
}

/// One parsed file: its raw table (minus the preset's own keys) and metadata.
struct ParsedFile {
    origin: PresetOrigin,
    description: String,
    extends: Option<(String, Option<usize>)>,
    table: toml::Table,
}

/// The 1-based line of byte `offset` in `text` (for `file:line` in TOML errors).
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .bytes()
        .filter(|b| *b == b'\n')
        .count()
        + 1
}

/// Reads and checks one preset on its own (no `extends` resolution).
fn parse(origin: &PresetOrigin) -> Result<ParsedFile, PresetError> {
    let text = origin.text()?;
    let path = origin.display_path();
    let doc: PresetDoc = toml::from_str(&text).map_err(|e| {
        let line = e.span().map(|s| line_of(&text, s.start));
        PresetError::new(&path, line, e.message().trim().to_string())
    })?;
    let mut table: toml::Table = toml::from_str(&text)
        .map_err(|e| PresetError::new(&path, None, e.message().trim().to_string()))?;
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
        origin: origin.clone(),
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

/// Where presets come from, searched in order, the first source holding a name winning:
/// the directories (highest priority first), then, in a standard store, the presets bundled
/// into the binary. A name is looked up the same way wherever it appears, so a user preset
/// named like a bundled one also replaces it as the parent of bundled presets that extend it.
/// A preset that extends its own name (`baseline.toml` with `extends = "baseline"`) extends
/// the preset of that name in the next sources down, which is how one adjusts a bundled preset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresetStore {
    /// Directories, highest priority first.
    pub dirs: Vec<PathBuf>,
    /// Whether the bundled presets follow the directories.
    pub bundled: bool,
}

/// Env var naming an extra presets directory, searched first (same as `--presets-dir`).
pub const PRESETS_DIR_ENV: &str = "MXTUNE_PRESETS_DIR";

/// mxtune's configuration directory: `$XDG_CONFIG_HOME/mxtune` or `~/.config/mxtune`.
pub fn config_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("mxtune"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".config/mxtune"))
}

/// The user's presets directory: `$XDG_CONFIG_HOME/mxtune/presets` or `~/.config/mxtune/presets`.
pub fn user_presets_dir() -> Option<PathBuf> {
    config_dir().map(|d| d.join("presets"))
}

/// Where new presets go (the panel's `s`, `recipe import`): the `--presets-dir` /
/// `MXTUNE_PRESETS_DIR` directory when given, because it is searched first and so what is
/// saved is what loads; else the user directory. `None` without HOME or XDG_CONFIG_HOME.
pub fn save_dir(explicit: Option<PathBuf>) -> Option<PathBuf> {
    explicit.or_else(user_presets_dir)
}

/// A preset name and where it is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresetEntry {
    /// Name (file stem).
    pub name: String,
    /// The source that wins.
    pub origin: PresetOrigin,
    /// Presets of the same name in later sources that this one hides, in search order.
    pub shadows: Vec<PresetOrigin>,
}

impl PresetStore {
    /// A store over these directories only, highest priority first (no bundled presets).
    pub fn new(dirs: Vec<PathBuf>) -> Self {
        PresetStore {
            dirs,
            bundled: false,
        }
    }

    /// The standard store: `explicit` (`--presets-dir` / `MXTUNE_PRESETS_DIR`) when given,
    /// then the user directory, then the bundled presets.
    pub fn standard(explicit: Option<PathBuf>) -> Self {
        let mut dirs: Vec<PathBuf> = explicit.into_iter().collect();
        if let Some(user) = user_presets_dir()
            && !dirs.iter().any(|d| same_path(d, &user))
        {
            dirs.push(user);
        }
        PresetStore {
            dirs,
            bundled: true,
        }
    }

    /// The sources in search order, for messages.
    pub fn sources(&self) -> String {
        let mut s: Vec<String> = self.dirs.iter().map(|d| d.display().to_string()).collect();
        if self.bundled {
            s.push("the bundled presets".into());
        }
        s.join(", ")
    }

    /// Every preset name, sorted, the first source winning.
    pub fn list(&self) -> Result<Vec<PresetEntry>, PresetError> {
        let mut out: Vec<PresetEntry> = Vec::new();
        let mut add =
            |name: String, origin: PresetOrigin| match out.iter_mut().find(|e| e.name == name) {
                Some(e) => e.shadows.push(origin),
                None => out.push(PresetEntry {
                    name,
                    origin,
                    shadows: Vec::new(),
                }),
            };
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
            for ent in rd {
                let ent = ent.map_err(|e| {
                    PresetError::new(dir, None, format!("cannot list presets: {e}"))
                })?;
                let p = ent.path();
                if p.extension().is_some_and(|x| x == "toml")
                    && let Some(stem) = p.file_stem()
                {
                    add(stem.to_string_lossy().into_owned(), PresetOrigin::File(p));
                }
            }
        }
        if self.bundled {
            for (name, _) in super::bundled::BUNDLED {
                add((*name).to_string(), PresetOrigin::Bundled(name));
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The first source at or after `from` (0 = the first directory, `dirs.len()` = the
    /// bundled presets) holding preset `name`, with its position.
    fn lookup(&self, name: &str, from: usize) -> Option<(usize, PresetOrigin)> {
        for (i, dir) in self.dirs.iter().enumerate().skip(from) {
            let p = dir.join(format!("{name}.toml"));
            if p.is_file() {
                return Some((i, PresetOrigin::File(p)));
            }
        }
        if self.bundled && from <= self.dirs.len() {
            return super::bundled::text(name)
                .map(|(n, _)| (self.dirs.len(), PresetOrigin::Bundled(n)));
        }
        None
    }

    /// Where preset `name` is found.
    pub fn find(&self, name: &str) -> Option<PresetOrigin> {
        self.lookup(name, 0).map(|(_, o)| o)
    }

    /// The position of `origin` among the sources, when it is one of them.
    fn position(&self, origin: &PresetOrigin) -> Option<usize> {
        match origin {
            PresetOrigin::Bundled(_) => self.bundled.then_some(self.dirs.len()),
            PresetOrigin::File(p) => {
                let parent = p.parent()?;
                self.dirs.iter().position(|d| same_path(d, parent))
            }
        }
    }

    fn known(&self) -> String {
        let known: Vec<String> = self
            .list()
            .map(|l| l.into_iter().map(|e| e.name).collect())
            .unwrap_or_default();
        if known.is_empty() {
            "(none)".into()
        } else {
            known.join(", ")
        }
    }

    /// Loads preset `name`, resolving `extends`.
    pub fn load(&self, name: &str) -> Result<Preset, PresetError> {
        let origin = self.find(name).ok_or_else(|| {
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
                    self.sources(),
                    self.known()
                ),
            )
        })?;
        self.load_origin(&origin)
    }

    /// Loads a preset file (which may extend presets of this store).
    pub fn load_file(&self, path: &Path) -> Result<Preset, PresetError> {
        self.load_origin(&PresetOrigin::File(path.to_path_buf()))
    }

    /// Loads the preset at `origin`, resolving `extends` through this store.
    pub fn load_origin(&self, origin: &PresetOrigin) -> Result<Preset, PresetError> {
        let name = origin.name();
        let mut files = vec![(self.position(origin), parse(origin)?)];
        while let Some((level, child)) = files.last() {
            let Some((parent, line)) = child.extends.clone() else {
                break;
            };
            let child_name = child.origin.name();
            let child_path = child.origin.display_path();
            // Extending one's own name means the preset of that name further down the sources;
            // a file outside the store (a path argument) looks from the top.
            let from = match level {
                Some(l) if parent == child_name => l + 1,
                _ => 0,
            };
            let (plevel, porigin) = self.lookup(&parent, from).ok_or_else(|| {
                let message = if parent == child_name {
                    format!(
                        "extends = \"{parent}\" (its own name) needs a preset `{parent}` in a source after this one ({}); there is none",
                        self.sources()
                    )
                } else {
                    format!(
                        "extends = \"{parent}\": no such preset; known: {}",
                        self.known()
                    )
                };
                PresetError::new(&child_path, line, message)
            })?;
            if files.iter().any(|(_, f)| f.origin.same(&porigin)) {
                let mut names: Vec<String> = files.iter().map(|(_, f)| f.origin.name()).collect();
                names.push(parent);
                return Err(PresetError::new(
                    &child_path,
                    line,
                    format!("`extends` cycle: {}", names.join(" → ")),
                ));
            }
            files.push((Some(plevel), parse(&porigin)?));
        }
        let mut merged = toml::Table::new();
        for (_, f) in files.iter().rev() {
            merge(&mut merged, f.table.clone());
        }
        let flags: FlagSet =
            toml::Value::Table(merged)
                .try_into()
                .map_err(|e: toml::de::Error| {
                    PresetError::new(
                        &origin.display_path(),
                        None,
                        format!("after merging `extends`: {}", e.message().trim()),
                    )
                })?;
        let first = &files[0].1;
        Ok(Preset {
            name,
            origin: origin.clone(),
            description: first.description.clone(),
            extends: first.extends.as_ref().map(|(p, _)| p.clone()),
            chain: files.iter().map(|(_, f)| f.origin.clone()).collect(),
            flags,
        })
    }

    /// Where (preset and line) the nearest preset of the chain sets one of `keys` (`section.key`).
    pub fn locate(&self, preset: &Preset, keys: &[&str]) -> Option<(PresetOrigin, usize)> {
        for origin in &preset.chain {
            let Ok(text) = origin.text() else {
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
                    return Some((origin.clone(), i + 1));
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
        // Two presets of one name hide each other wherever the name is used (a bundled
        // `baseline` is also the parent of `final`), so that too takes an explicit yes.
        if !req.overwrite
            && let Some(other) = self.find(req.name)
            && !other.same(&PresetOrigin::File(path.clone()))
        {
            bail!(
                "a preset named `{}` already exists ({other}); saving {} would hide one of them \
                 wherever `{}` is used: pick another name, or pass overwrite to save it anyway",
                req.name,
                path.display(),
                req.name
            );
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
        // Its own name means the next source down, of which this store has none.
        let (_d, s) = store_with(&[("a", "extends = \"a\"\n")]);
        assert!(s.load("a").unwrap_err().message.contains("its own name"));
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
        assert!(file.display_path().ends_with("mid.toml") && line == 3);
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
            matches!(&l[0].shadows[..], [PresetOrigin::File(p)] if p.starts_with(d2.path())),
            "{l:?}"
        );
    }

    fn standard_with(files: &[(&str, &str)]) -> (tempfile::TempDir, PresetStore) {
        let (d, _) = store_with(files);
        let s = PresetStore {
            dirs: vec![d.path().to_path_buf()],
            bundled: true,
        };
        (d, s)
    }

    #[test]
    fn a_directory_adds_to_and_replaces_bundled_presets_by_name() {
        let (d, s) = standard_with(&[
            (
                "baseline",
                "description = \"mine\"\n[axes]\nmoe_backend = \"triton\"\n",
            ),
            (
                "extra",
                "extends = \"engine-cpu-tiny\"\n[serving]\nmax_num_seqs = 3\n",
            ),
        ]);
        let l = s.list().unwrap();
        let base = l.iter().find(|e| e.name == "baseline").unwrap();
        assert_eq!(
            base.origin,
            PresetOrigin::File(d.path().join("baseline.toml"))
        );
        assert_eq!(base.shadows, vec![PresetOrigin::Bundled("baseline")]);
        let tiny = l.iter().find(|e| e.name == DEFAULT_PRESET).unwrap();
        assert_eq!(tiny.origin, PresetOrigin::Bundled(DEFAULT_PRESET));
        assert_eq!(l.len(), super::super::bundled::BUNDLED.len() + 1);

        // A directory preset extends a bundled one …
        let extra = s.load("extra").unwrap();
        assert_eq!(
            extra.chain,
            vec![
                PresetOrigin::File(d.path().join("extra.toml")),
                PresetOrigin::Bundled(DEFAULT_PRESET)
            ]
        );
        assert_eq!(extra.flags.serving.max_num_seqs, Some(3));
        assert_eq!(
            extra.flags.serving.max_model_len,
            Some(4096),
            "from the bundled parent"
        );
        assert_eq!(extra.flags.target, TargetKind::Engine);
        // … and a bundled preset's parent is looked up by name too, so the override counts.
        let fin = s.load("final").unwrap();
        assert_eq!(
            fin.chain[1],
            PresetOrigin::File(d.path().join("baseline.toml"))
        );
        assert_eq!(
            fin.flags.axes.moe_backend,
            MoeBackend::Cutlass,
            "final's own key"
        );
        let (o, line) = s.locate(&fin, &["axes.moe_backend"]).unwrap();
        assert_eq!((o, line > 0), (PresetOrigin::Bundled("final"), true));
    }

    #[test]
    fn extending_its_own_name_reaches_the_next_source_down() {
        let (d, s) = standard_with(&[(
            "baseline",
            "description = \"bundled baseline, less memory\"\nextends = \"baseline\"\n[serving]\ngpu_memory_utilization = 0.5\n",
        )]);
        let p = s.load("baseline").unwrap();
        assert_eq!(p.chain[1], PresetOrigin::Bundled("baseline"));
        assert_eq!(p.flags.serving.gpu_memory_utilization, Some(0.5));
        assert_eq!(
            p.flags.axes.moe_backend,
            MoeBackend::Marlin,
            "from the bundled one"
        );
        // With nothing further down it is an error, not a cycle.
        let lone = PresetStore::new(vec![d.path().to_path_buf()]);
        let e = lone.load("baseline").unwrap_err();
        assert!(
            e.message.contains("its own name") && e.line == Some(2),
            "{e}"
        );
    }

    #[test]
    fn saving_a_bundled_name_needs_overwrite() {
        let (d, s) = standard_with(&[]);
        let flags = s.load("baseline").unwrap().flags;
        let req = SaveRequest {
            name: "baseline",
            description: "mine",
            extends: None,
            flags: &flags,
            overwrite: false,
        };
        let e = s.save(d.path(), &req).unwrap_err().to_string();
        assert!(
            e.contains("bundled:presets/baseline.toml") && e.contains("overwrite"),
            "{e}"
        );
        assert!(!d.path().join("baseline.toml").exists());
        let path = s
            .save(
                d.path(),
                &SaveRequest {
                    overwrite: true,
                    ..req
                },
            )
            .unwrap();
        assert_eq!(s.find("baseline"), Some(PresetOrigin::File(path)));
    }

    #[test]
    fn bundled_presets_all_load_and_render() {
        let s = PresetStore {
            dirs: Vec::new(),
            bundled: true,
        };
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
            ..Default::default()
        };
        for n in &names {
            let p = s.load(n).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                p.chain
                    .iter()
                    .all(|o| matches!(o, PresetOrigin::Bundled(_))),
                "{n}: {:?}",
                p.chain
            );
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
