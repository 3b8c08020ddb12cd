//! Model tensors in the layout the CUDA kernels read, on the host (for the CPU reference) or
//! on the device. Synthetic weights come from the counter hash in `synthetic.rs`, generated
//! directly on the device, and bit-identical to the host copy of the same seed.

use anyhow::{Result, ensure};
use cudarc::driver::CudaSlice;

use super::device::Gpu;
use super::{ops, synthetic};
use crate::engine::config::ModelConfig;

/// How a synthetic tensor is drawn.
#[derive(Debug, Clone, Copy)]
pub enum Fill {
    /// bf16 `offset + scale · U(-1, 1)`.
    Bf16 {
        /// Half-width.
        scale: f32,
        /// Centre.
        offset: f32,
    },
    /// Bytes uniform in `lo..=hi`.
    U8 {
        /// Smallest value.
        lo: u8,
        /// Largest value.
        hi: u8,
    },
}

/// One synthetic tensor: its stream seed, element count and distribution.
#[derive(Debug, Clone, Copy)]
pub struct TensorSpec {
    /// Seed of its counter stream.
    pub seed: u64,
    /// Elements.
    pub len: usize,
    /// Distribution.
    pub fill: Fill,
}

/// One layer's tensors. `B16` holds bf16 bits, `B8` bytes (MXFP4 blocks and scales).
pub struct Layer<B16, B8> {
    /// input_layernorm [H].
    pub attn_norm: B16,
    /// q | k | v projections stacked: [(Hq + 2 Hkv) · D, H].
    pub qkv_w: B16,
    /// Their biases [(Hq + 2 Hkv) · D].
    pub qkv_b: B16,
    /// o_proj [H, Hq · D].
    pub o_w: B16,
    /// o_proj bias [H].
    pub o_b: B16,
    /// Sink logits [Hq].
    pub sinks: B16,
    /// post_attention_layernorm [H].
    pub mlp_norm: B16,
    /// Router [E, H].
    pub router_w: B16,
    /// Router bias [E].
    pub router_b: B16,
    /// gate_up MXFP4 blocks [E, 2I, H/32, 16].
    pub gu_blocks: B8,
    /// gate_up scales [E, 2I, H/32].
    pub gu_scales: B8,
    /// gate_up bias [E, 2I].
    pub gu_bias: B16,
    /// down MXFP4 blocks [E, H, I/32, 16].
    pub dn_blocks: B8,
    /// down scales [E, H, I/32].
    pub dn_scales: B8,
    /// down bias [E, H].
    pub dn_bias: B16,
}

/// All tensors of a model.
pub struct Weights<B16, B8> {
    /// Embedding [V, H].
    pub embed: B16,
    /// Layers.
    pub layers: Vec<Layer<B16, B8>>,
    /// Final norm [H].
    pub final_norm: B16,
    /// Unembedding [V, H].
    pub lm_head: B16,
}

/// Host copy (CPU reference).
pub type HostWeights = Weights<Vec<u16>, Vec<u8>>;
/// Device copy.
pub type DeviceWeights = Weights<CudaSlice<u16>, CudaSlice<u8>>;

/// Check the shape rules the kernels rely on.
pub fn check_config(cfg: &ModelConfig) -> Result<()> {
    ensure!(
        cfg.hidden_size.is_multiple_of(32) && cfg.intermediate_size.is_multiple_of(32),
        "hidden {} and intermediate {} must be multiples of 32 (MXFP4 blocks)",
        cfg.hidden_size,
        cfg.intermediate_size
    );
    ensure!(
        cfg.layer_is_sliding.len() == cfg.num_hidden_layers,
        "layer_is_sliding has {} entries for {} layers",
        cfg.layer_is_sliding.len(),
        cfg.num_hidden_layers
    );
    ensure!(
        cfg.num_experts_per_tok <= cfg.num_local_experts,
        "top-k {} > experts {}",
        cfg.num_experts_per_tok,
        cfg.num_local_experts
    );
    Ok(())
}

fn seed_of(base: u64, layer: u64, kind: u64) -> u64 {
    synthetic::splitmix64(base ^ (layer << 16 | kind))
}

/// Scale byte range putting MXFP4 weights near 1/sqrt(fan_in) (E2M1 magnitudes average ~2.6).
fn scale_range(fan_in: usize) -> (u8, u8) {
    let centre = 127.0 + (1.0 / (2.6 * (fan_in as f64).sqrt())).log2().round();
    let c = centre.clamp(2.0, 250.0) as u8;
    (c - 1, c + 1)
}

