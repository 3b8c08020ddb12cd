//! Finding the checkpoint `--model` names: a directory as given, else the model's name
//! under `MXTUNE_MODEL_DIR`, else a snapshot in the Hugging Face hub cache
//! (`models--openai--gpt-oss-120b/snapshots/<rev>/`). The answer says which was used;
//! when nothing is found, the error lists every place looked and what to do.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// Where the lookups happen (the process environment, or a test's).
#[derive(Debug, Clone, Default)]
pub struct Places {
    /// `MXTUNE_MODEL_DIR`: a directory holding checkpoints by name.
    pub model_dir: Option<PathBuf>,
    /// `HF_HUB_CACHE`.
    pub hf_hub_cache: Option<PathBuf>,
    /// `HF_HOME` (its `hub/` is the cache).
    pub hf_home: Option<PathBuf>,
    /// `HOME` (`~/.cache/huggingface/hub`).
    pub home: Option<PathBuf>,
}

impl Places {
    /// From the process environment (empty values count as unset).
    pub fn from_env() -> Self {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Places {
            model_dir: var("MXTUNE_MODEL_DIR"),
            hf_hub_cache: var("HF_HUB_CACHE"),
            hf_home: var("HF_HOME"),
            home: var("HOME"),
        }
    }

    /// The Hugging Face hub cache directory these places point at.
    pub fn hub(&self) -> Option<PathBuf> {
        self.hf_hub_cache
            .clone()
            .or_else(|| self.hf_home.as_ref().map(|h| h.join("hub")))
            .or_else(|| self.home.as_ref().map(|h| h.join(".cache/huggingface/hub")))
    }
}

/// A checkpoint directory and how it was found, in one line for the start-up report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The directory holding `config.json` and the safetensors.
    pub dir: PathBuf,
    /// How it was found, e.g. "from the Hugging Face cache (revision abc123)".
    pub how: String,
}

/// Find the checkpoint `model` names (a path, a name such as `gpt-oss-120b`, or a hub
/// id such as `openai/gpt-oss-120b`).
pub fn locate(model: &Path, places: &Places) -> Result<Located> {
    let given = model.display().to_string();
    if model.is_dir() {
        return Ok(Located {
            dir: model.to_path_buf(),
            how: "as given by --model".into(),
        });
    }
    let text = given.trim_end_matches('/');
    let name = text.rsplit('/').next().unwrap_or(text).to_string();
    // `org/name` (two parts, not a path) is a hub id; anything else belongs to openai.
    let org = match text.split('/').collect::<Vec<_>>()[..] {
        [org, _] if !text.starts_with('.') && !org.is_empty() => org.to_string(),
        _ => "openai".to_string(),
    };
    let mut looked = vec![format!("{given}: not a directory")];
    match &places.model_dir {
        Some(root) => {
            let dir = root.join(&name);
            if dir.is_dir() {
                return Ok(Located {
                    how: format!("from MXTUNE_MODEL_DIR ({})", root.display()),
                    dir,
                });
            }
            looked.push(format!("MXTUNE_MODEL_DIR: no {}", dir.display()));
        }
        None => looked.push("MXTUNE_MODEL_DIR: not set".into()),
    }
    match places.hub() {
        Some(hub) => {
            let repo = hub.join(format!("models--{org}--{name}"));
            if let Some((dir, rev)) = snapshot(&repo) {
                return Ok(Located {
                    dir,
                    how: format!(
                        "from the Hugging Face cache ({}, revision {rev})",
                        hub.display()
                    ),
                });
            }
            looked.push(format!(
                "Hugging Face cache: no snapshot with config.json in {}",
                repo.display()
            ));
        }
        None => looked.push("Hugging Face cache: HOME, HF_HOME and HF_HUB_CACHE unset".into()),
    }
    bail!(
        "no checkpoint for {given}; looked at: {}. Download it (`hf download {org}/{name}` \
         fills the Hugging Face cache), set MXTUNE_MODEL_DIR to a directory holding {name}/, \
         pass --model DIR, or measure speed now with --synthetic {name}",
        looked.join("; ")
    )
}

