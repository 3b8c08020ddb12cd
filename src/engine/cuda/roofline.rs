//! The bytes one decode step must read from device memory, counted from the config for the
//! batch the step really ran: every dense weight once per step (all rows share it), each
//! expert once per layer however many rows routed to it, each row's own K/V. A kernel may
//! read more (a weight streamed once per group of rows); this is the floor a step at the
//! read roofline would need, split by the kernel groups `engine profile` times.

use anyhow::{Result, ensure};

use super::gates::Fp4Layers;
use crate::engine::config::ModelConfig;

/// The kernel groups of a decode step, between the event marks of a profiled step
/// (`Decoder::run_profiled`); their labels are the marks'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepGroup {
    /// Gathering each row's embedding row.
    Embed,
    /// RMSNorm fused into the qkv projection.
    Qkv,
    /// RoPE on q and k, K/V written into the cache.
    RopeKv,
    /// Decode attention over each row's cached keys (split + combine).
    Attention,
    /// The o projection, added to the residual.
    O,
    /// RMSNorm fused into the router GEMV and its top-k.
    Router,
    /// The experts' gate_up projections and SwiGLU.
    MoeGateUp,
    /// The experts' down projections, added to the residual.
    MoeDown,
    /// Final norm, lm_head and argmax.
    Head,
}

impl StepGroup {
    /// Every group, in the order a step runs them.
    pub const ALL: [StepGroup; 9] = [
        StepGroup::Embed,
        StepGroup::Qkv,
        StepGroup::RopeKv,
        StepGroup::Attention,
        StepGroup::O,
        StepGroup::Router,
        StepGroup::MoeGateUp,
        StepGroup::MoeDown,
        StepGroup::Head,
    ];

    /// The label of the group's event mark; `mxfp4` names the MXFP4 kernel of a dense
    /// projection (only qkv, o and the lm_head have one).
    pub fn label(self, mxfp4: bool) -> &'static str {
        match (self, mxfp4) {
            (StepGroup::Embed, _) => "embed_gather",
            (StepGroup::Qkv, false) => "rmsnorm+gemv qkv",
            (StepGroup::Qkv, true) => "rmsnorm+gemv_mxfp4 qkv",
            (StepGroup::RopeKv, _) => "rope_kv_write",
            (StepGroup::Attention, _) => "attention",
            (StepGroup::O, false) => "gemv o (+residual)",
            (StepGroup::O, true) => "gemv_mxfp4 o (+residual)",
            (StepGroup::Router, _) => "rmsnorm+gemv router+topk",
            (StepGroup::MoeGateUp, _) => "moe gate_up+swiglu",
            (StepGroup::MoeDown, _) => "moe down (+residual)",
            (StepGroup::Head, false) => "rmsnorm+gemv lm_head, argmax",
            (StepGroup::Head, true) => "rmsnorm+gemv_mxfp4 lm_head, argmax",
        }
    }

    /// The group whose mark has this label.
    pub fn from_label(label: &str) -> Option<StepGroup> {
        Self::ALL
            .into_iter()
            .find(|g| g.label(false) == label || g.label(true) == label)
    }
}

/// Bytes of `weights` MXFP4 weights: 16 bytes of nibbles and one E8M0 scale per 32.
fn fp4_bytes(weights: usize) -> usize {
    weights / 32 * 17
}

/// Bytes of a dense projection of `rows` × `cols` weights, bf16 or MXFP4.
fn dense_bytes(rows: usize, cols: usize, mxfp4: bool) -> usize {
    if mxfp4 {
        rows * fp4_bytes(cols)
    } else {
        2 * rows * cols
    }
}

/// Bytes one decode step must read, per kernel group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepBytes {
    /// Bytes per group, in [`StepGroup::ALL`] order.
    groups: [u64; StepGroup::ALL.len()],
    /// The K/V part of the attention group's bytes.
    kv: u64,
    /// Distinct experts the step reads, over all layers.
    experts: usize,
}

impl StepBytes {
    /// Bytes of one group.
    pub fn group(&self, g: StepGroup) -> u64 {
        self.groups[g as usize]
    }

    /// Bytes of the whole step.
    pub fn total(&self) -> u64 {
        self.groups.iter().sum()
    }

    /// The K/V cache's share: each row's keys and values at its depth.
    pub fn kv(&self) -> u64 {
        self.kv
    }

