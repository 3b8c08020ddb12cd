//! Loads a gpt-oss checkpoint in the HF release layout: `config.json` plus one
//! `model.safetensors` or several shards listed in `model.safetensors.index.json`.
//! Files are memory-mapped; MXFP4 expert blocks and scales stay packed. Every tensor's
//! name, shape and dtype is checked against the config before any weight is used.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use super::config::ModelConfig;
use super::weights::{AnyTensor, DType, Tensor, TensorSpec, Weights, expected_tensors};

/// Name of the shard index file.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One mapped checkpoint file and where each of its tensors lies.
struct Shard {
    path: PathBuf,
    map: Arc<Mmap>,
    /// name → (dtype, shape, byte range within the file)
    tensors: HashMap<String, (Dtype, Vec<usize>, std::ops::Range<usize>)>,
}

/// Load and validate the checkpoint in `dir`.
pub fn load(dir: &Path) -> Result<Weights> {
    let config = ModelConfig::from_hf_json(&dir.join("config.json"))?;
    let shards = open_shards(dir)?;
    let located = validate(&config, &shards)?;
    let source = dir.display().to_string();
    Weights::assemble(config, source, |spec| {
        let (si, range) = located
            .get(&spec.name)
            .with_context(|| format!("tensor `{}` was not validated", spec.name))?;
        let shard = &shards[*si];
        let bytes = &shard.map[range.clone()];
        Ok(match spec.dtype {
            DType::Bf16 => {
                AnyTensor::Bf16(Tensor::from_mapped(&shard.map, bytes, spec.shape.clone()))
            }
            DType::U8 => AnyTensor::U8(Tensor::from_mapped(&shard.map, bytes, spec.shape.clone())),
        })
    })
}

/// The safetensors files of `dir`: those named by the index when there is one,
/// else every `*.safetensors` file.
fn shard_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join(INDEX_FILE);
    if index.exists() {
        let text = std::fs::read_to_string(&index)
            .with_context(|| format!("reading {}", index.display()))?;
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: not valid JSON", index.display()))?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .with_context(|| format!("{}: no `weight_map` object", index.display()))?;
        let mut files: Vec<String> = Vec::new();
        for (tensor, file) in map {
            let file = file.as_str().with_context(|| {
                format!(
                    "{}: weight_map[{tensor}] is not a file name",
                    index.display()
                )
            })?;
            if file.contains('/') || file.contains("..") {
                bail!(
                    "{}: weight_map[{tensor}] = {file:?} leaves the directory",
                    index.display()
                );
            }
            if !files.iter().any(|f| f == file) {
                files.push(file.to_string());
            }
        }
        files.sort();
        let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
        for p in &paths {
            if !p.is_file() {
                bail!(
                    "{} names shard {} which does not exist; the download is incomplete",
                    index.display(),
                    p.display()
                );
            }
        }
        Ok(paths)
    } else {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("listing checkpoint directory {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        paths.sort();
        if paths.is_empty() {
            bail!(
                "{}: no *.safetensors files and no {INDEX_FILE}",
                dir.display()
            );
        }
        Ok(paths)
    }
}

fn open_shards(dir: &Path) -> Result<Vec<Shard>> {
    shard_files(dir)?
        .into_iter()
        .map(|path| {
            let file = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
            // SAFETY: the mapping is read-only; a checkpoint changed on disk while the engine
            // runs is outside what any mmap-based loader can defend against.
            let map = unsafe { Mmap::map(&file) }
                .with_context(|| format!("memory-mapping {}", path.display()))?;
            let (header_len, meta) = SafeTensors::read_metadata(&map).map_err(|e| {
                anyhow::anyhow!(
                    "{}: not a valid safetensors file ({e}); truncated or corrupt download?",
                    path.display()
                )
            })?;
            let base = 8 + header_len;
            let tensors = meta
                .tensors()
                .into_iter()
                .map(|(name, info)| {
                    let (a, b) = info.data_offsets;
                    (name, (info.dtype, info.shape.clone(), base + a..base + b))
                })
                .collect();
            Ok(Shard {
                path,
                map: Arc::new(map),
                tensors,
            })
        })
        .collect()
}

/// Check every expected tensor against the shards; return where each one lies.
/// All problems are collected so one run names every missing or mis-shaped tensor.
fn validate(
    config: &ModelConfig,
    shards: &[Shard],
) -> Result<BTreeMap<String, (usize, std::ops::Range<usize>)>> {
    let mut found: HashMap<&str, usize> = HashMap::new();
    for (si, shard) in shards.iter().enumerate() {
        for name in shard.tensors.keys() {
            if let Some(prev) = found.insert(name, si) {
                bail!(
                    "tensor `{name}` appears in both {} and {}",
                    shards[prev].path.display(),
                    shard.path.display()
                );
            }
        }
    }
    let mut problems = Vec::new();
    let mut located = BTreeMap::new();
    for spec in expected_tensors(config) {
        let Some(&si) = found.get(spec.name.as_str()) else {
            problems.push(format!("missing tensor `{}` (in no file)", spec.name));
            continue;
        };
        let shard = &shards[si];
        let (dtype, shape, range) = &shard.tensors[&spec.name];
        if let Some(p) = check(&spec, *dtype, shape) {
            problems.push(format!(
                "{}: tensor `{}` {p}",
                shard.path.display(),
                spec.name
            ));
            continue;
        }
        located.insert(spec.name.clone(), (si, range.clone()));
    }
    if !problems.is_empty() {
        let n = problems.len();
        let shown: Vec<&str> = problems.iter().take(12).map(String::as_str).collect();
        bail!(
            "checkpoint does not match its config.json ({n} problem{}):\n  {}{}",
            if n == 1 { "" } else { "s" },
            shown.join("\n  "),
            if n > 12 { "\n  …" } else { "" }
        );
    }
    let known: std::collections::HashSet<String> = expected_tensors(config)
        .into_iter()
        .map(|t| t.name)
        .collect();
    let extra = found.keys().filter(|n| !known.contains(**n)).count();
    if extra > 0 {
        tracing::warn!("checkpoint holds {extra} tensors the engine does not use");
    }
    Ok(located)
}

fn check(spec: &TensorSpec, dtype: Dtype, shape: &[usize]) -> Option<String> {
    let want = match spec.dtype {
        DType::Bf16 => Dtype::BF16,
        DType::U8 => Dtype::U8,
    };
    if dtype != want {
        return Some(format!(
            "has dtype {dtype:?}, expected {}",
            spec.dtype.name()
        ));
    }
    if shape != spec.shape.as_slice() {
        return Some(format!("has shape {shape:?}, expected {:?}", spec.shape));
    }
    None
}
