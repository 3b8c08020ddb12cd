//! `engine profile --timeline`: where a captured decode step's time goes, kernel by kernel.
//!
//! Kernels compiled with `STEP_TIMELINE=1` (common.cuh) record, for every block, the global
//! timer when the block enters and when it is past its wait on the previous kernel
//! (`griddepcontrol.wait`), with its SM and its grid's shape; the host logs the step's launches
//! in order while the graph is captured ([`super::device::Gpu::open_timeline`]). Matching the
//! two gives each launch its first block's entry and its wait's release — the moment the
//! previous grid had finished — so the time from one kernel's release to the next kernel's is
//! that kernel's share of the step's critical path, measured inside the graph with every
//! overlap the programmatic launches allow (which per-kernel events, graphs off, cannot show).

use std::collections::HashMap;
use std::fmt::Write as _;

/// Most records one step may leave (each 4 words of 8 bytes: 32 MiB of device memory).
pub const CAPACITY: usize = 1 << 20;

/// One block's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Global timer (ns) when the block entered.
    pub entered: u64,
    /// Global timer (ns) once past its wait on the previous kernel.
    pub released: u64,
    /// Index of its kernel file in `compile::KERNEL_FILES`.
    pub module: u32,
    /// Blocks of its grid.
    pub blocks: u32,
    /// Threads of a block.
    pub threads: u32,
    /// The SM it ran on.
    pub sm: u32,
}

/// One logged launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// The kernel's name.
    pub kernel: &'static str,
    /// Index of its kernel file in `compile::KERNEL_FILES`.
    pub module: u32,
    /// Blocks of its grid.
    pub blocks: u32,
    /// Threads of a block.
    pub threads: u32,
}

/// The first `count` records of the kernels' buffer (4 words each, as common.cuh writes them).
pub fn decode(words: &[u64], count: usize) -> Vec<Record> {
    words
        .chunks_exact(4)
        .take(count)
        .map(|r| Record {
            entered: r[0],
            released: r[1],
            module: (r[2] >> 56) as u32,
            blocks: ((r[2] >> 24) & 0xffff_ffff) as u32,
            threads: (r[2] & 0xff_ffff) as u32,
            sm: r[3] as u32,
        })
        .collect()
}

/// One launch on the time line.
#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    pub launch: Launch,
    /// Its first block's entry (ns).
    pub first_entry: u64,
    /// Its wait's release: the earliest of its blocks' (ns).
    pub release: u64,
    /// Blocks that entered before the release (resident before the previous grid ended).
    pub early: u32,
}

/// Put the launches on the time line: a launch's records are the next `blocks` records, in
/// entry order, of its (file, grid, block) shape. `None` when the records do not match the
/// launches one block each (a block that returned before its wait, or records dropped), with
/// what did not match: the figures would be wrong.
pub fn place(launches: &[Launch], records: &[Record]) -> Result<Vec<Placed>, String> {
    let mut by_shape: HashMap<(u32, u32, u32), Vec<&Record>> = HashMap::new();
    for r in records {
        by_shape
            .entry((r.module, r.blocks, r.threads))
            .or_default()
            .push(r);
    }
    for v in by_shape.values_mut() {
        v.sort_by_key(|r| (r.entered, r.released));
    }
    let mut used: HashMap<(u32, u32, u32), usize> = HashMap::new();
    let mut out = Vec::with_capacity(launches.len());
    for l in launches {
        let key = (l.module, l.blocks, l.threads);
        let have = by_shape.get(&key).map_or(&[][..], |v| &v[..]);
        let start = used.entry(key).or_default();
        let end = *start + l.blocks as usize;
        if end > have.len() {
            return Err(format!(
                "{} ({} blocks of {} threads): {} records for its launches so far",
                l.kernel,
                l.blocks,
                l.threads,
                have.len()
            ));
        }
        let mine = &have[*start..end];
        *start = end;
        let release = mine.iter().map(|r| r.released).min().unwrap_or(0);
        out.push(Placed {
            launch: *l,
            first_entry: mine.iter().map(|r| r.entered).min().unwrap_or(0),
            release,
            early: mine.iter().filter(|r| r.entered < release).count() as u32,
        });
    }
    for (key, v) in &by_shape {
        let taken = used.get(key).copied().unwrap_or(0);
        if taken != v.len() {
            return Err(format!(
                "{} records of a grid of {} blocks × {} threads (file {}) belong to no launch",
                v.len() - taken,
                key.1,
                key.2,
                key.0
            ));
        }
    }
    Ok(out)
}

/// Per kernel and grid size, over the step: launches, the critical path from each launch's
/// release to the next launch's (the step's last launch has none), how long before its
/// release its first block entered, and the share of its blocks resident before it.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub kernel: &'static str,
    pub blocks: u32,
    pub launches: usize,
    /// Critical path summed over its launches (µs).
    pub crit_us: f64,
    /// Mean lead of the first block before the release (µs).
    pub lead_us: f64,
    /// Mean share of blocks entered before the release.
    pub early: f64,
}

