//! Model tensors on the device, in the layout the kernels read: bf16 dense weights with q, k
//! and v stacked into one projection, MXFP4 experts packed exactly as in the checkpoint.
//! They come from host weights (a loaded checkpoint, uploaded once) or are generated on the
//! device from the synthetic streams of `engine::synthetic`, bit-identical to the host build.

use anyhow::{Context, Result, ensure};
use cudarc::driver::CudaSlice;
use half::bf16;

use super::device::Gpu;
use super::ops;
use crate::engine::config::ModelConfig;
use crate::engine::synthetic::{self, Fill};
use crate::engine::weights::{Bf16Tensor, Weights};

/// One layer on the device (bf16 tensors as raw `u16` bits).
pub struct Layer {
    /// input_layernorm [H].
    pub attn_norm: CudaSlice<u16>,
    /// q | k | v projections stacked: [(Hq + 2 Hkv) · D, H].
    pub qkv_w: CudaSlice<u16>,
    /// Their biases [(Hq + 2 Hkv) · D].
    pub qkv_b: CudaSlice<u16>,
    /// o_proj [H, Hq · D].
    pub o_w: CudaSlice<u16>,
    /// o_proj bias [H].
    pub o_b: CudaSlice<u16>,
    /// Sink logits [Hq].
    pub sinks: CudaSlice<u16>,
    /// post_attention_layernorm [H].
    pub mlp_norm: CudaSlice<u16>,
    /// Router [E, H].
    pub router_w: CudaSlice<u16>,
    /// Router bias [E].
    pub router_b: CudaSlice<u16>,
    /// gate_up MXFP4 blocks [E, 2I, H/32, 16].
    pub gu_blocks: CudaSlice<u8>,
    /// gate_up scales [E, 2I, H/32].
    pub gu_scales: CudaSlice<u8>,
    /// gate_up bias [E, 2I].
    pub gu_bias: CudaSlice<u16>,
    /// down MXFP4 blocks [E, H, I/32, 16].
    pub dn_blocks: CudaSlice<u8>,
    /// down scales [E, H, I/32].
    pub dn_scales: CudaSlice<u8>,
    /// down bias [E, H].
    pub dn_bias: CudaSlice<u16>,
}

/// All tensors of a model on the device.
pub struct DeviceWeights {
    /// Embedding [V, H].
    pub embed: CudaSlice<u16>,
    /// Layers.
    pub layers: Vec<Layer>,
    /// Final norm [H].
    pub final_norm: CudaSlice<u16>,
    /// Unembedding [V, H].
    pub lm_head: CudaSlice<u16>,
}

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

