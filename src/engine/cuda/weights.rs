//! Model tensors on the device, in the layout the kernels read: bf16 dense weights with q, k
//! and v stacked into one projection, MXFP4 experts packed exactly as in the checkpoint.
//! They come from host weights (a loaded checkpoint, uploaded once) or are generated on the
//! device from the synthetic streams of `engine::synthetic`, bit-identical to the host build.
//! With `--mxfp4-layers` beyond `moe` the attention projections (and the lm_head) are then
//! quantized to MXFP4 on the device ([`DeviceWeights::quantize_dense`]) and their bf16
//! copies freed; [`fake_quantize_host`] gives the CPU reference the same values.

use anyhow::{Context, Result, ensure};
use cudarc::driver::CudaSlice;
use half::bf16;

use super::device::Gpu;
use super::gates::Fp4Layers;
use super::ops::{self, ExpertLayout};
use crate::engine::config::ModelConfig;
use crate::engine::mxfp4;
use crate::engine::synthetic::{self, Fill};
use crate::engine::weights::{Bf16Tensor, Tensor, Weights};

/// One layer on the device (bf16 tensors as raw `u16` bits).
pub struct Layer {
    /// input_layernorm [H].
    pub attn_norm: CudaSlice<u16>,
    /// q | k | v projections stacked: [(Hq + 2 Hkv) · D, H].
    pub qkv_w: DenseWeight,
    /// Their biases [(Hq + 2 Hkv) · D].
    pub qkv_b: CudaSlice<u16>,
    /// o_proj [H, Hq · D].
    pub o_w: DenseWeight,
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
    pub lm_head: DenseWeight,
    /// The layout of every layer's expert blocks (standard as loaded;
    /// [`DeviceWeights::set_expert_layout`]).
    pub expert_layout: ExpertLayout,
}

/// A dense projection on the device: bf16 as in the checkpoint, or MXFP4 quantized at load.
pub enum DenseWeight {
    /// bf16 bits, row-major [rows, cols].
    Bf16(CudaSlice<u16>),
    /// MXFP4: blocks [rows, cols/32, 16] (their words in [`ops::BF16_WORDS`]) and E8M0
    /// scales [rows, cols/32].
    Mxfp4 {
        /// Packed E2M1 nibbles.
        blocks: CudaSlice<u8>,
        /// Scale bytes.
        scales: CudaSlice<u8>,
    },
}

impl DenseWeight {
    /// The device addresses the kernels take.
    pub fn dev(&self, g: &Gpu) -> ops::DenseW {
        match self {
            DenseWeight::Bf16(w) => ops::DenseW::Bf16(g.ptr(w)),
            DenseWeight::Mxfp4 { blocks, scales } => ops::DenseW::Mxfp4 {
                blocks: g.ptr(blocks),
                scales: g.ptr(scales),
            },
        }
    }

    /// Whether the weights are MXFP4.
    pub fn is_mxfp4(&self) -> bool {
        matches!(self, DenseWeight::Mxfp4 { .. })
    }

