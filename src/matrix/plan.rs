//! What a matrix runs: presets, test levels, the performance grid, order and heat settings.

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use crate::bench::client::Endpoint;
use crate::bench::workload::{LatencyMode, Workload};

/// One test level of the tuning protocol (tuning plan, Phase 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TestLevel {
    /// L1: the target becomes ready within the start-up watchdog.
    Smoke,
    /// L1.5: the kernel-path verdict; invalid makes performance results INVALID.
    KernelPath,
    /// L2: output sanity (coherent, exact length, logprobs, deterministic).
    Correctness,
    /// L3: stability under many sequential and concurrent requests.
    Stress,
    /// L4: the performance grid.
    Performance,
    /// L5: within ± tolerance of the newest earlier record of the preset on this host.
    Regression,
}

impl TestLevel {
    /// All levels in protocol order.
    pub const ALL: [TestLevel; 6] = [
        TestLevel::Smoke,
        TestLevel::KernelPath,
        TestLevel::Correctness,
        TestLevel::Stress,
        TestLevel::Performance,
        TestLevel::Regression,
    ];

    /// The plan's number, e.g. `1.5`.
    pub fn number(self) -> &'static str {
        match self {
            TestLevel::Smoke => "1",
            TestLevel::KernelPath => "1.5",
            TestLevel::Correctness => "2",
            TestLevel::Stress => "3",
            TestLevel::Performance => "4",
            TestLevel::Regression => "5",
        }
    }

    /// Short column title, e.g. `L1.5 kernel path`.
    pub fn title(self) -> &'static str {
        match self {
            TestLevel::Smoke => "L1 smoke",
            TestLevel::KernelPath => "L1.5 kernel path",
            TestLevel::Correctness => "L2 correctness",
            TestLevel::Stress => "L3 stress",
            TestLevel::Performance => "L4 performance",
            TestLevel::Regression => "L5 regression",
        }
    }
}

/// Parses `1,1.5,2,4` (also `L1,L1.5`) into levels in protocol order; L1 is always run
/// because nothing else can happen without a ready target.
pub fn parse_levels(spec: &str) -> Result<Vec<TestLevel>> {
    let mut out = vec![TestLevel::Smoke];
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let n = part.trim_start_matches(['L', 'l']);
        let Some(level) = TestLevel::ALL.iter().find(|l| l.number() == n) else {
            bail!("--levels: unknown level `{part}`; use numbers from 1, 1.5, 2, 3, 4, 5");
        };
        if !out.contains(level) {
            out.push(*level);
        }
    }
    out.sort();
    Ok(out)
}

/// The grid of `--grid pp=2048 tg=32,128 depth=0,4096 c=1 runs=3 warmup=1`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grid {
    /// Prompt lengths, tokens.
    pub pp: Vec<u32>,
    /// Generation lengths, tokens.
    pub tg: Vec<u32>,
    /// Context depths, tokens.
    pub depth: Vec<u32>,
    /// Concurrency values.
    pub concurrency: Vec<u32>,
    /// Measured runs per point.
    pub runs: u32,
    /// Warm-up runs per point.
    pub warmup: u32,
}

impl Default for Grid {
    fn default() -> Self {
        Grid {
            pp: vec![2048],
            tg: vec![32, 128],
            depth: vec![0],
            concurrency: vec![1],
            runs: 3,
            warmup: 1,
        }
    }
}

/// Built-in grid profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// The Spark Arena leaderboard's benchmark: pp 2048, tg 128, depths up to 100000,
    /// concurrency 1/2/5/10, 3 runs.
    SparkArena,
}

impl Profile {
    /// The profile's grid.
    pub fn grid(self) -> Grid {
        match self {
            Profile::SparkArena => Grid {
                pp: vec![2048],
                tg: vec![128],
                depth: vec![0, 4096, 8192, 16384, 32768, 65535, 100000],
                concurrency: vec![1, 2, 5, 10],
                runs: 3,
                warmup: 1,
            },
        }
    }
}