/// [`Summary`] rows of a placed step, the largest critical path first.
pub fn summarize(placed: &[Placed]) -> Vec<Summary> {
    let mut rows: Vec<Summary> = Vec::new();
    for (i, p) in placed.iter().enumerate() {
        let crit = placed
            .get(i + 1)
            .map_or(0.0, |n| n.release.saturating_sub(p.release) as f64 / 1e3);
        let lead = p.release.saturating_sub(p.first_entry) as f64 / 1e3;
        let early = f64::from(p.early) / f64::from(p.launch.blocks.max(1));
        match rows
            .iter_mut()
            .find(|r| r.kernel == p.launch.kernel && r.blocks == p.launch.blocks)
        {
            Some(r) => {
                r.launches += 1;
                r.crit_us += crit;
                r.lead_us += lead;
                r.early += early;
            }
            None => rows.push(Summary {
                kernel: p.launch.kernel,
                blocks: p.launch.blocks,
                launches: 1,
                crit_us: crit,
                lead_us: lead,
                early,
            }),
        }
    }
    for r in &mut rows {
        r.lead_us /= r.launches as f64;
        r.early /= r.launches as f64;
    }
    rows.sort_by(|a, b| b.crit_us.total_cmp(&a.crit_us));
    rows
}

/// The table `engine profile --timeline` prints.
pub fn table(rows: &[Summary], step_us: f64) -> String {
    let mut s = format!(
        "  {:<34} {:>7} {:>5} {:>10} {:>9} {:>6} {:>9} {:>7}\n",
        "kernel", "blocks", "runs", "crit µs", "per run", "share", "lead µs", "early"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "  {:<34} {:>7} {:>5} {:>10.1} {:>9.2} {:>5.1}% {:>9.2} {:>6.1}%",
            r.kernel,
            r.blocks,
            r.launches,
            r.crit_us,
            r.crit_us / r.launches as f64,
            if step_us > 0.0 {
                100.0 * r.crit_us / step_us
            } else {
                0.0
            },
            r.lead_us,
            100.0 * r.early
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(entered: u64, released: u64, module: u32, blocks: u32) -> Record {
        Record {
            entered,
            released,
            module,
            blocks,
            threads: 256,
            sm: 0,
        }
    }

    fn launch(kernel: &'static str, module: u32, blocks: u32) -> Launch {
        Launch {
            kernel,
            module,
            blocks,
            threads: 256,
        }
    }

    #[test]
    fn decode_reads_what_common_cuh_writes() {
        let key = (3u64 << 56) | (320u64 << 24) | 256;
        let r = decode(&[10, 20, key, 7, 0, 0, 0, 0], 1);
        assert_eq!(
            r,
            vec![Record {
                entered: 10,
                released: 20,
                module: 3,
                blocks: 320,
                threads: 256,
                sm: 7
            }]
        );
    }

    #[test]
    fn two_layers_of_two_kernels_on_the_critical_path() {
        // a (2 blocks) then b (1 block), twice; b's blocks enter before a ends.
        let launches = [
            launch("a", 1, 2),
            launch("b", 2, 1),
            launch("a", 1, 2),
            launch("b", 2, 1),
        ];
        let records = [
            rec(0, 1_000, 1, 2),
            rec(100, 1_100, 1, 2),
            rec(500, 4_000, 2, 1),
            rec(4_500, 6_000, 1, 2),
            rec(4_600, 6_000, 1, 2),
            rec(7_000, 9_000, 2, 1),
        ];
        let placed = place(&launches, &records).unwrap();
        assert_eq!(
            placed.iter().map(|p| p.release).collect::<Vec<_>>(),
            [1_000, 4_000, 6_000, 9_000]
        );
        assert_eq!(placed[1].early, 1);
        assert_eq!(placed[3].early, 1);
        let rows = summarize(&placed);
        // a: 3 µs + 3 µs; b: 2 µs (the last launch has no next release).
        assert_eq!(rows[0].kernel, "a");
        assert!((rows[0].crit_us - 6.0).abs() < 1e-9);
        assert_eq!(rows[0].launches, 2);
        assert!((rows[1].crit_us - 2.0).abs() < 1e-9);
        assert!((rows[1].lead_us - 2.75).abs() < 1e-9);
        let t = table(&rows, 8.0);
        assert!(t.contains("crit µs") && t.contains("75.0%"), "{t}");
    }

    #[test]
    fn records_that_match_no_launch_are_refused() {
        let launches = [launch("a", 1, 2)];
        let short = place(&launches, &[rec(0, 1, 1, 2)]).unwrap_err();
        assert!(short.contains("a (2 blocks"), "{short}");
        let extra = [rec(0, 1, 1, 2), rec(0, 1, 1, 2), rec(5, 6, 4, 1)];
        let err = place(&launches, &extra).unwrap_err();
        assert!(err.contains("belong to no launch"), "{err}");
    }
}