    /// Replace bf16 weights of `cols` input columns by their MXFP4 quantization, computed on
    /// the device, its words then brought to the bf16 layout the dense MXFP4 kernels read
    /// (the bf16 buffer is freed); MXFP4 weights stay as they are. `what` names the tensor in
    /// errors: `cols` not a multiple of 32, non-finite values (counted by the kernel), or a
    /// block scale above [`ops::DENSE_MAX_SCALE`] (weights above 12); the tensor is then
    /// left in bf16.
    pub fn quantize(&mut self, g: &Gpu, what: &str, cols: usize) -> Result<()> {
        let DenseWeight::Bf16(w) = self else {
            return Ok(());
        };
        mxfp4::check_quantizable(what, cols)?;
        let n = w.len();
        ensure!(
            n.is_multiple_of(cols),
            "{what}: {n} values are not whole rows of {cols}"
        );
        let blocks = g.alloc::<u8>(n / 2)?;
        let scales = g.alloc::<u8>(n / 32)?;
        let bad = g.alloc::<u32>(1)?;
        ops::mxfp4_quantize(g, g.ptr(w), g.ptr(&blocks), g.ptr(&scales), n, g.ptr(&bad))?;
        let bad = g.download(&bad)?[0];
        ensure!(
            bad == 0,
            "{what}: {bad} non-finite values (NaN or inf) cannot be quantized to MXFP4; the \
             checkpoint is broken, or keep the layer in bf16 (--mxfp4-layers moe)"
        );
        let top = g.download(&scales)?.into_iter().max().unwrap_or(0);
        ensure!(
            top <= ops::DENSE_MAX_SCALE,
            "{what}: a block needs the MXFP4 scale 2^{} (weights of magnitude up to {}), above \
             the 2^{} the dense MXFP4 kernels hold (weights up to {}); keep the layer in bf16 \
             (--mxfp4-layers moe, or moe,qkv,o for the lm_head)",
            i32::from(top) - 127,
            6.0 * 2f64.powi(i32::from(top) - 127),
            i32::from(ops::DENSE_MAX_SCALE) - 127,
            6.0 * 2f64.powi(i32::from(ops::DENSE_MAX_SCALE) - 127)
        );
        ops::word_layout(g, &ops::BF16_WORDS, &[(g.ptr(&blocks), blocks.len())])?;
        *self = DenseWeight::Mxfp4 { blocks, scales };
        Ok(())
    }
}

impl DeviceWeights {
    /// Bring every layer's expert blocks to `layout` (in place on the device, ~one read and
    /// write of the experts). Standard to fp16 only: the decode options pick the layout once,
    /// before the first step.
    pub fn set_expert_layout(&mut self, g: &Gpu, layout: ExpertLayout) -> Result<()> {
        if layout == self.expert_layout {
            return Ok(());
        }
        ensure!(
            layout == ExpertLayout::F16,
            "the experts are in the {:?} layout; going back to {layout:?} is not supported \
             (load the weights again)",
            self.expert_layout
        );
        let regions: Vec<(u64, usize)> = self
            .layers
            .iter()
            .flat_map(|lw| [&lw.gu_blocks, &lw.dn_blocks])
            .map(|b| (g.ptr(b), b.len()))
            .collect();
        ops::word_layout(g, &ops::F16_WORDS, &regions)?;
        self.expert_layout = layout;
        Ok(())
    }

    /// Bring the dense layers to `fp4`: quantize (on the device) the attention qkv and o
    /// projections for `MoeQkvO` and `All`, and the lm_head for `All`, freeing each bf16 copy
    /// as soon as its MXFP4 one exists. Refuses weights already quantized further than `fp4`
    /// asks (the decode options and the weights would disagree).
    pub fn quantize_dense(&mut self, g: &Gpu, cfg: &ModelConfig, fp4: Fp4Layers) -> Result<()> {
        let h = cfg.hidden_size;
        for (l, layer) in self.layers.iter_mut().enumerate() {
            for (w, name, cols) in [
                (&mut layer.qkv_w, "q_proj|k_proj|v_proj (stacked)", h),
                (&mut layer.o_w, "o_proj", cfg.q_dim()),
            ] {
                let what = format!("model.layers.{l}.self_attn.{name}.weight");
                if fp4.qkv_o() {
                    w.quantize(g, &what, cols)?;
                } else {
                    ensure!(
                        !w.is_mxfp4(),
                        "{what} is MXFP4 but --mxfp4-layers {} keeps it in bf16",
                        fp4.report()
                    );
                }
            }
        }
        if fp4.lm_head() {
            self.lm_head.quantize(g, "lm_head.weight", h)?;
        } else {
            ensure!(
                !self.lm_head.is_mxfp4(),
                "lm_head.weight is MXFP4 but --mxfp4-layers {} keeps it in bf16",
                fp4.report()
            );
        }
        g.sync()
    }

    /// Bytes of the dense projections and lm_head as held now (bf16: 2 per weight; MXFP4:
    /// 17 per 32), for reports.
    pub fn dense_bytes(&self) -> usize {
        let size = |w: &DenseWeight| match w {
            DenseWeight::Bf16(b) => 2 * b.len(),
            DenseWeight::Mxfp4 { blocks, scales } => blocks.len() + scales.len(),
        };
        self.layers
            .iter()
            .map(|l| size(&l.qkv_w) + size(&l.o_w))
            .sum::<usize>()
            + size(&self.lm_head)
    }
}