fn numbers(key: &str, values: &str) -> Result<Vec<u32>> {
    values
        .split(',')
        .map(|v| {
            v.trim().parse::<u32>().map_err(|_| {
                anyhow::anyhow!("--grid {key}={values}: `{v}` is not a whole number of tokens")
            })
        })
        .collect()
}

impl Grid {
    /// Applies `key=v1,v2` items over `self` (keys: pp, tg, depth|d, c|concurrency, runs,
    /// warmup).
    pub fn apply(mut self, items: &[String]) -> Result<Self> {
        for item in items.iter().flat_map(|i| i.split_whitespace()) {
            let Some((key, values)) = item.split_once('=') else {
                bail!("--grid item `{item}` is not key=value (e.g. pp=2048 tg=32,128)");
            };
            match key {
                "pp" => self.pp = numbers(key, values)?,
                "tg" => self.tg = numbers(key, values)?,
                "depth" | "d" => self.depth = numbers(key, values)?,
                "c" | "concurrency" => self.concurrency = numbers(key, values)?,
                "runs" | "r" => self.runs = one(key, values)?,
                "warmup" => self.warmup = one(key, values)?,
                other => {
                    bail!("--grid key `{other}` is unknown; use pp, tg, depth, c, runs, warmup")
                }
            }
        }
        Ok(self)
    }

    /// The bench module's workload for this grid.
    pub fn workload(&self, endpoint: Endpoint) -> Workload {
        Workload {
            pp: self.pp.clone(),
            tg: self.tg.clone(),
            depth: self.depth.clone(),
            concurrency: self.concurrency.clone(),
            runs: self.runs,
            warmup: self.warmup,
            no_cache: true,
            latency_mode: LatencyMode::Api,
            endpoint,
            token_ids: false,
            exact_output: true,
            logprobs: false,
        }
    }
}

fn one(key: &str, values: &str) -> Result<u32> {
    match numbers(key, values)?.as_slice() {
        [v] => Ok(*v),
        _ => bail!("--grid {key}= takes one number, got `{values}`"),
    }
}

/// Reproducible shuffle (Fisher–Yates over splitmix64): the same seed gives the same order
/// on every machine and version, so a recorded seed explains a recorded order.
pub fn shuffled<T: Clone>(items: &[T], seed: u64) -> Vec<T> {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut v = items.to_vec();
    for i in (1..v.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_in_protocol_order_with_smoke_always() {
        let l = parse_levels("4,1.5,L2").unwrap();
        assert_eq!(
            l,
            vec![
                TestLevel::Smoke,
                TestLevel::KernelPath,
                TestLevel::Correctness,
                TestLevel::Performance
            ]
        );
        assert!(parse_levels("6").unwrap_err().to_string().contains("`6`"));
    }

    #[test]
    fn grid_items_override_defaults_and_name_bad_keys() {
        let g = Grid::default()
            .apply(&[
                "pp=16 tg=4".into(),
                "depth=0,8".into(),
                "c=1,2".into(),
                "runs=1".into(),
            ])
            .unwrap();
        assert_eq!(
            (g.pp, g.tg, g.depth, g.concurrency, g.runs),
            (vec![16], vec![4], vec![0, 8], vec![1, 2], 1)
        );
        assert!(Grid::default().apply(&["x=1".into()]).is_err());
        assert!(
            Grid::default()
                .apply(&["tg=a".into()])
                .unwrap_err()
                .to_string()
                .contains("`a`")
        );
        assert!(Grid::default().apply(&["runs=1,2".into()]).is_err());
    }

    #[test]
    fn shuffle_is_a_seeded_permutation() {
        let items: Vec<u32> = (0..10).collect();
        let a = shuffled(&items, 7);
        assert_eq!(a, shuffled(&items, 7));
        assert_ne!(a, shuffled(&items, 8));
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, items);
    }

    #[test]
    fn spark_arena_profile_matches_the_leaderboard_grid() {
        let g = Profile::SparkArena.grid();
        assert_eq!(
            (g.pp.as_slice(), g.tg.as_slice(), g.runs),
            (&[2048][..], &[128][..], 3)
        );
        assert_eq!(g.concurrency, vec![1, 2, 5, 10]);
        assert_eq!(g.depth.last(), Some(&100000));
    }
}