/// Build every tensor of a synthetic model of shape `cfg` from `seed`, with `mk16`/`mk8`
/// producing the storage (host vector or device buffer).
pub fn build<B16, B8>(
    cfg: &ModelConfig,
    seed: u64,
    mut mk16: impl FnMut(TensorSpec) -> Result<B16>,
    mut mk8: impl FnMut(TensorSpec) -> Result<B8>,
) -> Result<Weights<B16, B8>> {
    check_config(cfg)?;
    let h = cfg.hidden_size;
    let (hq, hkv, d) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    );
    let (e, i, v) = (cfg.num_local_experts, cfg.intermediate_size, cfg.vocab_size);
    let qkv_rows = (hq + 2 * hkv) * d;
    let bf = |scale: f32, offset: f32| Fill::Bf16 { scale, offset };
    let inv = |n: usize| 1.0 / (n as f32).sqrt();
    let spec = |layer: u64, kind: u64, len: usize, fill: Fill| TensorSpec {
        seed: seed_of(seed, layer, kind),
        len,
        fill,
    };
    let g = u64::from(u16::MAX);
    let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
    for l in 0..cfg.num_hidden_layers as u64 {
        let (glo, ghi) = scale_range(h);
        let (dlo, dhi) = scale_range(i);
        layers.push(Layer {
            attn_norm: mk16(spec(l, 0, h, bf(0.1, 1.0)))?,
            qkv_w: mk16(spec(l, 1, qkv_rows * h, bf(inv(h), 0.0)))?,
            qkv_b: mk16(spec(l, 2, qkv_rows, bf(0.1, 0.0)))?,
            o_w: mk16(spec(l, 3, h * hq * d, bf(inv(hq * d), 0.0)))?,
            o_b: mk16(spec(l, 4, h, bf(0.1, 0.0)))?,
            sinks: mk16(spec(l, 5, hq, bf(1.0, 0.0)))?,
            mlp_norm: mk16(spec(l, 6, h, bf(0.1, 1.0)))?,
            router_w: mk16(spec(l, 7, e * h, bf(inv(h), 0.0)))?,
            router_b: mk16(spec(l, 8, e, bf(0.1, 0.0)))?,
            gu_blocks: mk8(spec(l, 9, e * 2 * i * h / 2, Fill::U8 { lo: 0, hi: 255 }))?,
            gu_scales: mk8(spec(
                l,
                10,
                e * 2 * i * h / 32,
                Fill::U8 { lo: glo, hi: ghi },
            ))?,
            gu_bias: mk16(spec(l, 11, e * 2 * i, bf(0.1, 0.0)))?,
            dn_blocks: mk8(spec(l, 12, e * h * i / 2, Fill::U8 { lo: 0, hi: 255 }))?,
            dn_scales: mk8(spec(l, 13, e * h * i / 32, Fill::U8 { lo: dlo, hi: dhi }))?,
            dn_bias: mk16(spec(l, 14, e * h, bf(0.1, 0.0)))?,
        });
    }
    Ok(Weights {
        embed: mk16(spec(g, 0, v * h, bf(1.0, 0.0)))?,
        layers,
        final_norm: mk16(spec(g, 1, h, bf(0.1, 1.0)))?,
        lm_head: mk16(spec(g, 2, v * h, bf(inv(h), 0.0)))?,
    })
}

/// Synthetic weights on the host (the CPU reference's copy).
pub fn synthetic_host(cfg: &ModelConfig, seed: u64) -> Result<HostWeights> {
    build(
        cfg,
        seed,
        |s| match s.fill {
            Fill::Bf16 { scale, offset } => Ok(synthetic::bf16_vec(s.seed, s.len, scale, offset)),
            Fill::U8 { .. } => anyhow::bail!("byte fill for a bf16 tensor"),
        },
        |s| match s.fill {
            Fill::U8 { lo, hi } => Ok(synthetic::u8_vec(s.seed, s.len, lo, hi)),
            Fill::Bf16 { .. } => anyhow::bail!("bf16 fill for a byte tensor"),
        },
    )
}

/// Synthetic weights generated on the device (no host copy, no transfer).
pub fn synthetic_device(g: &Gpu, cfg: &ModelConfig, seed: u64) -> Result<DeviceWeights> {
    let w = build(
        cfg,
        seed,
        |s| {
            let buf = g.alloc::<u16>(s.len)?;
            if let Fill::Bf16 { scale, offset } = s.fill {
                ops::fill_bf16(g, g.ptr(&buf), s.len, s.seed, scale, offset)?;
            }
            Ok(buf)
        },
        |s| {
            let buf = g.alloc::<u8>(s.len)?;
            if let Fill::U8 { lo, hi } = s.fill {
                ops::fill_u8(g, g.ptr(&buf), s.len, s.seed, lo, hi)?;
            }
            Ok(buf)
        },
    )?;
    g.sync()?;
    Ok(w)
}

/// Upload host weights (MXFP4 stays packed).
pub fn upload(g: &Gpu, w: &HostWeights) -> Result<DeviceWeights> {
    let l = w
        .layers
        .iter()
        .map(|l| {
            Ok(Layer {
                attn_norm: g.upload(&l.attn_norm)?,
                qkv_w: g.upload(&l.qkv_w)?,
                qkv_b: g.upload(&l.qkv_b)?,
                o_w: g.upload(&l.o_w)?,
                o_b: g.upload(&l.o_b)?,
                sinks: g.upload(&l.sinks)?,
                mlp_norm: g.upload(&l.mlp_norm)?,
                router_w: g.upload(&l.router_w)?,
                router_b: g.upload(&l.router_b)?,
                gu_blocks: g.upload(&l.gu_blocks)?,
                gu_scales: g.upload(&l.gu_scales)?,
                gu_bias: g.upload(&l.gu_bias)?,
                dn_blocks: g.upload(&l.dn_blocks)?,
                dn_scales: g.upload(&l.dn_scales)?,
                dn_bias: g.upload(&l.dn_bias)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Weights {
        embed: g.upload(&w.embed)?,
        layers: l,
        final_norm: g.upload(&w.final_norm)?,
        lm_head: g.upload(&w.lm_head)?,
    })
}