/// The snapshot `refs/main` names, else the most recently modified one; only snapshots
/// holding a `config.json` count (a download in progress may not have it yet).
fn snapshot(repo: &Path) -> Option<(PathBuf, String)> {
    let snapshots = repo.join("snapshots");
    let usable = |rev: &str| {
        let dir = snapshots.join(rev);
        dir.join("config.json")
            .is_file()
            .then(|| (dir, rev.to_string()))
    };
    if let Ok(main) = std::fs::read_to_string(repo.join("refs/main"))
        && let Some(found) = usable(main.trim())
    {
        return Some(found);
    }
    let mut revs: Vec<(std::time::SystemTime, String)> = std::fs::read_dir(&snapshots)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let modified = e.metadata().ok()?.modified().ok()?;
            Some((modified, e.file_name().to_string_lossy().into_owned()))
        })
        .collect();
    revs.sort();
    revs.iter().rev().find_map(|(_, rev)| usable(rev))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("config.json"), "{}").unwrap();
    }

    #[test]
    fn a_directory_as_given_wins() {
        let t = tempfile::tempdir().unwrap();
        let l = locate(t.path(), &Places::default()).unwrap();
        assert_eq!(l.dir, t.path());
        assert_eq!(l.how, "as given by --model");
    }

    #[test]
    fn a_name_is_found_in_mxtune_model_dir_then_the_hub_cache() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().join("home");
        let hub = home.join(".cache/huggingface/hub/models--openai--gpt-oss-120b");
        checkpoint(&hub.join("snapshots/abc123"));
        std::fs::create_dir_all(hub.join("refs")).unwrap();
        std::fs::write(hub.join("refs/main"), "abc123\n").unwrap();
        // An unfinished download (no config.json yet) is passed over.
        std::fs::create_dir_all(hub.join("snapshots/zzz999")).unwrap();
        let mut places = Places {
            home: Some(home.clone()),
            ..Places::default()
        };
        for given in [
            "gpt-oss-120b",
            "openai/gpt-oss-120b",
            "/nowhere/gpt-oss-120b",
        ] {
            let l = locate(Path::new(given), &places).unwrap();
            assert_eq!(l.dir, hub.join("snapshots/abc123"), "{given}");
            assert!(
                l.how.contains("Hugging Face cache") && l.how.contains("abc123"),
                "{}",
                l.how
            );
        }
        // Without refs/main, the newest usable snapshot.
        std::fs::remove_file(hub.join("refs/main")).unwrap();
        let l = locate(Path::new("gpt-oss-120b"), &places).unwrap();
        assert_eq!(l.dir, hub.join("snapshots/abc123"));
        // MXTUNE_MODEL_DIR comes first.
        let mine = t.path().join("models");
        checkpoint(&mine.join("gpt-oss-120b"));
        places.model_dir = Some(mine.clone());
        let l = locate(Path::new("gpt-oss-120b"), &places).unwrap();
        assert_eq!(l.dir, mine.join("gpt-oss-120b"));
        assert!(l.how.contains("MXTUNE_MODEL_DIR"), "{}", l.how);
        // HF_HUB_CACHE replaces the default cache.
        let other = t.path().join("hub");
        let places = Places {
            hf_hub_cache: Some(other.clone()),
            home: Some(home),
            ..Places::default()
        };
        let e = locate(Path::new("gpt-oss-120b"), &places).unwrap_err();
        assert!(
            e.to_string().contains(
                &other
                    .join("models--openai--gpt-oss-120b")
                    .display()
                    .to_string()
            ),
            "{e}"
        );
    }

    #[test]
    fn nothing_found_says_where_it_looked_and_what_to_do() {
        let t = tempfile::tempdir().unwrap();
        let places = Places {
            home: Some(t.path().to_path_buf()),
            ..Places::default()
        };
        let e = locate(Path::new("gpt-oss-20b"), &places)
            .unwrap_err()
            .to_string();
        for needle in [
            "no checkpoint for gpt-oss-20b",
            "MXTUNE_MODEL_DIR: not set",
            "models--openai--gpt-oss-20b",
            "hf download openai/gpt-oss-20b",
            "--synthetic gpt-oss-20b",
        ] {
            assert!(e.contains(needle), "{needle} in {e}");
        }
    }
}