/// Synthetic weights generated on the device (no host copy, no transfer): each tensor is the
/// stream `engine::synthetic::stream_for` names, so the model equals `synthetic::build`'s.
pub fn synthetic_device(g: &Gpu, cfg: &ModelConfig, seed: u64) -> Result<DeviceWeights> {
    check_config(cfg)?;
    let (h, qd, kvd) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim());
    let (e, i, v) = (cfg.num_local_experts, cfg.intermediate_size, cfg.vocab_size);
    // One tensor = `len` elements of `name`'s stream from its start; q, k and v are
    // consecutive slices of one stream, so the stacked projection is one fill of q's stream.
    let bf = |name: &str, len: usize| -> Result<CudaSlice<u16>> {
        let st = synthetic::stream_for(cfg, seed, name)?;
        ensure!(st.start == 0, "{name}: stream does not start at 0");
        let Fill::Bf16 { scale, offset } = st.fill else {
            anyhow::bail!("{name}: not a bf16 stream");
        };
        let buf = g.alloc::<u16>(len)?;
        ops::fill_bf16(g, g.ptr(&buf), len, st.seed, scale, offset)?;
        Ok(buf)
    };
    let by = |name: &str, len: usize| -> Result<CudaSlice<u8>> {
        let st = synthetic::stream_for(cfg, seed, name)?;
        let Fill::U8 { lo, hi } = st.fill else {
            anyhow::bail!("{name}: not a byte stream");
        };
        let buf = g.alloc::<u8>(len)?;
        ops::fill_u8(g, g.ptr(&buf), len, st.seed, lo, hi)?;
        Ok(buf)
    };
    let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
    for l in 0..cfg.num_hidden_layers {
        let n = |s: &str| format!("model.layers.{l}.{s}");
        layers.push(Layer {
            attn_norm: bf(&n("input_layernorm.weight"), h)?,
            qkv_w: bf(&n("self_attn.q_proj.weight"), (qd + 2 * kvd) * h)?,
            qkv_b: bf(&n("self_attn.q_proj.bias"), qd + 2 * kvd)?,
            o_w: bf(&n("self_attn.o_proj.weight"), h * qd)?,
            o_b: bf(&n("self_attn.o_proj.bias"), h)?,
            sinks: bf(&n("self_attn.sinks"), cfg.num_attention_heads)?,
            mlp_norm: bf(&n("post_attention_layernorm.weight"), h)?,
            router_w: bf(&n("mlp.router.weight"), e * h)?,
            router_b: bf(&n("mlp.router.bias"), e)?,
            gu_blocks: by(&n("mlp.experts.gate_up_proj_blocks"), e * 2 * i * h / 2)?,
            gu_scales: by(&n("mlp.experts.gate_up_proj_scales"), e * 2 * i * h / 32)?,
            gu_bias: bf(&n("mlp.experts.gate_up_proj_bias"), e * 2 * i)?,
            dn_blocks: by(&n("mlp.experts.down_proj_blocks"), e * h * i / 2)?,
            dn_scales: by(&n("mlp.experts.down_proj_scales"), e * h * i / 32)?,
            dn_bias: bf(&n("mlp.experts.down_proj_bias"), e * h)?,
        });
    }
    let w = DeviceWeights {
        embed: bf("model.embed_tokens.weight", v * h)?,
        layers,
        final_norm: bf("model.norm.weight", h)?,
        lm_head: bf("lm_head.weight", v * h)?,
    };
    g.sync()?;
    Ok(w)
}

/// bf16 elements as their bit patterns.
fn bits(t: &Bf16Tensor) -> &[u16] {
    let d: &[bf16] = t.data();
    // SAFETY: `half::bf16` is a `repr(transparent)` wrapper of `u16`.
    unsafe { std::slice::from_raw_parts(d.as_ptr() as *const u16, d.len()) }
}

/// Upload host weights (a loaded checkpoint or a host-built synthetic model) once; MXFP4
/// experts stay packed, q/k/v are stacked.
pub fn upload(g: &Gpu, w: &Weights) -> Result<DeviceWeights> {
    check_config(&w.config)?;
    let up16 = |t: &Bf16Tensor| g.upload(bits(t));
    let layers = w
        .layers
        .iter()
        .enumerate()
        .map(|(l, lw)| {
            let qkv_w: Vec<u16> = [&lw.q_proj, &lw.k_proj, &lw.v_proj]
                .iter()
                .flat_map(|t| bits(t).iter().copied())
                .collect();
            let qkv_b: Vec<u16> = [&lw.q_bias, &lw.k_bias, &lw.v_bias]
                .iter()
                .flat_map(|t| bits(t).iter().copied())
                .collect();
            Ok::<_, anyhow::Error>(Layer {
                attn_norm: up16(&lw.input_layernorm)?,
                qkv_w: g.upload(&qkv_w)?,
                qkv_b: g.upload(&qkv_b)?,
                o_w: up16(&lw.o_proj)?,
                o_b: up16(&lw.o_bias)?,
                sinks: up16(&lw.sinks)?,
                mlp_norm: up16(&lw.post_attention_layernorm)?,
                router_w: up16(&lw.router)?,
                router_b: up16(&lw.router_bias)?,
                gu_blocks: g.upload(lw.gate_up.blocks.data())?,
                gu_scales: g.upload(lw.gate_up.scales.data())?,
                gu_bias: up16(&lw.gate_up.bias)?,
                dn_blocks: g.upload(lw.down.blocks.data())?,
                dn_scales: g.upload(lw.down.scales.data())?,
                dn_bias: up16(&lw.down.bias)?,
            })
            .with_context(|| format!("uploading layer {l} of {}", w.source))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(DeviceWeights {
        embed: up16(&w.embed_tokens)?,
        layers,
        final_norm: up16(&w.norm)?,
        lm_head: up16(&w.lm_head)?,
    })
}
