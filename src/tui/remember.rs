//! What the panel remembers between sessions: the preset it last loaded, in
//! `panel.toml` of mxtune's configuration directory (`$XDG_CONFIG_HOME/mxtune`, else
//! `~/.config/mxtune`). `mxtune --preset NAME` starts on NAME instead.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::flags::preset::DEFAULT_PRESET;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Remembered {
    preset: Option<String>,
}

/// The file, where there is a configuration directory.
pub fn file() -> Option<PathBuf> {
    crate::flags::preset::config_dir().map(|d| d.join("panel.toml"))
}

/// The preset remembered in `file`; nothing when there is no file or it cannot be read.
pub fn last_preset(file: &Path) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    toml::from_str::<Remembered>(&text).ok()?.preset
}

/// Remember `name` in `file` (written whole to a temporary file, then renamed over it).
pub fn save_preset(file: &Path, name: &str) -> Result<()> {
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let text = toml::to_string(&Remembered {
        preset: Some(name.to_string()),
    })
    .context("encoding the remembered preset")?;
    let tmp = file.with_extension("toml.tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, file).with_context(|| format!("replacing {}", file.display()))
}

/// The preset the panel starts on: `--preset` when given, else the remembered one while it
/// still exists (`exists`), else the default; with a note when a remembered one is gone.
pub fn start_preset(
    given: Option<&str>,
    remembered: Option<String>,
    exists: impl Fn(&str) -> bool,
) -> (String, Option<String>) {
    if let Some(name) = given {
        return (name.to_string(), None);
    }
    match remembered {
        Some(name) if exists(&name) => (name, None),
        Some(name) => (
            DEFAULT_PRESET.to_string(),
            Some(format!(
                "the preset of the last session, {name}, is gone; starting on {DEFAULT_PRESET}"
            )),
        ),
        None => (DEFAULT_PRESET.to_string(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_across_sessions_and_the_command_line_wins() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("config/mxtune/panel.toml");
        assert_eq!(last_preset(&f), None);
        save_preset(&f, "engine-q8").unwrap();
        assert_eq!(last_preset(&f).as_deref(), Some("engine-q8"));
        save_preset(&f, "final").unwrap();
        let remembered = last_preset(&f);
        assert_eq!(remembered.as_deref(), Some("final"));
        let all = |n: &str| n == "final" || n == "baseline";
        assert_eq!(start_preset(None, remembered.clone(), all).0, "final");
        assert_eq!(
            start_preset(Some("baseline"), remembered.clone(), all).0,
            "baseline"
        );
        assert_eq!(start_preset(None, None, all).0, DEFAULT_PRESET);
        let (name, note) = start_preset(None, remembered, |_| false);
        assert_eq!(name, DEFAULT_PRESET);
        assert!(note.is_some_and(|n| n.contains("final") && n.contains("gone")));
        // A broken file is no memory, not an error.
        std::fs::write(&f, "preset = [").unwrap();
        assert_eq!(last_preset(&f), None);
    }
}