    /// The experts' share: gate_up and down weights and biases of each distinct expert.
    pub fn experts(&self) -> u64 {
        self.group(StepGroup::MoeGateUp) + self.group(StepGroup::MoeDown)
    }

    /// Distinct (layer, expert) pairs the step reads.
    pub fn distinct_experts(&self) -> usize {
        self.experts
    }
}

/// Count the bytes of one decode step. `depths` holds each row's cached positions before its
/// token (the row attends over depth + 1 keys, at most the window on sliding layers, read
/// at `kv_bytes` per element); `distinct_experts` the experts the batch routed to in each
/// layer. Dense weights are counted once (bf16, or MXFP4 where `fp4` puts them), with their
/// bf16 biases and norms; the embedding table one row per batch row.
pub fn decode_step_bytes(
    c: &ModelConfig,
    fp4: Fp4Layers,
    kv_bytes: usize,
    depths: &[usize],
    distinct_experts: &[usize],
) -> Result<StepBytes> {
    let rows = depths.len();
    let (h, hq, hkv, d) = (
        c.hidden_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
    );
    let (e, k, i, v) = (
        c.num_local_experts,
        c.num_experts_per_tok,
        c.intermediate_size,
        c.vocab_size,
    );
    ensure!(rows > 0, "a decode step of no rows reads nothing");
    ensure!(
        distinct_experts.len() == c.num_hidden_layers,
        "{} distinct-expert counts for {} layers",
        distinct_experts.len(),
        c.num_hidden_layers
    );
    for (l, &n) in distinct_experts.iter().enumerate() {
        ensure!(
            (1..=e.min(rows * k)).contains(&n),
            "layer {l}: {n} distinct experts, but {rows} row(s) route to between 1 and {} \
             of the {e} experts",
            e.min(rows * k)
        );
    }
    let qkv = (hq + 2 * hkv) * d;
    let layers = c.num_hidden_layers;
    // Per layer: weights, biases (bf16) and the norm each group reads.
    let qkv_layer = dense_bytes(qkv, h, fp4.qkv_o()) + 2 * qkv + 2 * h;
    let o_layer = dense_bytes(h, hq * d, fp4.qkv_o()) + 2 * h;
    let router_layer = 2 * h + 2 * (e * h + e);
    let gate_up_expert = fp4_bytes(2 * i * h) + 2 * 2 * i;
    let down_expert = fp4_bytes(h * i) + 2 * h;
    // Each row reads its own keys and values in every layer; the sink logits once per layer.
    let kv: usize = c
        .layer_is_sliding
        .iter()
        .map(|&sliding| {
            depths
                .iter()
                .map(|&depth| {
                    let keys = if sliding {
                        (depth + 1).min(c.sliding_window)
                    } else {
                        depth + 1
                    };
                    keys * hkv * d * 2 * kv_bytes
                })
                .sum::<usize>()
        })
        .sum();
    let experts: usize = distinct_experts.iter().sum();
    let mut groups = [0u64; StepGroup::ALL.len()];
    for g in StepGroup::ALL {
        groups[g as usize] = match g {
            StepGroup::Embed => rows * 2 * h,
            StepGroup::Qkv => layers * qkv_layer,
            StepGroup::RopeKv => 0,
            StepGroup::Attention => layers * 2 * hq + kv,
            StepGroup::O => layers * o_layer,
            StepGroup::Router => layers * router_layer,
            StepGroup::MoeGateUp => experts * gate_up_expert,
            StepGroup::MoeDown => experts * down_expert,
            StepGroup::Head => 2 * h + dense_bytes(v, h, fp4.lm_head()),
        } as u64;
    }
    Ok(StepBytes {
        groups,
        kv: kv as u64,
        experts,
    })
}

/// The bytes of one token decoded alone at `depth`: [`decode_step_bytes`] with k distinct
/// experts in every layer (the batch-1 figure of BENCHMARKING.md).
pub fn batch_one_bytes(
    c: &ModelConfig,
    fp4: Fp4Layers,
    kv_bytes: usize,
    depth: usize,
) -> Result<u64> {
    let k = c.num_experts_per_tok.min(c.num_local_experts);
    let experts = vec![k; c.num_hidden_layers];
    Ok(decode_step_bytes(c, fp4, kv_bytes, &[depth], &experts)?.total())
}

