//! Bounded in-memory log buffer, mirrored to a log file beside the run record.

use super::LogStream;
use anyhow::{Context, Result};
use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The last `capacity` log lines in memory, every line on disk.
#[derive(Debug)]
pub struct LogBuffer {
    lines: VecDeque<(LogStream, String)>,
    capacity: usize,
    total: u64,
    file: Option<(PathBuf, std::fs::File)>,
    file_error: Option<String>,
}

impl LogBuffer {
    /// A buffer keeping `capacity` lines; `file`, when given, receives every line (appended).
    pub fn new(capacity: usize, file: Option<&Path>) -> Result<Self> {
        let file = match file {
            Some(path) => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).with_context(|| {
                        format!("cannot create log directory {}", dir.display())
                    })?;
                }
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("cannot open log file {}", path.display()))?;
                Some((path.to_path_buf(), f))
            }
            None => None,
        };
        Ok(Self {
            lines: VecDeque::with_capacity(capacity.min(4096)),
            capacity: capacity.max(1),
            total: 0,
            file,
            file_error: None,
        })
    }

    /// Appends a line. A failing log file is reported once by [`Self::take_file_error`]
    /// and then ignored, so a full disk never stops the target.
    pub fn push(&mut self, stream: LogStream, line: &str) {
        if let Some((path, f)) = &mut self.file
            && let Err(e) = writeln!(f, "{line}")
        {
            self.file_error = Some(format!("writing log file {} failed: {e}", path.display()));
            self.file = None;
        }
        if self.lines.len() == self.capacity {
            self.lines.pop_front();
        }
        self.lines.push_back((stream, line.to_string()));
        self.total += 1;
    }

    /// A log-file write error that has not been reported yet.
    pub fn take_file_error(&mut self) -> Option<String> {
        self.file_error.take()
    }

    /// The last `n` lines (or fewer).
    pub fn tail(&self, n: usize) -> Vec<String> {
        let skip = self.lines.len().saturating_sub(n);
        self.lines
            .iter()
            .skip(skip)
            .map(|(_, l)| l.clone())
            .collect()
    }

    /// Lines currently held in memory.
    pub fn lines(&self) -> impl Iterator<Item = &(LogStream, String)> {
        self.lines.iter()
    }

    /// Every line ever pushed, including those dropped from memory.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Where the log file is, if any.
    pub fn file_path(&self) -> Option<&Path> {
        self.file.as_ref().map(|(p, _)| p.as_path())
    }
}

/// Splits a byte stream into lines, keeping an unfinished last line for the next chunk.
#[derive(Debug, Default)]
pub struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    /// Feeds bytes and returns the complete lines (without `\n` / `\r\n`; a lone `\r`, as
    /// progress bars print, also ends a line).
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for &b in bytes {
            if b == b'\n' || b == b'\r' {
                if !self.pending.is_empty() {
                    out.push(String::from_utf8_lossy(&self.pending).into_owned());
                    self.pending.clear();
                }
            } else {
                self.pending.push(b);
            }
        }
        out
    }

    /// The unfinished last line, if any (at end of stream).
    pub fn finish(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            None
        } else {
            let s = String::from_utf8_lossy(&self.pending).into_owned();
            self.pending.clear();
            Some(s)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_is_bounded_and_file_gets_everything() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/run.log");
        let mut b = LogBuffer::new(3, Some(&path)).unwrap();
        for i in 0..5 {
            b.push(LogStream::Stdout, &format!("line {i}"));
        }
        assert_eq!(b.tail(10), vec!["line 2", "line 3", "line 4"]);
        assert_eq!(b.tail(1), vec!["line 4"]);
        assert_eq!(b.total(), 5);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 5);
    }

    #[test]
    fn splitter_handles_partial_lines_and_carriage_returns() {
        let mut s = LineSplitter::default();
        assert_eq!(s.feed(b"ab"), Vec::<String>::new());
        assert_eq!(s.feed(b"c\r\nde\rf"), vec!["abc", "de"]);
        assert_eq!(s.finish().as_deref(), Some("f"));
        assert_eq!(s.finish(), None);
    }
}