/// The CPU reference's mirror of [`DeviceWeights::quantize_dense`]: replace the host
/// weights' q, k, v and o projections (for `MoeQkvO` and `All`) and lm_head (for `All`) by
/// dequant(quant(w)) — exactly the values the device's MXFP4 copies hold, in bf16 (exact).
/// q, k and v are quantized one by one: each row's blocks are the same as in the stacked
/// device matrix.
pub fn fake_quantize_host(w: &mut Weights, fp4: Fp4Layers) -> Result<()> {
    let (h, qd) = (w.config.hidden_size, w.config.q_dim());
    let fq = |t: &Bf16Tensor, what: &str, cols: usize| -> Result<Bf16Tensor> {
        Ok(Tensor::owned(
            mxfp4::fake_quantize(what, t.data(), cols)?,
            t.shape().to_vec(),
        ))
    };
    if fp4.qkv_o() {
        for (l, lw) in w.layers.iter_mut().enumerate() {
            let n = |s: &str| format!("model.layers.{l}.self_attn.{s}.weight");
            lw.q_proj = fq(&lw.q_proj, &n("q_proj"), h)?;
            lw.k_proj = fq(&lw.k_proj, &n("k_proj"), h)?;
            lw.v_proj = fq(&lw.v_proj, &n("v_proj"), h)?;
            lw.o_proj = fq(&lw.o_proj, &n("o_proj"), qd)?;
        }
    }
    if fp4.lm_head() {
        w.lm_head = fq(&w.lm_head, "lm_head.weight", h)?;
    }
    Ok(())
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
            qkv_w: DenseWeight::Bf16(bf(&n("self_attn.q_proj.weight"), (qd + 2 * kvd) * h)?),
            qkv_b: bf(&n("self_attn.q_proj.bias"), qd + 2 * kvd)?,
            o_w: DenseWeight::Bf16(bf(&n("self_attn.o_proj.weight"), h * qd)?),
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
        lm_head: DenseWeight::Bf16(bf("lm_head.weight", v * h)?),
        expert_layout: ExpertLayout::Standard,
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
                qkv_w: DenseWeight::Bf16(g.upload(&qkv_w)?),
                qkv_b: g.upload(&qkv_b)?,
                o_w: DenseWeight::Bf16(up16(&lw.o_proj)?),
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
        lm_head: DenseWeight::Bf16(up16(&w.lm_head)?),
        expert_layout: ExpertLayout::Standard,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_quantize_host_replaces_exactly_the_selected_layers() {
        let mut w = synthetic::build("tiny", 3).unwrap();
        let h = w.config.hidden_size;
        let q0: Vec<bf16> = w.layers[1].q_proj.data().to_vec();
        let o0: Vec<bf16> = w.layers[1].o_proj.data().to_vec();
        let router0: Vec<bf16> = w.layers[1].router.data().to_vec();
        let head0: Vec<bf16> = w.lm_head.data()[..4 * h].to_vec();
        fake_quantize_host(&mut w, Fp4Layers::Moe).unwrap();
        assert_eq!(w.layers[1].q_proj.data(), &q0[..]);
        fake_quantize_host(&mut w, Fp4Layers::MoeQkvO).unwrap();
        let q1 = w.layers[1].q_proj.data();
        assert_eq!(q1, &mxfp4::fake_quantize("q", &q0, h).unwrap()[..]);
        assert_ne!(q1, &q0[..]);
        let qd = w.config.q_dim();
        assert_eq!(
            w.layers[1].o_proj.data(),
            &mxfp4::fake_quantize("o", &o0, qd).unwrap()[..]
        );
        assert_eq!(w.layers[1].q_proj.shape(), &[qd, h]);
        // Router and lm_head stay bf16; dequant(quant(w)) is a fixed point of the quantizer.
        assert_eq!(w.layers[1].router.data(), &router0[..]);
        assert_eq!(&w.lm_head.data()[..4 * h], &head0[..]);
        assert_eq!(mxfp4::fake_quantize("q", q1, h).unwrap(), q1);
    }
}