/// Distinct experts per layer among routed expert indices (per layer, any number of rows'
/// indices, as `Decoder::routed_experts` returns them).
pub fn distinct_experts(routed: &[Vec<u32>]) -> Vec<usize> {
    routed
        .iter()
        .map(|layer| {
            let mut e = layer.clone();
            e.sort_unstable();
            e.dedup();
            e.len()
        })
        .collect()
}

/// A GB10's (the DGX Spark's) memory bandwidth in GB/s, the machine #17's projections are for
/// (BENCHMARKING.md).
pub const GB10_BANDWIDTH_GBS: f64 = 273.0;

/// Two projections of a measured decode step (`batch` tokens reading `bytes` in `step_ms` on a
/// machine reading `bw_gbs`) to a machine of `target_gbs` read bandwidth — projections, not
/// measurements. `share`: #17's method, the step's share of its read roofline applied to the
/// target's. `latency`: the step's bytes at the target's bandwidth plus twice `beyond_ms`, the
/// time this machine spent beyond its own bytes, which does not shrink with bandwidth and is
/// assumed twice as long on a GB10's fewer, slower SMs (docs/perf.md, session 28). Both in
/// tok/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Projection {
    pub share: f64,
    pub latency: f64,
    pub beyond_ms: f64,
}

pub fn project_step(
    batch: usize,
    bytes: f64,
    step_ms: f64,
    bw_gbs: f64,
    target_gbs: f64,
) -> Projection {
    let at_bytes_ms = bytes / (bw_gbs * 1e9) * 1e3;
    let share = batch as f64 * (at_bytes_ms / step_ms) * target_gbs * 1e9 / bytes;
    let beyond_ms = (step_ms - at_bytes_ms).max(0.0);
    let latency = batch as f64 / (bytes / (target_gbs * 1e9) + 2.0 * beyond_ms * 1e-3);
    Projection {
        share,
        latency,
        beyond_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::synthetic;

    /// Run 413's 120b batch-1 row (1.937 ms, 5.005 GB, ~4470 GB/s) projects as docs/perf.md
    /// worked it out by hand from its rounded 57.6 %: 31.4 tok/s by the share, ~50 by the
    /// latency.
    #[test]
    fn projections_of_a_step_to_a_gb10() {
        let (bytes, ms, bw) = (5.005e9, 1.937, 4470.0);
        let pct = 100.0 * bytes / (ms * 1e-3) / 1e9 / bw;
        let p = project_step(1, bytes, ms, bw, GB10_BANDWIDTH_GBS);
        assert!((pct - 57.8).abs() < 0.1, "{pct}");
        assert!((p.share - 31.5).abs() < 0.1, "{p:?}");
        assert!((p.latency - 50.1).abs() < 0.2, "{p:?}");
        // A step at its bytes projects to the target's roofline both ways; a batch scales it.
        let at_roofline = project_step(4, bytes, 1e3 * bytes / (bw * 1e9), bw, 273.0);
        let roofline = 4.0 * 273e9 / bytes;
        assert!((at_roofline.share - roofline).abs() < 1e-9);
        assert!((at_roofline.latency - roofline).abs() < 1e-6);
    }

    /// An independent count of one token's bytes, weight by weight as BENCHMARKING.md lists
    /// them (MXFP4 at 17 bytes per 32 weights, biases bf16): the oracle the per-group count
    /// must agree with at batch 1.
    fn bytes_per_token_fp4(c: &ModelConfig, depth: usize, kv_bytes: usize, fp4: Fp4Layers) -> u64 {
        let (h, hq, hkv, d) = (
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        );
        let (e, k, i, v) = (
            c.num_local_experts,
            c.num_experts_per_tok,
            c.intermediate_size,
            c.vocab_size,
        );
        let qkv = (hq + 2 * hkv) * d;
        // MXFP4: 16 bytes of nibbles + 1 scale byte per 32 weights (4.25 bits), bf16 biases.
        let fp4_bytes = |weights: usize| weights / 32 * 17;
        let dense = |weights: usize, fp4: bool| if fp4 { fp4_bytes(weights) } else { 2 * weights };
        let attn = dense(qkv * h + h * hq * d, fp4.qkv_o()) + 2 * (qkv + h + hq + 2 * h);
        let router = 2 * (e * h + e);
        let expert = fp4_bytes(2 * i * h) + fp4_bytes(h * i) + 2 * (2 * i + h);
        // Embedding row, final norm, lm_head.
        let mut total = (2 * h + 2 * h + dense(v * h, fp4.lm_head())) as u64;
        for &sliding in &c.layer_is_sliding {
            let keys = if sliding {
                (depth + 1).min(c.sliding_window)
            } else {
                depth + 1
            };
            total += (attn + router + k * expert + keys * hkv * d * 2 * kv_bytes) as u64;
        }
        total
    }

    const LAYOUTS: [Fp4Layers; 3] = [Fp4Layers::Moe, Fp4Layers::MoeQkvO, Fp4Layers::All];

    fn configs() -> Vec<ModelConfig> {
        ["tiny", "gpt-oss-20b", "gpt-oss-120b"]
            .iter()
            .map(|n| synthetic::config(n).unwrap())
            .collect()
    }

    /// One expert's gate_up and down bytes (weights and biases), from the config.
    fn expert_bytes(c: &ModelConfig) -> u64 {
        let (h, i) = (c.hidden_size, c.intermediate_size);
        ((2 * i * h + h * i) / 32 * 17 + 2 * (2 * i + h)) as u64
    }

    #[test]
    fn batch_one_with_k_experts_per_layer_is_bytes_per_token() {
        for c in configs() {
            let k = vec![c.num_experts_per_tok; c.num_hidden_layers];
            for fp4 in LAYOUTS {
                for kv in [1, 2, 4] {
                    for depth in [0, 5, 127, 128, 4096] {
                        let b = decode_step_bytes(&c, fp4, kv, &[depth], &k).unwrap();
                        assert_eq!(b.total(), batch_one_bytes(&c, fp4, kv, depth).unwrap());
                        assert_eq!(
                            b.total(),
                            bytes_per_token_fp4(&c, depth, kv, fp4),
                            "{fp4:?} kv {kv} depth {depth}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn rows_routed_to_the_same_experts_read_them_once() {
        for c in configs() {
            let k = c.num_experts_per_tok;
            // Eight rows, every one routed to experts 0..k in every layer.
            let same: Vec<Vec<u32>> = (0..c.num_hidden_layers)
                .map(|_| (0..8).flat_map(|_| 0..k as u32).collect())
                .collect();
            let distinct = distinct_experts(&same);
            assert!(distinct.iter().all(|&n| n == k));
            let one = decode_step_bytes(&c, Fp4Layers::Moe, 2, &[0], &distinct).unwrap();
            let eight = decode_step_bytes(&c, Fp4Layers::Moe, 2, &[0; 8], &distinct).unwrap();
            // Only the embedding rows and each row's K/V grow with the batch.
            let kv_row = one.kv();
            assert_eq!(eight.kv(), 8 * kv_row);
            assert_eq!(
                eight.total() - one.total(),
                7 * (kv_row + 2 * c.hidden_size as u64)
            );
            assert_eq!(eight.experts(), one.experts());
        }
    }

    #[test]
    fn rows_routed_to_disjoint_experts_read_each_row_s_experts() {
        for c in configs() {
            let (k, e) = (c.num_experts_per_tok, c.num_local_experts);
            // As many rows as the experts allow without sharing one.
            let rows = e / k;
            let disjoint: Vec<Vec<u32>> = (0..c.num_hidden_layers)
                .map(|_| (0..(rows * k) as u32).collect())
                .collect();
            let distinct = distinct_experts(&disjoint);
            assert!(distinct.iter().all(|&n| n == rows * k));
            let b = decode_step_bytes(&c, Fp4Layers::Moe, 2, &vec![0; rows], &distinct).unwrap();
            assert_eq!(
                b.experts(),
                (c.num_hidden_layers * rows * k) as u64 * expert_bytes(&c)
            );
            assert_eq!(b.distinct_experts(), c.num_hidden_layers * rows * k);
            // Overlap in one layer only: that layer reads fewer.
            let mut partial = distinct.clone();
            partial[0] = k;
            let p = decode_step_bytes(&c, Fp4Layers::Moe, 2, &vec![0; rows], &partial).unwrap();
            assert_eq!(
                b.total() - p.total(),
                ((rows - 1) * k) as u64 * expert_bytes(&c)
            );
        }
    }

    #[test]
    fn each_row_reads_its_own_keys_capped_on_sliding_layers() {
        for c in configs() {
            let k = vec![c.num_experts_per_tok; c.num_hidden_layers];
            let per_key = (2 * c.num_key_value_heads * c.head_dim * 2) as u64;
            let (full, sliding) = c.layer_is_sliding.iter().fold((0u64, 0u64), |(f, s), &sl| {
                if sl { (f, s + 1) } else { (f + 1, s) }
            });
            let w = c.sliding_window;
            let depths = [0, w - 1, w, 10 * w];
            let b = decode_step_bytes(&c, Fp4Layers::Moe, 2, &depths, &k).unwrap();
            let keys_full: u64 = depths.iter().map(|&d| d as u64 + 1).sum();
            let keys_sliding: u64 = depths.iter().map(|&d| (d + 1).min(w) as u64).sum();
            assert_eq!(
                b.kv(),
                per_key * (full * keys_full + sliding * keys_sliding)
            );
            // The rows' K/V sum: the batch reads what its rows read one by one.
            let alone: u64 = depths
                .iter()
                .map(|&d| {
                    decode_step_bytes(&c, Fp4Layers::Moe, 2, &[d], &k)
                        .unwrap()
                        .kv()
                })
                .sum();
            assert_eq!(b.kv(), alone);
        }
    }

    #[test]
    fn mxfp4_layouts_shrink_exactly_their_groups() {
        for c in configs() {
            let k = vec![c.num_experts_per_tok; c.num_hidden_layers];
            let at = |fp4| decode_step_bytes(&c, fp4, 2, &[0, 100], &k).unwrap();
            let (moe, qkv_o, all) = (
                at(Fp4Layers::Moe),
                at(Fp4Layers::MoeQkvO),
                at(Fp4Layers::All),
            );
            let (h, qkv) = (
                c.hidden_size,
                (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim,
            );
            let layers = c.num_hidden_layers as u64;
            // bf16 (2 bytes per weight) → MXFP4 (17 bytes per 32).
            let saved = |w: usize| (2 * w - w / 32 * 17) as u64;
            for g in StepGroup::ALL {
                let expect_saved = match g {
                    StepGroup::Qkv => layers * saved(qkv * h),
                    StepGroup::O => layers * saved(h * c.q_dim()),
                    _ => 0,
                };
                assert_eq!(moe.group(g) - qkv_o.group(g), expect_saved, "{g:?}");
                let head = if g == StepGroup::Head {
                    saved(c.vocab_size * h)
                } else {
                    0
                };
                assert_eq!(qkv_o.group(g) - all.group(g), head, "{g:?}");
            }
        }
    }

    #[test]
    fn the_120b_released_step_is_the_published_5_003_gb() {
        let c = synthetic::config("gpt-oss-120b").unwrap();
        let k = vec![4; 36];
        let b = decode_step_bytes(&c, Fp4Layers::Moe, 2, &[0], &k).unwrap();
        assert_eq!((b.total() as f64 / 1e9 * 1000.0).round(), 5003.0);
        // A batch of 64 over every expert of every layer reads all 36 × 128 experts once.
        let all = vec![128; 36];
        let b64 = decode_step_bytes(&c, Fp4Layers::Moe, 2, &[0; 64], &all).unwrap();
        assert_eq!(b64.experts(), 36 * 128 * expert_bytes(&c));
    }

    #[test]
    fn counts_that_cannot_happen_are_refused() {
        let c = synthetic::config("tiny").unwrap();
        let k = c.num_experts_per_tok;
        let layers = c.num_hidden_layers;
        assert!(decode_step_bytes(&c, Fp4Layers::Moe, 2, &[], &vec![k; layers]).is_err());
        assert!(decode_step_bytes(&c, Fp4Layers::Moe, 2, &[0], &vec![k; layers - 1]).is_err());
        // One row routes to at most k experts; no layer to more than it has.
        assert!(decode_step_bytes(&c, Fp4Layers::Moe, 2, &[0], &vec![k + 1; layers]).is_err());
        let over = vec![c.num_local_experts + 1; layers];
        assert!(decode_step_bytes(&c, Fp4Layers::Moe, 2, &[0; 64], &over).is_err());
        assert!(decode_step_bytes(&c, Fp4Layers::Moe, 2, &[0], &vec![0; layers]).is_err());
    }

    #[test]
    fn labels_name_their_groups_both_ways() {
        for g in StepGroup::ALL {
            for fp4 in [false, true] {
                assert_eq!(StepGroup::from_label(g.label(fp4)), Some(g));
            }
        }
        assert_eq!(StepGroup::from_label("start"), None);
        assert_eq!(StepGroup::from_label("gemm qkv"), None);
    }
}
