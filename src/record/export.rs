//! Files written under a name the operator chose or will look for (comparisons, saved logs and
//! commands, recipes, A/B results): an existing file is never replaced, because it may be the
//! only copy of an earlier export or something edited by hand.

use anyhow::{Context, Result, bail};
use std::fs::OpenOptions;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path`, which must not exist yet; the error names the file and what to do.
pub fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    match create_and_write(path, bytes) {
        Ok(true) => Ok(()),
        Ok(false) => bail!(
            "{} exists; not replacing it: remove it or choose another name",
            path.display()
        ),
        Err(e) => Err(e).with_context(|| format!("cannot write {}", path.display())),
    }
}

/// Writes `bytes` to `path`, or, when that name is taken, to the first free `stem-2.ext`,
/// `stem-3.ext`…; returns the file written, so the caller can say where it went.
pub fn write_fresh(path: &Path, bytes: &[u8]) -> Result<PathBuf> {
    let candidates =
        std::iter::once(path.to_path_buf()).chain((2..10_000).map(|n| numbered(path, n)));
    for candidate in candidates {
        match create_and_write(&candidate, bytes) {
            Ok(true) => return Ok(candidate),
            Ok(false) => continue,
            Err(e) => {
                return Err(e).with_context(|| format!("cannot write {}", candidate.display()));
            }
        }
    }
    bail!(
        "{} and 9,999 numbered names next to it exist; clear some out",
        path.display()
    )
}

/// `dir/stem-n.ext` for `dir/stem.ext` (no extension: `dir/name-n`).
fn numbered(path: &Path, n: u32) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}-{n}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{n}"),
    };
    path.with_file_name(name)
}

/// `Ok(false)` when the name is taken. `create_new` makes the check and the creation one step,
/// so a file appearing meanwhile is not replaced either.
fn create_and_write(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    let mut f = match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(e),
    };
    if let Err(e) = f.write_all(bytes).and_then(|()| f.flush()) {
        // A half-written export is worse than none: the name stays free for the next try.
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_new_refuses_an_existing_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.yaml");
        write_new(&p, b"one").unwrap();
        let e = write_new(&p, b"two").unwrap_err().to_string();
        assert!(e.contains("r.yaml exists"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
    }

    #[test]
    fn write_fresh_picks_the_next_free_name() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("compare-a-b.md");
        assert_eq!(write_fresh(&p, b"1").unwrap(), p);
        assert_eq!(
            write_fresh(&p, b"2").unwrap(),
            d.path().join("compare-a-b-2.md")
        );
        assert_eq!(
            write_fresh(&p, b"3").unwrap(),
            d.path().join("compare-a-b-3.md")
        );
        assert_eq!(std::fs::read(&p).unwrap(), b"1");
        let bare = d.path().join("log");
        write_fresh(&bare, b"x").unwrap();
        assert_eq!(write_fresh(&bare, b"y").unwrap(), d.path().join("log-2"));
        let e = write_fresh(&d.path().join("no/such/dir.md"), b"x").unwrap_err();
        assert!(format!("{e:#}").contains("no/such/dir.md"), "{e:#}");
    }
}
