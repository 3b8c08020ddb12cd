//! Per-kernel checks: every CUDA kernel against its CPU reference on fresh random inputs.

use anyhow::Result;

use super::{Check, Seeds, bits_apart, check, nan_f32, rel_err};
use crate::engine::cuda::device::Gpu;
use crate::engine::cuda::gates::{ActFormat, KvDtype, MoeTile};
use crate::engine::cuda::model::ATTN_MAX_SPLITS;
use crate::engine::cuda::ops::{
    self, AttnScratch, AttnShape, ExpertLayout, MoeCodes, MoeLoop, MoeShape, MoeUnits, MoeWeights,
};
use crate::engine::cuda::quant;
use crate::engine::cuda::reference as r;
use crate::engine::cuda::synthetic::{bf16_vec, f32_vec, u8_vec};
use crate::engine::mxfp4;
use crate::engine::sampling::{self, SamplingParams};

/// Run every kernel check with inputs drawn from `seed`.
pub fn run_kernel_checks(g: &Gpu, seed: u64) -> Result<Vec<Check>> {
    let mut s = Seeds(seed);
    let mut out = Vec::new();
    out.extend(check_embed(g, &mut s)?);
    out.extend(check_rmsnorm(g, &mut s)?);
    out.extend(check_gemv(g, &mut s)?);
    out.extend(check_rope_kv(g, &mut s)?);
    out.extend(check_attention(g, &mut s)?);
    out.extend(check_prefill_attention_tc(g, &mut s)?);
    out.extend(check_router(g, &mut s)?);
    out.extend(check_moe(g, &mut s)?);
    out.extend(check_moe_by_expert(g, &mut s)?);
    out.extend(check_gemm(g, &mut s)?);
    out.extend(check_moe_grouped(g, &mut s)?);
    out.extend(check_argmax(g, &mut s)?);
    out.extend(check_sampling(g, &mut s)?);
    out.extend(check_synthetic(g, &mut s)?);
    out.extend(check_mxfp4_quantize(g, &mut s)?);
    out.extend(check_gemv_mxfp4(g, &mut s)?);
    out.extend(check_gemv_tc(g, &mut s)?);
    out.extend(check_qkv_deferred(g, &mut s)?);
    out.extend(check_moe_tc(g, &mut s)?);
    out.extend(check_moe_f16(g, &mut s)?);
    out.extend(check_gemm_mxfp4(g, &mut s)?);
    out.extend(check_word_layouts(g, &mut s)?);
    Ok(out)
}

fn check_embed(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let (vocab, hidden) = (1000, 2880);
    let table = bf16_vec(s.next(), vocab * hidden, 1.0, 0.0);
    let tokens: Vec<u32> = vec![7, 999, 0, 512];
    let dt = g.upload(&table)?;
    let dtok = g.upload(&tokens)?;
    let dout = nan_f32(g, tokens.len() * hidden)?;
    ops::embed(
        g,
        g.ptr(&dt),
        g.ptr(&dtok),
        g.ptr(&dout),
        hidden,
        tokens.len(),
    )?;
    let got = g.download(&dout)?;
    let want = r::embed(&table, &tokens, hidden);
    Ok(vec![check(
        "embed_gather 4 tokens",
        rel_err(&got, &want),
        0.0,
    )])
}

fn check_rmsnorm(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let (n, t) = (2880, 3);
    let mut res = Vec::new();
    for fused in [false, true] {
        let x = f32_vec(s.next(), n * t, 30.0, 0.5);
        let delta = f32_vec(s.next(), n * t, 5.0, 0.0);
        let w = bf16_vec(s.next(), n, 1.0, 1.0);
        let mut dx = g.upload(&x)?;
        let dd = g.upload(&delta)?;
        let dw = g.upload(&w)?;
        let dy = nan_f32(g, n * t)?;
        let dptr = fused.then(|| g.ptr(&dd));
        ops::rmsnorm(g, g.ptr(&dx), dptr, g.ptr(&dw), g.ptr(&dy), n, t, 1e-5)?;
        let (want_x, want_y) = r::rmsnorm(&x, fused.then_some(delta.as_slice()), &w, 1e-5);
        let got_y = g.download(&dy)?;
        let label = if fused {
            "rmsnorm + residual"
        } else {
            "rmsnorm"
        };
        res.push(check(format!("{label} y"), rel_err(&got_y, &want_y), 1e-5));
        if fused {
            let got_x = g.download(&dx)?;
            res.push(check(format!("{label} x"), rel_err(&got_x, &want_x), 1e-6));
        }
        g.write(&x, &mut dx)?;
    }
    Ok(res)
}

/// " (n rows a block)" where the SIMT GEMV of `rows` rows runs the wide kernel with more than
/// one row a block for `t` tokens.
fn wide_label(g: &Gpu, rows: usize, t: usize) -> Result<String> {
    Ok(match ops::wide_rows(g, rows, t)? {
        n if n > 1 && rows < ops::GEMV_WIDE_ROWS => format!(" ({n} rows a block)"),
        _ => String::new(),
    })
}

fn check_gemv(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let mut res = Vec::new();
    // (rows, cols, tokens, bias, accumulate): vector path, scalar tail path, batch chunks.
    for (rows, cols, t, bias, acc) in [
        (1001, 2880, 1, true, false),
        (517, 4096, 5, true, true),
        (37, 100, 3, false, false),
        (2051, 2880, 6, true, true),
        (2049, 100, 1, false, false),
        (128, 2880, 1, true, false),
        // Several rows a block of the wide kernel (ops::wide_rows), the last block partial.
        (130, 2880, 16, true, true),
        (99, 100, 9, false, false),
    ] {
        let c = DenseCase::new(g, s, rows, cols, t, bias, acc)?;
        let dy = c.out(g)?;
        ops::gemv(
            g,
            g.ptr(&c.dw),
            c.bias_ptr(g),
            g.ptr(&c.dx),
            g.ptr(&dy),
            rows,
            cols,
            t,
            acc,
            None,
        )?;
        res.push(check(
            format!(
                "gemv_bf16 {rows}x{cols} t={t} bias={bias} acc={acc}{}",
                wide_label(g, rows, t)?
            ),
            rel_err(&g.download(&dy)?, &c.want(&c.x)),
            1e-5,
        ));
    }
    // RMSNorm folded into the GEMV, its normalised input written in slices by every block:
    // both wide and narrow kernels, vector and scalar-tail paths, one and two token groups.
    for (rows, cols, t) in [
        (3000, 2880, 3),
        (200, 2880, 1),
        (2100, 4096, 4),
        (100, 4096, 5),
        (2300, 100, 2),
        (50, 100, 5),
        (128, 2880, 16),
        (77, 100, 12),
    ] {
        let w = bf16_vec(s.next(), rows * cols, 0.05, 0.0);
        let b = bf16_vec(s.next(), rows, 1.0, 0.0);
        let nw = bf16_vec(s.next(), cols, 0.2, 1.0);
        let x = f32_vec(s.next(), cols * t, 20.0, 1.0);
        let (dw, db, dnw, dx) = (g.upload(&w)?, g.upload(&b)?, g.upload(&nw)?, g.upload(&x)?);
        let dy = nan_f32(g, rows * t)?;
        let dh = nan_f32(g, cols * t)?;
        let norm = ops::Norm {
            w: g.ptr(&dnw),
            eps: 1e-5,
            out: g.ptr(&dh),
        };
        ops::gemv(
            g,
            g.ptr(&dw),
            Some(g.ptr(&db)),
            g.ptr(&dx),
            g.ptr(&dy),
            rows,
            cols,
            t,
            false,
            Some(norm),
        )?;
        let (_, want_h) = r::rmsnorm(&x, None, &nw, 1e-5);
        let h32: Vec<f32> = want_h.iter().map(|&v| v as f32).collect();
        let want = r::gemv(&w, Some(&b), &h32, None, cols);
        let (got, got_h) = (g.download(&dy)?, g.download(&dh)?);
        let wide = wide_label(g, rows, t)?;
        res.push(check(
            format!("rmsnorm+gemv {rows}x{cols} t={t}{wide}"),
            rel_err(&got, &want),
            1e-5,
        ));
        res.push(check(
            format!("rmsnorm+gemv {rows}x{cols} t={t}{wide} normed input"),
            rel_err(&got_h, &want_h),
            1e-5,
        ));
    }
    Ok(res)
}

/// gpt-oss YaRN, the frequencies every RoPE check uses.
fn gpt_oss_rope() -> Result<(Vec<f32>, f32)> {
    let rope =
        crate::engine::cpu::ops::Rope::new(&crate::engine::synthetic::config("gpt-oss-120b")?);
    Ok((rope.inv_freq, rope.attention_scaling))
}

/// The qkv projection at 9–16 tokens with its K split's finish left to RoPE
/// (`ops::dense_gemv_qkv_deferred`, `gemv_tc_bf16_t16_r64_defer`, `rope_kv_write`'s `nz`)
/// against the wide kernel finishing it itself and RoPE reading its output: q and the K/V
/// cache bit for bit (gpt-oss's shape, bf16 cache) at 9, 12 and 16 tokens. Each case must
/// take the deferred path.
fn check_qkv_deferred(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let sh = AttnShape {
        hq: 64,
        hkv: 8,
        d: 64,
    };
    let (rows, cols) = ((sh.hq + 2 * sh.hkv) * sh.d, 2880);
    let (inv, mscale) = gpt_oss_rope()?;
    let dinv = g.upload(&inv)?;
    let mut res = Vec::new();
    for t in [9usize, 12, 16] {
        let pos: Vec<u32> = (0..t as u32).map(|i| 37 * i + 5).collect();
        let max_pos = 37 * t + 6;
        let region = max_pos * sh.hkv * sh.d;
        let kv_off = vec![0u64; t];
        let (dpos, doff) = (g.upload(&pos)?, g.upload(&kv_off)?);
        let mut c = DenseCase::new(g, s, rows, cols, t, true, false)?;
        let nw = bf16_vec(s.next(), cols, 0.2, 1.0);
        let dnw = g.upload(&nw)?;
        let norm = ops::Norm {
            w: g.ptr(&dnw),
            eps: 1e-5,
            out: 0,
        };
        for fp4 in [false, true] {
            let fp4_w = if fp4 {
                Some(c.quantize_weights(g)?)
            } else {
                None
            };
            let w = match &fp4_w {
                Some((db, ds)) => ops::DenseW::Mxfp4 {
                    blocks: g.ptr(db),
                    scales: g.ptr(ds),
                },
                None => ops::DenseW::Bf16(g.ptr(&c.dw)),
            };
            let bias = c.bias_ptr(g).unwrap_or(0);
            // q, the K and V caches' bytes, and whether the deferred path ran.
            type Out = (Vec<f32>, Vec<u8>, Vec<u8>, bool);
            let run = |defer: bool| -> Result<Out> {
                let y = nan_f32(g, t * rows)?;
                let dq = nan_f32(g, t * sh.hq * sh.d)?;
                let bytes = 2 * region;
                let (dk, dv) = (
                    g.upload(&vec![0xffu8; bytes])?,
                    g.upload(&vec![0xffu8; bytes])?,
                );
                let (x, yp) = (g.ptr(&c.dx), g.ptr(&y));
                let deferred = if defer {
                    ops::dense_gemv_qkv_deferred(
                        g,
                        crate::engine::cuda::gates::DecodeGemv::TensorCore,
                        w,
                        bias,
                        x,
                        yp,
                        rows,
                        cols,
                        t,
                        norm,
                        true,
                    )?
                } else {
                    ops::dense_gemv_tc(
                        g,
                        w,
                        Some(bias),
                        x,
                        yp,
                        rows,
                        cols,
                        t,
                        false,
                        Some(norm),
                        None,
                    )?;
                    None
                };
                ops::rope_kv(
                    g,
                    sh,
                    yp,
                    g.ptr(&dq),
                    g.ptr(&dk),
                    g.ptr(&dv),
                    KvDtype::Bf16,
                    g.ptr(&dinv),
                    g.ptr(&dpos),
                    g.ptr(&doff),
                    t,
                    mscale,
                    1,
                    deferred,
                )?;
                Ok((
                    g.download(&dq)?,
                    g.download(&dk)?,
                    g.download(&dv)?,
                    deferred.is_some(),
                ))
            };
            let (qa, ka, va, _) = run(false)?;
            let (qb, kb, vb, took) = run(true)?;
            let bytes_apart = |a: &[u8], b: &[u8]| a.iter().zip(b).filter(|(x, y)| x != y).count();
            // Every cache element a token writes must be written (0xffff, the poison, is a NaN).
            let unwritten = qb.iter().filter(|v| !v.is_finite()).count()
                + pos
                    .iter()
                    .map(|&p| {
                        let o = 2 * p as usize * sh.hkv * sh.d;
                        let span = o..o + 2 * sh.hkv * sh.d;
                        let nan = |c: &[u8]| c.chunks(2).filter(|e| e == &[0xff, 0xff]).count();
                        nan(&kb[span.clone()]) + nan(&vb[span])
                    })
                    .sum::<usize>();
            let format = if fp4 { "mxfp4" } else { "bf16" };
            let apart = bits_apart(&qb, &qa)
                + (bytes_apart(&kb, &ka) + bytes_apart(&vb, &va) + unwritten) as f64;
            res.push(check(
                format!(
                    "qkv {format} {rows}x{cols} t={t} K split finished by rope_kv_write vs by \
                     the GEMV: q, k, v bits apart + unwritten + not deferred"
                ),
                apart + if took { 0.0 } else { 1.0 },
                0.0,
            ));
        }
    }
    Ok(res)
}

fn check_rope_kv(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let sh = AttnShape {
        hq: 64,
        hkv: 8,
        d: 64,
    };
    let (inv, mscale) = gpt_oss_rope()?;
    let pos: Vec<u32> = vec![0, 127, 4000];
    let t = pos.len();
    let max_pos = 4096;
    let width = (sh.hq + 2 * sh.hkv) * sh.d;
    let region = max_pos * sh.hkv * sh.d;
    // Token 1 writes into a second sequence's region.
    let kv_off: Vec<u64> = vec![0, region as u64, 0];
    let (dinv, dpos, doff) = (g.upload(&inv)?, g.upload(&pos)?, g.upload(&kv_off)?);
    let mut res = Vec::new();
    // Each element kind, one of them also with the prefill's several heads a block.
    for (kv, hb) in [
        (KvDtype::Bf16, 1),
        (KvDtype::F32, 1),
        (KvDtype::Fp8, 1),
        (KvDtype::Bf16, ops::ROPE_PREFILL_HEADS),
    ] {
        let mut qkv = f32_vec(s.next(), t * width, 3.0, 0.0);
        if kv == KvDtype::Fp8 {
            // E4M3 edge cases in token 0's first v head (v is written unrotated): saturation,
            // subnormals and ties (see quant::e4m3_from_f32).
            let v0 = (sh.hq + sh.hkv) * sh.d;
            qkv[v0..v0 + FP8_EDGES.len()].copy_from_slice(&FP8_EDGES);
        }
        let dqkv = g.upload(&qkv)?;
        let dq = nan_f32(g, t * sh.hq * sh.d)?;
        // Poisoned caches (all-ones bytes are NaN in bf16, fp32 and E4M3).
        let bytes = 2 * region * kv.size();
        let dk = g.upload(&vec![0xffu8; bytes])?;
        let dv = g.upload(&vec![0xffu8; bytes])?;
        ops::rope_kv(
            g,
            sh,
            g.ptr(&dqkv),
            g.ptr(&dq),
            g.ptr(&dk),
            g.ptr(&dv),
            kv,
            g.ptr(&dinv),
            g.ptr(&dpos),
            g.ptr(&doff),
            t,
            mscale,
            hb,
            None,
        )?;
        let (gq, gk, gv) = (g.download(&dq)?, g.download(&dk)?, g.download(&dv)?);
        let elem = |c: &[u8], i: usize| -> f32 {
            match kv {
                KvDtype::F32 => {
                    f32::from_le_bytes([c[4 * i], c[4 * i + 1], c[4 * i + 2], c[4 * i + 3]])
                }
                KvDtype::Bf16 => {
                    half::bf16::from_bits(u16::from_le_bytes([c[2 * i], c[2 * i + 1]])).to_f32()
                }
                KvDtype::Fp8 => quant::e4m3_to_f32(c[i]),
            }
        };
        let (mut wq, mut wk, mut wv) = (Vec::new(), Vec::new(), Vec::new());
        let (mut ck, mut cv) = (Vec::new(), Vec::new());
        // fp8: the cache's v bytes that differ from the host's E4M3 of the input.
        let mut v_mismatch = 0usize;
        for ti in 0..t {
            let row = &qkv[ti * width..][..width];
            for h in 0..sh.hq {
                wq.extend(r::rope_head(
                    &row[h * sh.d..][..sh.d],
                    pos[ti],
                    &inv,
                    mscale,
                ));
            }
            for h in 0..sh.hkv {
                let kh = &row[(sh.hq + h) * sh.d..][..sh.d];
                wk.extend(r::rope_head(kh, pos[ti], &inv, mscale));
                let vh = &row[(sh.hq + sh.hkv + h) * sh.d..][..sh.d];
                wv.extend(vh.iter().map(|&v| f64::from(v)));
                let o = kv_off[ti] as usize + (pos[ti] as usize * sh.hkv + h) * sh.d;
                ck.extend((o..o + sh.d).map(|i| elem(&gk, i)));
                cv.extend((o..o + sh.d).map(|i| elem(&gv, i)));
                if kv == KvDtype::Fp8 {
                    v_mismatch += vh
                        .iter()
                        .zip(&gv[o..o + sh.d])
                        .filter(|(v, b)| quant::e4m3_from_f32(**v) != **b)
                        .count();
                }
            }
        }
        let dt = if hb == 1 {
            kv.name().to_string()
        } else {
            format!("{}, {hb} heads a block", kv.name())
        };
        res.push(check(
            format!("rope_kv_write q (YaRN, 3 positions) kv={dt}"),
            rel_err(&gq, &wq),
            1e-5,
        ));
        if kv == KvDtype::Fp8 {
            // k against the reference rounded to E4M3 the way the kernel rounds: only an
            // element within fp32 noise of a rounding boundary may land one E4M3 step (at most
            // 2^-3 of it) away, under 6e-3 of the norm here for one such element; truncating
            // instead of rounding would cost ~5e-2, a wrong byte far more. v is stored
            // unrotated: bit for bit the host's E4M3.
            let wk8: Vec<f64> = wk
                .iter()
                .map(|&v| f64::from(quant::e4m3_to_f32(quant::e4m3_from_f32(v as f32))))
                .collect();
            res.push(check(
                "rope_kv_write k -> fp8 cache (vs fp8-rounded reference)",
                rel_err(&ck, &wk8),
                1e-2,
            ));
            res.push(check(
                "rope_kv_write v -> fp8 cache bytes vs host e4m3 (RNE, saturation, subnormals)",
                v_mismatch as f64,
                0.0,
            ));
        } else {
            // bf16 entries: half an ulp (2^-9) of relative error per element at most.
            let bound = if kv == KvDtype::F32 { 1e-5 } else { 4e-3 };
            res.push(check(
                format!("rope_kv_write k -> {dt} cache"),
                rel_err(&ck, &wk),
                bound,
            ));
            res.push(check(
                format!("rope_kv_write v -> {dt} cache"),
                rel_err(&cv, &wv),
                bound,
            ));
        }
    }
    Ok(res)
}

/// E4M3 edge cases (round to nearest even, saturation at ±448, subnormals down to 2^-9) that
/// the fp8 KV write must store exactly as `quant::e4m3_from_f32` does.
const FP8_EDGES: [f32; 16] = [
    448.0,
    -448.0,
    449.0,
    500.0,
    -1e9,
    f32::INFINITY,
    0.001953125,
    0.0019531,
    -0.0009765625,
    0.0029296875,
    0.0146484375,
    1.0625,
    1.1875,
    -15.5,
    240.0,
    0.0,
];

/// A K/V cache pair of one element type on the device, and the values it holds as bf16 bits
/// for the reference (exact: bf16 holds every E4M3 value, fp32 every bf16 one).
struct KvCaches {
    kv: KvDtype,
    dk: cudarc::driver::CudaSlice<u8>,
    dv: cudarc::driver::CudaSlice<u8>,
    k_ref: Vec<u16>,
    v_ref: Vec<u16>,
}

impl KvCaches {
    /// Bf16 K/V values `k`, `v` stored as `kv` (fp8: rounded to E4M3 on the host, and the
    /// reference takes the rounded values).
    fn new(g: &Gpu, kv: KvDtype, k: &[u16], v: &[u16]) -> Result<Self> {
        let store = |x: &[u16]| -> (Vec<u8>, Vec<u16>) {
            match kv {
                KvDtype::Bf16 => (x.iter().flat_map(|b| b.to_le_bytes()).collect(), x.to_vec()),
                KvDtype::F32 => (
                    x.iter()
                        .flat_map(|&b| (r::bf(b) as f32).to_le_bytes())
                        .collect(),
                    x.to_vec(),
                ),
                KvDtype::Fp8 => {
                    let bytes: Vec<u8> = x
                        .iter()
                        .map(|&b| quant::e4m3_from_f32(r::bf(b) as f32))
                        .collect();
                    let rounded = bytes
                        .iter()
                        .map(|&b| r::to_bf(quant::e4m3_to_f32(b)))
                        .collect();
                    (bytes, rounded)
                }
            }
        };
        let ((kb, k_ref), (vb, v_ref)) = (store(k), store(v));
        Ok(Self {
            kv,
            dk: g.upload(&kb)?,
            dv: g.upload(&vb)?,
            k_ref,
            v_ref,
        })
    }
}

/// Query rows of the attention checks and what they attend with, on the host and the device.
struct AttnRows {
    sh: AttnShape,
    q: Vec<f32>,
    pos: Vec<u32>,
    kv_off: Vec<u64>,
    sinks: Vec<u16>,
    dq: cudarc::driver::CudaSlice<f32>,
    dpos: cudarc::driver::CudaSlice<u32>,
    doff: cudarc::driver::CudaSlice<u64>,
    ds: cudarc::driver::CudaSlice<u16>,
    scratch_bufs: [cudarc::driver::CudaSlice<f32>; 3],
    entries: usize,
}

impl AttnRows {
    fn scratch(&self, g: &Gpu) -> AttnScratch {
        AttnScratch {
            m: g.ptr(&self.scratch_bufs[0]),
            l: g.ptr(&self.scratch_bufs[1]),
            acc: g.ptr(&self.scratch_bufs[2]),
            entries: self.entries,
        }
    }

    /// Decode (split-K) and prefill attention over `c` for one (window, sinks, splits) case:
    /// `nsplit` blocks per head share each row's keys, at least `min_split` each. Both against
    /// the f64 reference on the values the cache holds (1e-5: summation order). With one
    /// split the split kernel finishes the heads itself; then also the same launch ending in
    /// `attn_combine`, which must give the same bits. The tensor-core kernel on an fp8 cache
    /// also with its eight-warp entries ([`ops::TcVariant::wide`]).
    #[allow(clippy::too_many_arguments)]
    fn check(
        &self,
        g: &Gpu,
        c: &KvCaches,
        window: usize,
        sink_on: bool,
        kernel: ops::AttnKernel,
        nsplit: usize,
        min_split: usize,
        label: &str,
    ) -> Result<Vec<Check>> {
        let (sh, t) = (self.sh, self.pos.len());
        let scale = 1.0 / (sh.d as f64).sqrt();
        let sinks = sink_on.then(|| g.ptr(&self.ds));
        let decode = |finish: bool, tc: ops::TcVariant| -> Result<Vec<f32>> {
            let dout = nan_f32(g, t * sh.hq * sh.d)?;
            ops::attention(
                g,
                sh,
                g.ptr(&self.dq),
                g.ptr(&c.dk),
                g.ptr(&c.dv),
                c.kv,
                g.ptr(&self.dpos),
                g.ptr(&self.doff),
                sinks,
                g.ptr(&dout),
                &self.scratch(g),
                t,
                window,
                kernel,
                nsplit,
                min_split,
                scale as f32,
                finish,
                tc,
            )?;
            g.download(&dout)
        };
        let mut want = Vec::new();
        for ti in 0..t {
            let off = self.kv_off[ti] as usize;
            want.extend(r::attention(
                &self.q[ti * sh.hq * sh.d..][..sh.hq * sh.d],
                &c.k_ref[off..],
                &c.v_ref[off..],
                self.pos[ti] as usize,
                sh.hq,
                sh.hkv,
                sh.d,
                window,
                sink_on.then_some(self.sinks.as_slice()),
                scale,
            ));
        }
        let kv = c.kv.name();
        let tensor_cores = kernel == ops::AttnKernel::GqaTc;
        let wides: &[bool] = if tensor_cores && c.kv == KvDtype::Fp8 {
            &[false, true]
        } else {
            &[false]
        };
        let mut res = Vec::new();
        for &wide in wides {
            let tc = |fixed_dim| ops::TcVariant { fixed_dim, wide };
            let entry = if wide { "eight-warp " } else { "" };
            let got = decode(true, tc(true))?;
            if tensor_cores && sh.d == 64 {
                res.push(check(
                    format!(
                        "attention {label}{kernel:?} window={window} sinks={sink_on} \
                         splits={nsplit} kv={kv}: the {entry}head-dim-64 entry = the {entry}\
                         run-time head dim entry, elements apart"
                    ),
                    bits_apart(&got, &decode(true, tc(false))?),
                    0.0,
                ));
            }
            if nsplit == 1 {
                res.push(check(
                    format!(
                        "attention {label}{entry}{kernel:?} window={window} sinks={sink_on} one \
                         split finished in the split kernel = with attn_combine, elements apart, \
                         kv={kv}"
                    ),
                    bits_apart(&got, &decode(false, tc(true))?),
                    0.0,
                ));
            }
            res.push(check(
                format!(
                    "attention {label}{entry}{kernel:?} window={window} sinks={sink_on} \
                     splits={nsplit} min_split={min_split} kv={kv}"
                ),
                rel_err(&got, &want),
                // bf16 queries, probabilities and values on the tensor cores (as
                // attn_prefill_tc).
                if tensor_cores { 1e-2 } else { 1e-5 },
            ));
        }
        // The prefill kernel on the same rows (one query row each, GQA group per block).
        let dout = nan_f32(g, t * sh.hq * sh.d)?;
        ops::attention_rows(
            g,
            sh,
            g.ptr(&self.dq),
            g.ptr(&c.dk),
            g.ptr(&c.dv),
            c.kv,
            g.ptr(&self.dpos),
            g.ptr(&self.doff),
            sinks,
            g.ptr(&dout),
            t,
            window,
            scale as f32,
        )?;
        let prefill = check(
            format!("attn_prefill {label}window={window} sinks={sink_on} kv={kv}"),
            rel_err(&g.download(&dout)?, &want),
            1e-5,
        );
        res.push(prefill);
        Ok(res)
    }
}

/// Random K/V (two sequences' regions of `max_pos` positions), queries at `pos` and sinks.
fn attn_inputs(
    g: &Gpu,
    s: &mut Seeds,
    sh: AttnShape,
    max_pos: usize,
    pos: Vec<u32>,
) -> Result<(AttnRows, Vec<u16>, Vec<u16>)> {
    let region = max_pos * sh.hkv * sh.d;
    let k = bf16_vec(s.next(), 2 * region, 2.0, 0.0);
    let v = bf16_vec(s.next(), 2 * region, 1.0, 0.0);
    let sinks = bf16_vec(s.next(), sh.hq, 2.0, 1.0);
    // Row 1 reads the second sequence's region.
    let kv_off: Vec<u64> = (0..pos.len())
        .map(|i| if i == 1 { region as u64 } else { 0 })
        .collect();
    let t = pos.len();
    let q = f32_vec(s.next(), t * sh.hq * sh.d, 2.0, 0.0);
    let entries = t * sh.hq * ATTN_MAX_SPLITS;
    let rows = AttnRows {
        sh,
        dq: g.upload(&q)?,
        dpos: g.upload(&pos)?,
        doff: g.upload(&kv_off)?,
        ds: g.upload(&sinks)?,
        scratch_bufs: [
            g.alloc::<f32>(entries)?,
            g.alloc::<f32>(entries)?,
            g.alloc::<f32>(entries * sh.d)?,
        ],
        entries,
        q,
        pos,
        kv_off,
        sinks,
    };
    Ok((rows, k, v))
}

/// The decode-attention split kernels to check for shape `sh` on a `kv` cache: per head, GQA,
/// and the tensor-core GQA kernel where it takes the shape and cache.
fn split_kernels(g: &Gpu, sh: AttnShape, kv: KvDtype) -> Result<Vec<ops::AttnKernel>> {
    let mut k = vec![ops::AttnKernel::PerHead, ops::AttnKernel::Gqa];
    if ops::gqa_tc_fits(g, sh, kv)? {
        k.push(ops::AttnKernel::GqaTc);
    }
    Ok(k)
}

/// Decode and prefill attention on bf16, fp32 and fp8 caches (the fp8 reference on the
/// E4M3-rounded K/V), then the fp8 and bf16 caches at the other head dims' load paths.
fn check_attention(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let sh = AttnShape {
        hq: 64,
        hkv: 8,
        d: 64,
    };
    let (rows, k, v) = attn_inputs(g, s, sh, 3001, vec![0, 200, 3000])?;
    let caches = [
        KvCaches::new(g, KvDtype::Bf16, &k, &v)?,
        KvCaches::new(g, KvDtype::F32, &k, &v)?,
        KvCaches::new(g, KvDtype::Fp8, &k, &v)?,
    ];
    let mut res = Vec::new();
    // (window, sinks, splits, min keys per split, cache): rows at positions 0, 200 and 3000,
    // so the splits range from one taking every key to most of 64 left empty; a graph
    // captured for the whole cache runs the last kind.
    for (window, sink_on, nsplit, min_split, c) in [
        (0, true, 47, 64, 0),
        (128, true, 2, 64, 0),
        (0, false, 12, 256, 0),
        (128, true, 1, 4096, 0),
        (0, true, 1, 32, 0),
        (0, true, 5, 32, 0),
        (0, true, 64, 32, 0),
        (128, true, 64, 32, 0),
        (0, true, 47, 64, 1),
        (128, false, 2, 64, 1),
        (0, true, 47, 64, 2),
        (128, true, 2, 64, 2),
        (0, false, 64, 32, 2),
        (0, false, 1, 4096, 1),
        (0, true, 1, 4096, 2),
        (128, false, 1, 4096, 2),
    ] {
        for kernel in split_kernels(g, sh, caches[c].kv)? {
            res.extend(rows.check(
                g, &caches[c], window, sink_on, kernel, nsplit, min_split, "",
            )?);
        }
    }
    // The GQA kernels' finest splits (8 keys).
    for c in &caches {
        for kernel in split_kernels(g, sh, c.kv)?.into_iter().skip(1) {
            res.extend(rows.check(g, c, 0, true, kernel, 64, 8, "")?);
        }
    }
    // d / 32 = 1, 3 and 4 dims per lane: the decode kernel's other load paths.
    for d in [32, 96, 128] {
        let sh = AttnShape { hq: 8, hkv: 2, d };
        let (rows, k, v) = attn_inputs(g, s, sh, 300, vec![0, 150, 299])?;
        for kv in [KvDtype::Bf16, KvDtype::Fp8] {
            let c = KvCaches::new(g, kv, &k, &v)?;
            for kernel in split_kernels(g, sh, kv)? {
                res.extend(rows.check(g, &c, 100, true, kernel, 2, 64, &format!("d={d} "))?);
            }
        }
    }
    // More query heads per KV head than attn_split_gqa takes: the one-block-per-head kernel,
    // and the tensor-core GQA kernel (16 heads: every row of its MMA tile).
    let sh = AttnShape {
        hq: 32,
        hkv: 2,
        d: 64,
    };
    let (rows, k, v) = attn_inputs(g, s, sh, 300, vec![0, 150, 299])?;
    for kv in [KvDtype::Bf16, KvDtype::Fp8] {
        let c = KvCaches::new(g, kv, &k, &v)?;
        let mut kernels = vec![ops::AttnKernel::PerHead];
        if ops::gqa_tc_fits(g, sh, kv)? {
            kernels.push(ops::AttnKernel::GqaTc);
        }
        for kernel in kernels {
            res.extend(rows.check(g, &c, 0, true, kernel, 5, 32, "hq/hkv=16 ")?);
        }
    }
    Ok(res)
}

/// The tensor-core prefill attention (`attn_prefill_tc`) against the f64 reference on the
/// cached values: a 40-row run of one sequence deep in its cache (tiles of 16, 16 and 8 rows),
/// a 7-row prompt from position 0 of another, and two rows with a gap between them; full and
/// sliding windows, sinks on and off; gpt-oss's shape, and 4 query heads per KV head with 128
/// and 32 head dims. bf16 queries, keys, probabilities and values with fp32 sums: 1e-2.
fn check_prefill_attention_tc(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let mut res = Vec::new();
    for sh in [
        AttnShape {
            hq: 64,
            hkv: 8,
            d: 64,
        },
        AttnShape {
            hq: 8,
            hkv: 2,
            d: 128,
        },
        AttnShape {
            hq: 8,
            hkv: 2,
            d: 32,
        },
    ] {
        let max_pos = 400;
        let region = max_pos * sh.hkv * sh.d;
        let k = bf16_vec(s.next(), 2 * region, 2.0, 0.0);
        let v = bf16_vec(s.next(), 2 * region, 1.0, 0.0);
        let sinks = bf16_vec(s.next(), sh.hq, 2.0, 1.0);
        let pos: Vec<u32> = (300..340).chain(0..7).chain([250, 252]).collect();
        let offs: Vec<u64> = (0..pos.len())
            .map(|i| {
                if (40..47).contains(&i) {
                    region as u64
                } else {
                    0
                }
            })
            .collect();
        let t = pos.len();
        let q = f32_vec(s.next(), t * sh.hq * sh.d, 2.0, 0.0);
        let tiles = ops::prefill_attn_tiles(&pos, &offs);
        let (dk, dv, ds) = (g.upload(&k)?, g.upload(&v)?, g.upload(&sinks)?);
        let (dq, dp, doff, dt) = (
            g.upload(&q)?,
            g.upload(&pos)?,
            g.upload(&offs)?,
            g.upload(&tiles)?,
        );
        let scale = 1.0 / (sh.d as f64).sqrt();
        // Split keys: 3 shares, and 7 (more than some tiles have key tiles: empty shares).
        let split_floats = 7 * ops::attn_split_floats(sh, t);
        let dsplit = nan_f32(g, split_floats)?;
        let split = ops::SplitScratch {
            ptr: g.ptr(&dsplit),
            floats: split_floats,
        };
        for (window, sink_on, splits) in [
            (0, true, 1),
            (128, true, 1),
            (0, false, 1),
            (128, false, 1),
            (0, true, 3),
            (128, true, 7),
            (0, false, 7),
        ] {
            let dout = nan_f32(g, t * sh.hq * sh.d)?;
            ops::attention_rows_tc(
                g,
                sh,
                g.ptr(&dq),
                g.ptr(&dk),
                g.ptr(&dv),
                g.ptr(&dp),
                g.ptr(&doff),
                sink_on.then(|| g.ptr(&ds)),
                g.ptr(&dout),
                (g.ptr(&dt), tiles.len() / 2, t),
                window,
                scale as f32,
                ((splits > 1).then_some(split), splits),
            )?;
            let mut want = Vec::new();
            for ti in 0..t {
                let off = offs[ti] as usize;
                want.extend(r::attention(
                    &q[ti * sh.hq * sh.d..][..sh.hq * sh.d],
                    &k[off..],
                    &v[off..],
                    pos[ti] as usize,
                    sh.hq,
                    sh.hkv,
                    sh.d,
                    window,
                    sink_on.then_some(sinks.as_slice()),
                    scale,
                ));
            }
            res.push(check(
                format!(
                    "attn_prefill_tc hq={} hkv={} d={} window={window} sinks={sink_on} rows={t}{}",
                    sh.hq,
                    sh.hkv,
                    sh.d,
                    if splits > 1 {
                        format!(" keys in {splits} splits")
                    } else {
                        String::new()
                    }
                ),
                rel_err(&g.download(&dout)?, &want),
                1e-2,
            ));
        }
    }
    Ok(res)
}

/// The router GEMV with routing fused, and the prefill's `router_rows`: identity weights make
/// the logits exactly the given values (ties included), so the top-k is checked on known
/// logits; token counts above one group of 4 exercise the GEMV's per-group counters, and a
/// second launch checks they were reset; 37 tokens and 160 experts take `router_rows` over
/// several blocks and two expert chunks.
fn check_router(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let mut res = Vec::new();
    for (experts, k, t, rows) in [
        (128, 4, 3, false),
        (128, 4, 16, false),
        (130, 4, 9, false),
        (32, 4, 6, false),
        (8, 4, 1, false),
        (128, 4, 37, true),
        (160, 4, 37, true),
        (32, 4, 6, true),
    ] {
        let mut logits = f32_vec(s.next(), experts * t, 4.0, 0.0);
        // A tie on the largest logit: the lower index must come first.
        logits[experts - 1] = 10.0;
        logits[1] = 10.0;
        let one = r::to_bf(1.0);
        let eye: Vec<u16> = (0..experts * experts)
            .map(|i| if i / experts == i % experts { one } else { 0 })
            .collect();
        let (dw_eye, dx) = (g.upload(&eye)?, g.upload(&logits)?);
        let dl = nan_f32(g, experts * t)?;
        let counters = g.alloc::<u32>(ops::topk_counters(t, experts))?;
        for launch in 0..2 {
            let di = g.upload(&vec![-1i32; k * t])?;
            let dw = nan_f32(g, k * t)?;
            let topk = ops::TopK {
                idx: g.ptr(&di),
                w: g.ptr(&dw),
                k,
                counter: g.ptr(&counters),
                ready: None,
            };
            let (wp, xp, lp) = (g.ptr(&dw_eye), g.ptr(&dx), g.ptr(&dl));
            if rows {
                ops::router_rows(g, wp, None, xp, lp, experts, experts, t, topk)?;
            } else {
                ops::router(g, wp, None, xp, lp, experts, experts, t, None, topk, true)?;
            }
            let (gi, gw) = (g.download(&di)?, g.download(&dw)?);
            let (mut want_w, mut mism) = (Vec::new(), 0usize);
            for ti in 0..t {
                let (idx, w) = r::router_topk(&logits[ti * experts..][..experts], k);
                mism += idx
                    .iter()
                    .zip(&gi[ti * k..][..k])
                    .filter(|(a, b)| **a as i32 != **b)
                    .count();
                want_w.extend(w);
            }
            let kernel = if rows { "router_rows" } else { "router" };
            let label = format!("{kernel}+topk {k} of {experts}, t={t}, launch {launch}");
            res.push(check(format!("{label} indices"), mism as f64, 0.0));
            res.push(check(
                format!("{label} weights"),
                rel_err(&gw, &want_w),
                1e-6,
            ));
        }
        // The groups' counters and the tokens' mailbox words are zero again for the next
        // launch (the second launch above reads the same logits, so stale words would pass it).
        let left = g.download(&counters)?.iter().filter(|&&v| v != 0).count();
        let kernel = if rows { "router_rows" } else { "router" };
        res.push(check(
            format!("{kernel}+topk {k} of {experts}, t={t}: counters and mailbox words zero after"),
            left as f64,
            0.0,
        ));
    }
    res.extend(check_router_t1(g, s)?);
    res.extend(check_router_batch(g, s)?);
    Ok(res)
}

/// A router case with the norm folded in: `t` tokens of `cols` inputs, `experts` rows, top
/// `k`, random weights, bias, norm weights and inputs on the device.
struct RouterCase {
    experts: usize,
    cols: usize,
    k: usize,
    dw: cudarc::driver::CudaSlice<u16>,
    db: cudarc::driver::CudaSlice<u16>,
    dnw: cudarc::driver::CudaSlice<u16>,
    dx: cudarc::driver::CudaSlice<f32>,
    counters: cudarc::driver::CudaSlice<u32>,
}

impl RouterCase {
    fn new(
        g: &Gpu,
        s: &mut Seeds,
        experts: usize,
        cols: usize,
        k: usize,
        t: usize,
    ) -> Result<Self> {
        Ok(Self {
            experts,
            cols,
            k,
            dw: g.upload(&bf16_vec(s.next(), experts * cols, 0.05, 0.0))?,
            db: g.upload(&bf16_vec(s.next(), experts, 1.0, 0.0))?,
            dnw: g.upload(&bf16_vec(s.next(), cols, 0.2, 1.0))?,
            dx: g.upload(&f32_vec(s.next(), cols * t, 20.0, 1.0))?,
            counters: g.alloc::<u32>(ops::topk_counters(t, experts))?,
        })
    }

    /// One router launch over `n` tokens from token `t0` (`one_row`: the one-row entry where
    /// it applies): logits, experts, their weights and the normalised input, each output
    /// NaN-filled first.
    fn run(&self, g: &Gpu, t0: usize, n: usize, one_row: bool) -> Result<[Vec<f32>; 4]> {
        let (experts, cols, k) = (self.experts, self.cols, self.k);
        let (dl, dh) = (nan_f32(g, experts * n)?, nan_f32(g, cols * n)?);
        let (di, dwt) = (g.upload(&vec![-1i32; k * n])?, nan_f32(g, k * n)?);
        let (norm, topk) = router_args(g, &self.dnw, &dh, &di, &dwt, &self.counters, k, None);
        ops::router(
            g,
            g.ptr(&self.dw),
            Some(g.ptr(&self.db)),
            g.ptr(&self.dx) + (t0 * cols * 4) as u64,
            g.ptr(&dl),
            experts,
            cols,
            n,
            Some(norm),
            topk,
            one_row,
        )?;
        let idx: Vec<f32> = g.download(&di)?.iter().map(|&i| i as f32).collect();
        Ok([g.download(&dl)?, idx, g.download(&dwt)?, g.download(&dh)?])
    }
}

/// Elements of two router runs' outputs whose bits differ, plus every output left unwritten
/// (NaN) in either: an entry that writes nothing cannot pass.
fn router_outputs_apart(a: &[Vec<f32>; 4], b: &[Vec<f32>; 4]) -> f64 {
    let unwritten = a
        .iter()
        .chain(b.iter())
        .flatten()
        .filter(|v| !v.is_finite())
        .count();
    (0..4).map(|i| bits_apart(&a[i], &b[i])).sum::<f64>() + unwritten as f64
}

/// A token's routing does not depend on the tokens routed beside it: the router of t tokens
/// with the norm folded in (the decode step's: token groups of 4, one or several rows a
/// block, the last group partial at t = 3, 6, 9) against the one-row entry on each token
/// alone; logits, experts, their weights and the normalised input, bit for bit, and all of
/// them written.
fn check_router_batch(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let mut res = Vec::new();
    for (experts, cols, k, t) in [
        (128, 2880, 4, 3),
        (128, 2880, 4, 8),
        (128, 2880, 4, 9),
        (128, 2880, 4, 16),
        (32, 2880, 4, 6),
        (60, 64, 2, 16),
    ] {
        let c = RouterCase::new(g, s, experts, cols, k, t)?;
        let batch = c.run(g, 0, t, true)?;
        let mut alone: [Vec<f32>; 4] = Default::default();
        for ti in 0..t {
            for (all, one) in alone.iter_mut().zip(c.run(g, ti, 1, true)?) {
                all.extend(one);
            }
        }
        res.push(check(
            format!(
                "router t={t} {experts}x{cols} top {k}{}: bits apart from each token routed alone",
                wide_label(g, experts, t)?
            ),
            router_outputs_apart(&batch, &alone),
            0.0,
        ));
        let left = g.download(&c.counters)?.iter().filter(|&&v| v != 0).count();
        res.push(check(
            format!("router t={t} {experts}x{cols}: counters and mailbox words zero after"),
            left as f64,
            0.0,
        ));
    }
    Ok(res)
}

/// The router's norm (weights `nw`, normalised input into `h`, eps 1e-5) and routing outputs
/// (experts `idx`, weights `w`, completion counters, top `k`, the MoE's words if any).
#[allow(clippy::too_many_arguments)]
fn router_args(
    g: &Gpu,
    nw: &cudarc::driver::CudaSlice<u16>,
    h: &cudarc::driver::CudaSlice<f32>,
    idx: &cudarc::driver::CudaSlice<i32>,
    w: &cudarc::driver::CudaSlice<f32>,
    counters: &cudarc::driver::CudaSlice<u32>,
    k: usize,
    ready: Option<ops::MoeWords>,
) -> (ops::Norm, ops::TopK) {
    let norm = ops::Norm {
        w: g.ptr(nw),
        eps: 1e-5,
        out: g.ptr(h),
    };
    let topk = ops::TopK {
        idx: g.ptr(idx),
        w: g.ptr(w),
        k,
        counter: g.ptr(counters),
        ready,
    };
    (norm, topk)
}

/// The one-row router entry (`gemv_router_t1`, batch 1 with the norm folded in) against the
/// general `gemv_bf16_wide` on the same inputs: logits, experts, their weights and the
/// normalised input, bit for bit, and all of them written. The one-row entry takes its logits
/// from the mailbox: four words a lane at 128 experts, one at 32, and past 128 (160) one word
/// at a time in the butterfly's loop.
fn check_router_t1(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let mut res = Vec::new();
    for (experts, cols, k) in [(128, 2880, 4), (32, 2880, 4), (60, 64, 2), (160, 64, 4)] {
        let c = RouterCase::new(g, s, experts, cols, k, 1)?;
        let (one_row, general) = (c.run(g, 0, 1, true)?, c.run(g, 0, 1, false)?);
        res.push(check(
            format!(
                "router t=1 one-row entry {experts}x{cols} top {k}: bits apart from the general"
            ),
            router_outputs_apart(&one_row, &general),
            0.0,
        ));
    }
    Ok(res)
}

/// Units per warp the decode MoE checks run with (gate_up, down), and the loop: each loop
/// at one unit a warp and at odd counts, and the most the automatic choice takes.
const MOE_UNIT_CASES: [MoeUnits; 5] = [
    MoeUnits::ONE,
    MoeUnits::new(1, 1, MoeLoop::Slots),
    MoeUnits::new(3, 5, MoeLoop::Items),
    MoeUnits::new(3, 5, MoeLoop::Slots),
    MoeUnits::new(8, 8, MoeLoop::Auto),
];

fn check_moe(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let (e, hidden, inter, k, t) = (8usize, 2880usize, 2880usize, 4usize, 2usize);
    let sh = MoeShape {
        hidden,
        inter,
        k,
        limit: 7.0,
        alpha: 1.702,
    };
    let mut c = MoeCase::new(g, s, e, sh, t, |_| {
        (
            vec![3, 0, 7, 5, 1, 2, 6, 4],
            vec![0.4, 0.3, 0.2, 0.1, 0.25, 0.25, 0.3, 0.2],
        )
    })?;
    // Units per warp: one (the original shape), odd counts that leave the last block's
    // warps partly past the rows, and the most the automatic choice takes.
    let mut res = Vec::new();
    // The output of each case, for the loops' bit-for-bit comparison.
    let mut outs: Vec<(MoeUnits, Vec<f32>)> = Vec::new();
    for units in MOE_UNIT_CASES {
        let dact = nan_f32(g, t * k * inter)?;
        let dpart = nan_f32(g, t * k * hidden)?;
        let dy = g.upload(&c.y0)?;
        let dctr = g.alloc::<u32>(ops::moe_counters(hidden, t))?;
        ops::moe(
            g,
            &c.weights(g),
            sh,
            MoeCodes::F32,
            g.ptr(&c.dx),
            g.ptr(&c.di),
            g.ptr(&c.dw),
            g.ptr(&dact),
            g.ptr(&dpart),
            g.ptr(&dy),
            t,
            true,
            units,
            g.ptr(&dctr),
        )?;
        let y = g.download(&dy)?;
        res.push(check(
            format!(
                "moe mxfp4 gemv+swiglu E={e} H={hidden} I={inter} k={k} t={t} units {}/{} loop {}",
                units.gate_up,
                units.down,
                units.lp.name()
            ),
            rel_err(&y, &c.want(&c.x, false)),
            1e-5,
        ));
        outs.push((units, y));
        // The last slot block resets its counter: a graph replay starts from zero again.
        let left = g.download(&dctr)?.iter().filter(|&&v| v != 0).count();
        res.push(check(
            format!(
                "moe slot counters zero after the step, units {} loop {}",
                units.down,
                units.lp.name()
            ),
            left as f64,
            0.0,
        ));
    }
    // The two loops compute the same sums in the same order: bit-identical outputs.
    for (a, ya) in &outs {
        for (b, yb) in &outs {
            let same_units = (a.gate_up, a.down) == (b.gate_up, b.down);
            if same_units && a.lp == MoeLoop::Items && b.lp == MoeLoop::Slots
                || same_units && a.gate_up == 1 && a.lp == MoeLoop::Auto && b.lp == MoeLoop::Slots
            {
                res.push(check(
                    format!(
                        "moe loops items and slots bit-identical, units {}/{}",
                        a.gate_up, a.down
                    ),
                    bits_apart(ya, yb),
                    0.0,
                ));
            }
        }
    }
    // The 8-bit activation kernels on the same experts, with a zero group and a group with
    // one large outlier (its other values land on small codes, fp8 subnormals) in token 0.
    c.x[..32].fill(0.0);
    c.x[32 + 5] = 40.0;
    g.write(&c.x, &mut c.dx)?;
    for fmt in [ActFormat::Q8, ActFormat::Fp8] {
        res.extend(check_moe_codes(g, &c, fmt.into(), MoeUnits::ONE)?);
    }
    // The bf16 format's fp16 dot (the default decode MoE): every loop and unit count on the
    // gpt-oss shape (the slots' three items a row, the last one partly past the row).
    for units in MOE_UNIT_CASES {
        res.extend(check_moe_codes(g, &c, MoeCodes::F16, units)?);
    }
    // A small shape: 5 groups of x and 3 of act leave the staging's last 4-group step partly
    // empty; 3 tokens, 2 slots.
    let sh = MoeShape {
        hidden: 160,
        inter: 96,
        k: 2,
        limit: 7.0,
        alpha: 1.702,
    };
    // Its own seed stream, so the later checks keep their inputs.
    let mut s2 = Seeds(s.0 ^ 0x0ac7_0008);
    let c = MoeCase::new(g, &mut s2, 4, sh, 3, |_| {
        (vec![2, 0, 1, 3, 3, 2], vec![0.6, 0.4, 0.5, 0.5, 0.7, 0.3])
    })?;
    for codes in [MoeCodes::Q8, MoeCodes::Fp8, MoeCodes::F16] {
        for units in MOE_UNIT_CASES {
            res.extend(check_moe_codes(g, &c, codes, units)?);
        }
    }
    res.extend(check_moe_ready(g, s)?);
    Ok(res)
}

/// The decode MoE taking its experts from the router's announcements (`TopK::ready`, the
/// decode step's path) against the same kernels reading them after their wait: the router
/// (the one-row entry at one token, the general one at three) routes, then gate_up and down
/// run with the announcements and again without, on the router's experts and normalised
/// input. gate_up's outputs and the step's bit for bit, both written, and the announcements
/// cleared afterwards (the next layer's router starts from zero). Then once more with gate_up
/// normalising the residual itself (`moe_gate_up`'s norm) and the router writing no
/// normalised copy: within 1e-3 of the others. Its own sum of squares may round the scale
/// apart from the router's by an ulp, which moves any fp16 code that sat at a rounding edge
/// (one fp16 ulp, 2^-11 of the value): 0 to 4e-5 on most seeds, 1.1e-4 on one (docs/perf.md
/// run 412), so 1e-4 failed by the seed; 1e-3 is a quarter of the fp16 dot's own bound against
/// the f64 reference (4e-3), where a wrong norm weight or a wrong row is orders of
/// magnitude larger. The kernels run in turn here; in the step gate_up's blocks poll while the router
/// ends.
fn check_moe_ready(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let mut res = Vec::new();
    let (e, inter, k) = (32usize, 2880usize, 4usize);
    // One pair of word buffers for every batch, sized for the largest, as the step keeps them:
    // the batch of 3 runs on words the batch of 1 has used.
    let (dready, ddone) = (g.alloc::<u32>(3 * k)?, g.alloc::<u32>(3 * k)?);
    // down's mailbox likewise, for the widest case.
    let mail_shape = MoeShape {
        hidden: 4160,
        inter,
        k,
        limit: 7.0,
        alpha: 1.702,
    };
    let dmail = g.alloc::<u32>(ops::moe_mail_words(mail_shape, 3))?;
    // gpt-oss's width, then one past a single step of gate_up's normalising loads (4096 at
    // 256 threads), which reads the residual twice.
    for (t, hidden) in [(1usize, 2880usize), (3, 2880), (1, 4160)] {
        let sh = MoeShape {
            hidden,
            inter,
            k,
            limit: 7.0,
            alpha: 1.702,
        };
        // Routing comes from the router below; the case's own is not used.
        let c = MoeCase::new(g, s, e, sh, t, |_| (vec![0; t * k], vec![0.0; t * k]))?;
        let rw = bf16_vec(s.next(), e * hidden, 0.05, 0.0);
        let nw = bf16_vec(s.next(), hidden, 0.2, 1.0);
        let (drw, dnw) = (g.upload(&rw)?, g.upload(&nw)?);
        let (dl, dh) = (nan_f32(g, t * e)?, nan_f32(g, t * hidden)?);
        let (di, dwt) = (g.upload(&vec![-1i32; t * k])?, nan_f32(g, t * k)?);
        let counters = g.alloc::<u32>(ops::topk_counters(t, e))?;
        // The fp16 dot's last outputs (act, y) of each loop, compared below.
        let mut f16_outs: Vec<(String, Vec<f32>, Vec<f32>)> = Vec::new();
        for (codes, units) in [
            (MoeCodes::F16, MoeUnits::new(6, 3, MoeLoop::Slots)),
            (MoeCodes::F16, MoeUnits::new(3, 5, MoeLoop::Items)),
            (MoeCodes::F32, MoeUnits::new(1, 1, MoeLoop::Slots)),
        ] {
            let w = c.weights_in(g, ExpertLayout::for_codes(codes));
            let lp = units.gate_up_loop();
            let gate_up_ranges = ops::moe_ranges(
                g.sms(),
                sh,
                units.gate_up,
                t,
                false,
                lp.slots(units.gate_up, hidden),
            )?;
            let mut outs = Vec::new();
            // On: down waits on its pair's gate_up count; ids: on gate_up's grid; then neither;
            // then on, gate_up normalising the residual; then down combining through its
            // mailbox, as the step does (on with the residual normalised by gate_up, and off).
            for (ready, await_units, self_norm, mail) in [
                (true, units.gate_up, false, false),
                (true, 0, false, false),
                (false, 0, false, false),
                (true, units.gate_up, true, false),
                (true, units.gate_up, true, true),
                (false, 0, false, true),
            ] {
                let ready = ready.then(|| ops::MoeWords {
                    ready: g.ptr(&dready),
                    done: g.ptr(&ddone),
                });
                let (mut norm, topk) = router_args(g, &dnw, &dh, &di, &dwt, &counters, k, ready);
                let gu_norm = self_norm.then_some(ops::InputNorm {
                    w: norm.w,
                    eps: norm.eps,
                });
                if self_norm {
                    norm.out = 0;
                }
                let (x, lg) = (g.ptr(&c.dx), g.ptr(&dl));
                ops::router(
                    g,
                    g.ptr(&drw),
                    None,
                    x,
                    lg,
                    e,
                    hidden,
                    t,
                    Some(norm),
                    topk,
                    true,
                )?;
                if ready.is_some() {
                    // Each pair's word holds its expert + 1 until down clears it.
                    let said = g.download(&dready)?;
                    let off = g
                        .download(&di)?
                        .iter()
                        .zip(&said)
                        .filter(|&(&i, &r)| i64::from(i) + 1 != i64::from(r))
                        .count();
                    res.push(check(
                        format!(
                            "router t={t} hidden {hidden} announces its {} experts",
                            t * k
                        ),
                        off as f64,
                        0.0,
                    ));
                }
                let dact = nan_f32(g, t * k * inter)?;
                let dpart = nan_f32(g, t * k * hidden)?;
                let dy = g.upload(&c.y0)?;
                let dctr = g.alloc::<u32>(ops::moe_counters(hidden, t))?;
                let h = if self_norm { x } else { g.ptr(&dh) };
                let (idx, act) = (g.ptr(&di), g.ptr(&dact));
                ops::moe_gate_up(
                    g,
                    &w,
                    sh,
                    codes,
                    h,
                    idx,
                    act,
                    t,
                    units.gate_up,
                    lp,
                    ready,
                    gu_norm,
                )?;
                ops::moe_down(
                    g,
                    &w,
                    sh,
                    codes,
                    idx,
                    g.ptr(&dwt),
                    act,
                    g.ptr(&dpart),
                    g.ptr(&dy),
                    t,
                    true,
                    units.down,
                    units.lp,
                    g.ptr(&dctr),
                    ready,
                    await_units,
                    mail.then(|| g.ptr(&dmail)),
                )?;
                if ready.is_some() {
                    // Each pair's count holds its gate_up blocks.
                    let want = gate_up_ranges as u32;
                    let done: Vec<u32> = g.download(&ddone)?;
                    let off = done[..t * k].iter().filter(|&&v| v != want).count();
                    res.push(check(
                        format!(
                            "moe t={t} hidden {hidden} gate_up units {}: counts per pair",
                            units.gate_up
                        ),
                        off as f64,
                        0.0,
                    ));
                }
                outs.push((g.download(&dact)?, g.download(&dy)?));
            }
            let unwritten = outs
                .iter()
                .flat_map(|(a, y)| a.iter().chain(y))
                .filter(|v| !v.is_finite())
                .count();
            let apart: f64 = outs[..2]
                .iter()
                .map(|(a, y)| bits_apart(a, &outs[2].0) + bits_apart(y, &outs[2].1))
                .sum();
            // The mailbox's combine against the count's, on the same inputs.
            let mail_apart = bits_apart(&outs[4].0, &outs[3].0)
                + bits_apart(&outs[4].1, &outs[3].1)
                + bits_apart(&outs[5].0, &outs[2].0)
                + bits_apart(&outs[5].1, &outs[2].1);
            let mail_left = g.download(&dmail)?.iter().filter(|&&v| v != 0).count();
            let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
            let self_norm_err =
                rel_err(&outs[3].0, &wide(&outs[2].0)).max(rel_err(&outs[3].1, &wide(&outs[2].1)));
            let label = format!(
                "moe {} units {}/{} loop {} t={t} hidden {hidden}",
                codes_name(codes),
                units.gate_up,
                units.down,
                units.lp.name()
            );
            if codes == MoeCodes::F16 {
                let name = format!("{} on {gate_up_ranges} gate_up ranges", units.lp.name());
                let (a, y) = outs[2].clone();
                f16_outs.push((name, a, y));
            }
            res.push(check(
                format!(
                    "{label}: with the router's announcements (down on the grid or on gate_up's \
                     count) bits apart from without"
                ),
                apart + unwritten as f64,
                0.0,
            ));
            res.push(check(
                format!(
                    "{label}: gate_up normalising the residual itself, apart from the router's copy"
                ),
                self_norm_err,
                1e-3,
            ));
            res.push(check(
                format!(
                    "{label}: down combining through its mailbox (with and without the \
                     announcements) bits apart from its count's combine"
                ),
                mail_apart,
                0.0,
            ));
            res.push(check(
                format!("{label}: down's mailbox words cleared"),
                mail_left as f64,
                0.0,
            ));
            let left = g.download(&dready)?.iter().filter(|&&v| v != 0).count();
            res.push(check(
                format!("{label}: announcements cleared by down"),
                left as f64,
                0.0,
            ));
        }
        // A row's sums do not depend on the warp that makes them: the `_slots` kernels on
        // their ranges (at one token on 132 SMs 66 a pair, the rows shared 5 or 6 units a warp)
        // against the items loop's fixed units.
        if let [(na, aa, ya), (nb, ab, yb)] = &f16_outs[..] {
            res.push(check(
                format!(
                    "moe bf16-f16dot t={t} hidden {hidden}: loop {na} bits apart from loop {nb}"
                ),
                bits_apart(aa, ab) + bits_apart(ya, yb),
                0.0,
            ));
        }
    }
    Ok(res)
}

/// Largest relative error of the decode MoE with coded activations against the unquantized
/// f64 reference (`--activation q8`, `fp8`, and bf16's fp16 dot): the coding error itself, a
/// sanity bound only (measured on these inputs: see
/// `quantized_moe_error_matches_the_selftest_bounds`).
pub fn act8_moe_bound(codes: MoeCodes) -> f64 {
    match codes {
        MoeCodes::F32 => 1e-5,
        MoeCodes::F16 => 4e-3,
        MoeCodes::Q8 => 5e-2,
        MoeCodes::Fp8 => 1.5e-1,
    }
}

/// Name of the activation codes in the checks' labels.
fn codes_name(codes: MoeCodes) -> &'static str {
    match codes {
        MoeCodes::F32 => "bf16",
        MoeCodes::F16 => "bf16-f16dot",
        MoeCodes::Q8 => "q8",
        MoeCodes::Fp8 => "fp8",
    }
}

/// The decode MoE with activations coded as `codes` (per group of 32 in the kernels) against
/// the f64 reference fed the host's coding of the same inputs (`quant`: bit-identical codes
/// and scales; for the fp16 dot also its fp16 sums per block, `quant::f16_row_dot`): gate_up's
/// SwiGLU outputs from the coded x, and the combined output from the coded SwiGLU outputs the
/// GPU produced. Both differ from the reference by fp32 summation order only (1e-5, as the
/// fp32 path). The error against the unquantized reference is checked against a loose bound
/// (the coding error).
fn check_moe_codes(g: &Gpu, c: &MoeCase, codes: MoeCodes, units: MoeUnits) -> Result<Vec<Check>> {
    Ok(moe_codes_run(g, c, codes, units)?.0)
}

/// The decode MoE of case `c` (its act and output, and how many slot counters it left
/// non-zero).
fn moe_run(
    g: &Gpu,
    c: &MoeCase,
    codes: MoeCodes,
    units: MoeUnits,
) -> Result<(Vec<f32>, Vec<f32>, usize)> {
    let MoeShape {
        hidden, inter, k, ..
    } = c.sh;
    let t = c.t;
    let dact = nan_f32(g, t * k * inter)?;
    let dpart = nan_f32(g, t * k * hidden)?;
    let dy = g.upload(&c.y0)?;
    let dctr = g.alloc::<u32>(ops::moe_counters(hidden, t))?;
    ops::moe(
        g,
        &c.weights_in(g, ExpertLayout::for_codes(codes)),
        c.sh,
        codes,
        g.ptr(&c.dx),
        g.ptr(&c.di),
        g.ptr(&c.dw),
        g.ptr(&dact),
        g.ptr(&dpart),
        g.ptr(&dy),
        t,
        true,
        units,
        g.ptr(&dctr),
    )?;
    let left = g.download(&dctr)?.iter().filter(|&&v| v != 0).count();
    Ok((g.download(&dact)?, g.download(&dy)?, left))
}

/// [`moe_run`]'s act and output.
fn moe_outputs(
    g: &Gpu,
    c: &MoeCase,
    codes: MoeCodes,
    units: MoeUnits,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let (act, y, _) = moe_run(g, c, codes, units)?;
    Ok((act, y))
}

/// [`check_moe_codes`]'s checks, and the MoE's outputs (act, y) for comparisons between loops.
fn moe_codes_run(
    g: &Gpu,
    c: &MoeCase,
    codes: MoeCodes,
    units: MoeUnits,
) -> Result<(Vec<Check>, Vec<f32>, Vec<f32>)> {
    let MoeShape {
        hidden, inter, k, ..
    } = c.sh;
    let t = c.t;
    let e = c.gu_bias.len() / (2 * inter);
    let (got_act, got_y, left) = moe_run(g, c, codes, units)?;
    let host = c.host();
    let (limit, alpha) = (f64::from(c.sh.limit), f64::from(c.sh.alpha));
    let (mut want_act, mut want_y) = (Vec::new(), Vec::new());
    for ti in 0..t {
        let xt = &c.x[ti * hidden..][..hidden];
        let xq = quant::dequantized_codes(xt, codes);
        let mut y: Vec<f64> = c.y0[ti * hidden..][..hidden]
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        for si in 0..k {
            let ex = c.idx[ti * k + si] as usize;
            want_act.extend(if codes == MoeCodes::F16 {
                r::expert_act_f16(&host, xt, ex, inter, limit, alpha)
            } else {
                r::expert_act(&host, &xq, ex, inter, limit, alpha)
            });
            let at = &got_act[(ti * k + si) * inter..][..inter];
            let down = if codes == MoeCodes::F16 {
                r::expert_down_f16(&host, at, ex, hidden)
            } else {
                r::expert_down(&host, &quant::dequantized_codes(at, codes), ex, hidden)
            };
            let w = f64::from(c.wts[ti * k + si]);
            for (yr, d) in y.iter_mut().zip(down) {
                *yr += w * d;
            }
        }
        want_y.extend(y);
    }
    let label = format!(
        "moe gemv act={} E={e} H={hidden} I={inter} k={k} t={t} units {}/{} loop {}",
        codes_name(codes),
        units.gate_up,
        units.down,
        units.lp.name()
    );
    let checks = vec![
        check(
            format!("{label}: gate_up+swiglu vs host-quantized x"),
            rel_err(&got_act, &want_act),
            1e-5,
        ),
        check(
            format!("{label}: output vs host-quantized act"),
            rel_err(&got_y, &want_y),
            1e-5,
        ),
        check(
            format!("{label}: output vs unquantized reference"),
            rel_err(&got_y, &c.want(&c.x, false)),
            act8_moe_bound(codes),
        ),
        check(
            format!("{label}: slot counters zero after"),
            left as f64,
            0.0,
        ),
    ];
    Ok((checks, got_act, got_y))
}

/// The grouped decode MoE (`MoeLoop::Grouped`, fp16 dot) where tokens share experts: against
/// the reference as [`check_moe_codes`], and bit-identical to the `_slots` kernels (the same
/// sums per pair) in act and output. Cases: 20 tokens over 8 experts (two token groups of the
/// grouping, 10 members an expert: more than one staging of MOE_GRP_NT), and a small shape.
fn check_moe_by_expert(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let mut res = Vec::new();
    let gpt = MoeShape {
        hidden: 2880,
        inter: 2880,
        k: 4,
        limit: 7.0,
        alpha: 1.702,
    };
    let small = MoeShape {
        hidden: 160,
        inter: 96,
        k: 2,
        limit: 7.0,
        alpha: 1.702,
    };
    let mut s2 = Seeds(s.0 ^ 0x0ac7_0009);
    for (sh, e, t) in [(gpt, 8usize, 20usize), (small, 4, 7)] {
        let k = sh.k;
        let c = MoeCase::new(g, &mut s2, e, sh, t, |_| {
            // Token ti takes experts ti, ti + 2, ... (mod e): distinct per token, shared
            // across tokens; weights that differ by slot.
            let idx = (0..t * k)
                .map(|p| ((p / k + 2 * (p % k)) % e) as i32)
                .collect();
            let wts = (0..t * k).map(|p| 0.1 + 0.05 * (p % k) as f32).collect();
            (idx, wts)
        })?;
        // The reference checks once (the host reference is slow on the gpt-oss shape), the
        // bit-for-bit comparison with the slots at every unit count.
        for (n, (gu, dn)) in [(3, 5), (8, 8), (1, 1)].into_iter().enumerate() {
            let grouped = MoeUnits::new(gu, dn, MoeLoop::Grouped);
            let (act, y) = if n == 0 {
                let (checks, act, y) = moe_codes_run(g, &c, MoeCodes::F16, grouped)?;
                res.extend(checks);
                (act, y)
            } else {
                moe_outputs(g, &c, MoeCodes::F16, grouped)?
            };
            let (act_s, y_s) =
                moe_outputs(g, &c, MoeCodes::F16, MoeUnits::new(gu, dn, MoeLoop::Slots))?;
            res.push(check(
                format!(
                    "moe grouped and slots bit-identical (act, output) H={} I={} k={k} t={t} \
                     E={e} units {gu}/{dn}",
                    sh.hidden, sh.inter
                ),
                bits_apart(&act, &act_s) + bits_apart(&y, &y_s),
                0.0,
            ));
            // What `Auto` runs where experts are shared: gate_up grouped, down on the slots.
            let auto = MoeUnits {
                gate_up_grouped: true,
                ..MoeUnits::new(gu, dn, MoeLoop::Auto)
            };
            let (act_a, y_a) = moe_outputs(g, &c, MoeCodes::F16, auto)?;
            res.push(check(
                format!(
                    "moe gate_up grouped + down slots bit-identical to slots H={} I={} k={k} \
                     t={t} E={e} units {gu}/{dn}",
                    sh.hidden, sh.inter
                ),
                bits_apart(&act_a, &act_s) + bits_apart(&y_a, &y_s),
                0.0,
            ));
        }
    }
    Ok(res)
}

/// Tensor-core GEMM against the f64 reference on bf16-rounded activations (what the MMA
/// multiplies), so only the fp32 accumulation order differs.
fn check_gemm(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let mut res = Vec::new();
    // (m, n, k, bias, accumulate): partial row and column tiles, one stage, many stages.
    for (m, n, k, bias, acc) in [
        (1, 5120, 2880, true, false),
        (70, 300, 32, true, true),
        (129, 2880, 4096, true, true),
        (64, 128, 2880, false, false),
        (200, 1000, 96, false, true),
    ] {
        let c = DenseCase::new(g, s, n, k, m, bias, acc)?;
        let want = c.want(&r::round_bf16(&c.x));
        // `gemm_bf16_tc` (no scratch), then `gemm_bf16_cp` on the activations rounded by
        // rows_bf16: the same products in the same order, so the same bits; then, where the
        // grid leaves SMs idle, `gemm_bf16_cp` with its K loop split.
        let xb = g.alloc::<u16>(m * k)?;
        let floats = ops::SPLIT_MAX * m * n;
        let part = nan_f32(g, floats)?;
        let splits = ops::split_count(
            n.div_ceil(128) * m.div_ceil(128),
            k / 32,
            g.sms(),
            m * n,
            floats,
        );
        let split = ops::SplitScratch {
            ptr: g.ptr(&part),
            floats,
        };
        let mut runs = vec![
            ("gemm_bf16_tc", None, None),
            ("gemm_bf16_cp", Some(g.ptr(&xb)), None),
        ];
        if splits > 1 {
            runs.push(("gemm_bf16_cp", Some(g.ptr(&xb)), Some(split)));
        }
        let mut outs = Vec::new();
        for (name, scratch, split) in runs {
            let dy = c.out(g)?;
            ops::dense_gemm(
                g,
                ops::DenseW::Bf16(g.ptr(&c.dw)),
                c.bias_ptr(g),
                g.ptr(&c.dx),
                g.ptr(&dy),
                m,
                n,
                k,
                acc,
                scratch,
                split,
            )?;
            let got = g.download(&dy)?;
            let how = match split {
                Some(_) => format!(" K in {splits} splits"),
                None => String::new(),
            };
            res.push(check(
                format!("{name} {m}x{n}x{k} bias={bias} acc={acc}{how}"),
                rel_err(&got, &want),
                1e-5,
            ));
            outs.push(got);
        }
        res.push(check(
            format!("gemm_bf16_cp {m}x{n}x{k} bit-identical to gemm_bf16_tc"),
            bits_apart(&outs[1], &outs[0]),
            0.0,
        ));
    }
    Ok(res)
}

/// Random inputs of a dense projection y[t] (+)= W x[t] + b (W bf16 [rows, cols]), on the host
/// and on the device.
struct DenseCase {
    w: Vec<u16>,
    b: Vec<u16>,
    x: Vec<f32>,
    y0: Vec<f32>,
    dw: cudarc::driver::CudaSlice<u16>,
    db: cudarc::driver::CudaSlice<u16>,
    dx: cudarc::driver::CudaSlice<f32>,
    cols: usize,
    bias: bool,
    acc: bool,
}

impl DenseCase {
    fn new(
        g: &Gpu,
        s: &mut Seeds,
        rows: usize,
        cols: usize,
        t: usize,
        bias: bool,
        acc: bool,
    ) -> Result<Self> {
        let w = bf16_vec(s.next(), rows * cols, 0.05, 0.0);
        let b = bf16_vec(s.next(), rows, 1.0, 0.0);
        let x = f32_vec(s.next(), cols * t, 2.0, 0.0);
        let y0 = f32_vec(s.next(), rows * t, 3.0, 0.0);
        Ok(Self {
            dw: g.upload(&w)?,
            db: g.upload(&b)?,
            dx: g.upload(&x)?,
            w,
            b,
            x,
            y0,
            cols,
            bias,
            acc,
        })
    }

    /// The output buffer: y0 when accumulating, else poisoned with NaN.
    fn out(&self, g: &Gpu) -> Result<cudarc::driver::CudaSlice<f32>> {
        if self.acc {
            g.upload(&self.y0)
        } else {
            nan_f32(g, self.y0.len())
        }
    }

    fn bias_ptr(&self, g: &Gpu) -> Option<u64> {
        self.bias.then(|| g.ptr(&self.db))
    }

    /// Quantize the case's weights with the host MXFP4 quantizer: their blocks and scales on
    /// the device; the reference ([`DenseCase::want`]) then multiplies dequant(quant(w)),
    /// exactly the values the MXFP4 kernels see.
    fn quantize_weights(
        &mut self,
        g: &Gpu,
    ) -> Result<(cudarc::driver::CudaSlice<u8>, cudarc::driver::CudaSlice<u8>)> {
        let w: Vec<half::bf16> = self.w.iter().map(|&b| half::bf16::from_bits(b)).collect();
        let (blocks, scales) = mxfp4::quantize_matrix("selftest weights", &w, self.cols)?;
        anyhow::ensure!(
            scales.iter().all(|&s| s <= ops::DENSE_MAX_SCALE),
            "selftest weights: a block scale above the dense MXFP4 kernels' 2^1"
        );
        self.w = mxfp4::fake_quantize("selftest weights", &w, self.cols)?
            .iter()
            .map(|v| v.to_bits())
            .collect();
        // In the layout the dense MXFP4 kernels read, as the loader leaves them.
        let db = g.upload(&blocks)?;
        ops::word_layout(g, &ops::BF16_WORDS, &[(g.ptr(&db), db.len())])?;
        Ok((db, g.upload(&scales)?))
    }

    /// The reference for input `x` (the case's x, or it as the kernel sees it).
    fn want(&self, x: &[f32]) -> Vec<f64> {
        r::gemv(
            &self.w,
            self.bias.then_some(self.b.as_slice()),
            x,
            self.acc.then_some(self.y0.as_slice()),
            self.cols,
        )
    }
}

/// One layer's random MXFP4 experts, routing and residual input, on the host and the device.
/// A routing of `t` tokens to k consecutive (so distinct) experts of `e`, skewed so that one
/// expert takes most tokens: a token starts at a random expert one time in `every`, else at
/// expert `usual`; weights cycle through five values.
fn skewed_routing(
    s: &mut Seeds,
    t: usize,
    e: usize,
    k: usize,
    every: u64,
    usual: usize,
) -> (Vec<i32>, Vec<f32>) {
    let mut idx = Vec::with_capacity(t * k);
    for _ in 0..t {
        let first = if s.next().is_multiple_of(every) {
            s.next() as usize % e
        } else {
            usual % e
        };
        idx.extend((0..k).map(|j| ((first + j) % e) as i32));
    }
    let wts = (0..t * k).map(|i| 0.1 + (i % 5) as f32 * 0.07).collect();
    (idx, wts)
}

struct MoeCase {
    sh: MoeShape,
    t: usize,
    gu_blocks: Vec<u8>,
    gu_scales: Vec<u8>,
    gu_bias: Vec<u16>,
    dn_blocks: Vec<u8>,
    dn_scales: Vec<u8>,
    dn_bias: Vec<u16>,
    x: Vec<f32>,
    idx: Vec<i32>,
    wts: Vec<f32>,
    y0: Vec<f32>,
    dev: Vec<cudarc::driver::CudaSlice<u8>>,
    /// gate_up and down blocks again in the fp16 layout (the fp16-dot kernels read only it).
    dev_f16: Vec<cudarc::driver::CudaSlice<u8>>,
    dev_bias: Vec<cudarc::driver::CudaSlice<u16>>,
    dx: cudarc::driver::CudaSlice<f32>,
    di: cudarc::driver::CudaSlice<i32>,
    dw: cudarc::driver::CudaSlice<f32>,
}

impl MoeCase {
    /// `e` experts; `route` gives the routing (idx, wts) of `t` tokens from the seeds.
    fn new(
        g: &Gpu,
        s: &mut Seeds,
        e: usize,
        sh: MoeShape,
        t: usize,
        route: impl FnOnce(&mut Seeds) -> (Vec<i32>, Vec<f32>),
    ) -> Result<Self> {
        let (hidden, inter) = (sh.hidden, sh.inter);
        let gu_rows = e * 2 * inter;
        let dn_rows = e * hidden;
        let gu_blocks = u8_vec(s.next(), gu_rows * hidden / 2, 0, 255);
        let gu_scales = u8_vec(s.next(), gu_rows * hidden / 32, 119, 126);
        let gu_bias = bf16_vec(s.next(), gu_rows, 1.0, 0.0);
        let dn_blocks = u8_vec(s.next(), dn_rows * inter / 2, 0, 255);
        let dn_scales = u8_vec(s.next(), dn_rows * inter / 32, 119, 126);
        let dn_bias = bf16_vec(s.next(), dn_rows, 1.0, 0.0);
        let x = f32_vec(s.next(), hidden * t, 1.0, 0.0);
        let (idx, wts) = route(s);
        let y0 = f32_vec(s.next(), hidden * t, 10.0, 0.0);
        let mut dev = Vec::new();
        for v in [&gu_blocks, &gu_scales, &dn_blocks, &dn_scales] {
            dev.push(g.upload(v)?);
        }
        let dev_f16 = vec![g.upload(&gu_blocks)?, g.upload(&dn_blocks)?];
        let regions: Vec<(u64, usize)> = dev_f16.iter().map(|d| (g.ptr(d), d.len())).collect();
        ops::word_layout(g, &ops::F16_WORDS, &regions)?;
        Ok(Self {
            dev_f16,
            dev_bias: vec![g.upload(&gu_bias)?, g.upload(&dn_bias)?],
            dx: g.upload(&x)?,
            di: g.upload(&idx)?,
            dw: g.upload(&wts)?,
            dev,
            sh,
            t,
            gu_blocks,
            gu_scales,
            gu_bias,
            dn_blocks,
            dn_scales,
            dn_bias,
            x,
            idx,
            wts,
            y0,
        })
    }

    fn weights(&self, g: &Gpu) -> MoeWeights {
        self.weights_in(g, ExpertLayout::Standard)
    }

    /// The experts in `layout`.
    fn weights_in(&self, g: &Gpu, layout: ExpertLayout) -> MoeWeights {
        let (gu, dn) = match layout {
            ExpertLayout::Standard => (&self.dev[0], &self.dev[2]),
            ExpertLayout::F16 => (&self.dev_f16[0], &self.dev_f16[1]),
        };
        MoeWeights {
            layout,
            gu_blocks: g.ptr(gu),
            gu_scales: g.ptr(&self.dev[1]),
            gu_bias: g.ptr(&self.dev_bias[0]),
            dn_blocks: g.ptr(dn),
            dn_scales: g.ptr(&self.dev[3]),
            dn_bias: g.ptr(&self.dev_bias[1]),
        }
    }

    /// The experts as the reference takes them.
    fn host(&self) -> r::MoeHost<'_> {
        r::MoeHost {
            gu_blocks: &self.gu_blocks,
            gu_scales: &self.gu_scales,
            gu_bias: &self.gu_bias,
            dn_blocks: &self.dn_blocks,
            dn_scales: &self.dn_scales,
            dn_bias: &self.dn_bias,
        }
    }

    /// y0 + the MoE of input `x` per token (with `act_bf16` the SwiGLU output rounded to bf16,
    /// as the tensor-core path feeds it on).
    fn want(&self, x: &[f32], act_bf16: bool) -> Vec<f64> {
        let keep = |_: &mut [f64]| {};
        self.want_with(x, if act_bf16 { &r::round_act_bf16 } else { &keep })
    }

    /// y0 + the MoE of input `x` per token, each SwiGLU output row passed through `act_round`.
    fn want_with(&self, x: &[f32], act_round: &dyn Fn(&mut [f64])) -> Vec<f64> {
        let (hidden, k) = (self.sh.hidden, self.sh.k);
        let host = self.host();
        let mut want = Vec::new();
        for ti in 0..self.t {
            let ex: Vec<usize> = self.idx[ti * k..][..k]
                .iter()
                .map(|&i| i as usize)
                .collect();
            let ww: Vec<f64> = self.wts[ti * k..][..k]
                .iter()
                .map(|&v| f64::from(v))
                .collect();
            let y = r::moe_with(
                &host,
                &x[ti * hidden..][..hidden],
                &ex,
                &ww,
                self.sh.inter,
                f64::from(self.sh.limit),
                f64::from(self.sh.alpha),
                act_round,
            );
            want.extend(
                y.iter()
                    .zip(&self.y0[ti * hidden..][..hidden])
                    .map(|(a, b)| a + f64::from(*b)),
            );
        }
        want
    }
}

/// Grouped MoE (expert grouping, tensor-core gate_up + SwiGLU, down, slot combine) against
/// the f64 reference with the activations the MMAs see rounded to bf16, for token counts that
/// leave experts empty, fill several tiles of one expert, and end mid-tile; on the 32-row
/// (what `auto` picks for few entries an expert), 64-row and 128-row tiles.
fn check_moe_grouped(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let mut res = Vec::new();
    // The last two shapes have odd block counts (K of 5 blocks: half a register-B stage) and
    // rows that are no multiple of 64 (the bf16 rows' zero padding). 20 tokens over 64
    // experts: a pass of few entries an expert (a cached turn's), which `auto` runs on
    // 32-row tiles.
    for (e, hidden, inter, k, t) in [
        (8usize, 256usize, 192usize, 4usize, 3usize),
        (64, 576, 320, 4, 20),
        (6, 2880, 2880, 4, 37),
        (4, 320, 160, 2, 150),
        (5, 160, 96, 2, 70),
    ] {
        let sh = MoeShape {
            hidden,
            inter,
            k,
            limit: 7.0,
            alpha: 1.702,
        };
        let c = MoeCase::new(g, s, e, sh, t, |s| skewed_routing(s, t, e, k, 4, 1))?;
        let want = c.want(&r::round_bf16(&c.x), true);
        let mut by_tile = Vec::new();
        // Every tile and both tile kernels on the same inputs; the 64-row register-B check
        // keeps the old name.
        for (kernels, layout) in [
            (ops::GroupedKernels::Registers, ExpertLayout::Standard),
            (ops::GroupedKernels::Shared, ExpertLayout::Standard),
            (ops::GroupedKernels::Registers, ExpertLayout::F16),
            (ops::GroupedKernels::Shared, ExpertLayout::F16),
        ] {
            for tile in [
                MoeTile::T64x128,
                MoeTile::T128x128,
                MoeTile::Auto,
                MoeTile::T32x128,
            ] {
                let perm = g.alloc::<i32>(t * k)?;
                let tiles = g.alloc::<i32>(3 * ops::moe_max_tiles(t * k, e, tile))?;
                let ntiles = g.alloc::<i32>(1)?;
                let groups = ops::MoeGroups {
                    perm: g.ptr(&perm),
                    tiles: g.ptr(&tiles),
                    ntiles: g.ptr(&ntiles),
                    kernels,
                };
                let dact = nan_f32(g, t * k * inter)?;
                let dpart = nan_f32(g, t * k * hidden)?;
                let dy = g.upload(&c.y0)?;
                ops::moe_grouped(
                    g,
                    &c.weights_in(g, layout),
                    sh,
                    tile,
                    e,
                    g.ptr(&c.dx),
                    g.ptr(&c.di),
                    g.ptr(&c.dw),
                    &groups,
                    g.ptr(&dact),
                    g.ptr(&dpart),
                    g.ptr(&dy),
                    t,
                    true,
                )?;
                let tile_label = match tile {
                    MoeTile::T64x128 => String::new(),
                    MoeTile::T128x128 | MoeTile::T32x128 => format!(" tile={}", tile.name()),
                    MoeTile::Auto => format!(" tile=auto ({})", tile.for_pass(t * k, e).name()),
                };
                let kernel_label = match kernels {
                    ops::GroupedKernels::Registers => "",
                    ops::GroupedKernels::Shared => " smem-B",
                };
                let layout_label = match layout {
                    ExpertLayout::Standard => "",
                    ExpertLayout::F16 => " fp16-layout",
                };
                // The SwiGLU output is rounded to bf16 on both sides, but from fp32 (GPU) vs
                // f64 (reference) sums: a value near a rounding boundary may land one bf16 ulp
                // apart.
                let got = g.download(&dy)?;
                res.push(check(
                    format!(
                        "moe grouped mxfp4 mma{tile_label}{kernel_label}{layout_label} E={e} H={hidden} I={inter} k={k} t={t}"
                    ),
                    rel_err(&got, &want),
                    1e-3,
                ));
                by_tile.push((kernels, layout, tile, got));
            }
        }
        // Every register-B tile height sums each entry in the same order: the same bits, so a
        // prompt's MoE does not depend on which tile its pass picks; nor on the experts' layout
        // (both tile kernels decode either to the same bf16 values).
        let regs = ops::GroupedKernels::Registers;
        if let Some((.., base)) = by_tile.iter().find(|(k, l, t, _)| {
            *k == regs && *l == ExpertLayout::Standard && *t == MoeTile::T64x128
        }) {
            let worst = by_tile
                .iter()
                .filter(|(k, ..)| *k == regs)
                .map(|(.., y)| bits_apart(y, base))
                .fold(0.0, f64::max);
            res.push(check(
                format!(
                    "moe grouped register-B tiles 32/64/128/auto, both expert layouts, \
                     bit-identical E={e} H={hidden} I={inter} k={k} t={t}"
                ),
                worst,
                0.0,
            ));
        }
        let smem = ops::GroupedKernels::Shared;
        let worst = by_tile
            .iter()
            .filter(|(k, l, ..)| *k == smem && *l == ExpertLayout::F16)
            .filter_map(|(_, _, tile, y)| {
                by_tile
                    .iter()
                    .find(|(k, l, t, _)| *k == smem && *l == ExpertLayout::Standard && t == tile)
                    .map(|(.., base)| bits_apart(y, base))
            })
            .fold(0.0, f64::max);
        res.push(check(
            format!(
                "moe grouped smem-B tiles fp16 layout bit-identical to standard E={e} \
                 H={hidden} I={inter} k={k} t={t}"
            ),
            worst,
            0.0,
        ));
    }
    Ok(res)
}

/// The word layouts (the experts' fp16 one, the dense matrices' bf16 one): the device's
/// transform of random words equals the host's (`ops::word_layout_encode`), and the host's
/// decode of the result gives every element's pair (`WordLayout::pairs_of_standard`), so the
/// kernels' `fp4l_to_f16x2` and `fp4b_to_bf16x2` (the same rotations) read back what the
/// checkpoint or the quantizer holds.
fn check_word_layouts(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let words: Vec<u32> = u8_vec(s.next(), 4 * 4099, 0, 255)
        .chunks(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .chain([0, u32::MAX, 0x8888_8888, 0x7777_7777])
        .collect();
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut out = Vec::new();
    for layout in [ops::F16_WORDS, ops::BF16_WORDS] {
        let d = g.upload(&bytes)?;
        ops::word_layout(g, &layout, &[(g.ptr(&d), d.len())])?;
        let got: Vec<u32> = g
            .download(&d)?
            .chunks(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let masks = layout.masks()?;
        let host_apart = got
            .iter()
            .zip(&words)
            .filter(|(gw, w)| **gw != ops::word_layout_encode(&masks, **w))
            .count();
        let decode_apart = got
            .iter()
            .zip(&words)
            .filter(|(gw, w)| layout.decode(**gw) != layout.pairs_of_standard(**w))
            .count();
        out.push(check(
            format!(
                "{} word layout: device transform = host, {} words",
                layout.name,
                words.len()
            ),
            host_apart as f64,
            0.0,
        ));
        out.push(check(
            format!(
                "{} word layout: decodes to every element's pair",
                layout.name
            ),
            decode_apart as f64,
            0.0,
        ));
    }
    Ok(out)
}

fn check_argmax(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let (vocab, t) = (201_088usize, 3usize);
    let mut logits = f32_vec(s.next(), vocab * t, 20.0, 0.0);
    // Row 1: a tie across chunks (lower index wins); row 2: NaN entries must never win.
    logits[vocab + 150_000] = 50.0;
    logits[vocab + 70_000] = 50.0;
    logits[2 * vocab + 5] = f32::NAN;
    logits[2 * vocab + 100_000] = f32::NAN;
    let chunks = vocab.div_ceil(ops::ARGMAX_CHUNK);
    let dl = g.upload(&logits)?;
    let (pv, pi) = (g.alloc::<f32>(chunks * t)?, g.alloc::<i32>(chunks * t)?);
    let dout = g.upload(&vec![u32::MAX; t])?;
    ops::argmax(
        g,
        g.ptr(&dl),
        g.ptr(&pv),
        g.ptr(&pi),
        g.ptr(&dout),
        vocab,
        t,
    )?;
    let got = g.download(&dout)?;
    let mism = (0..t)
        .filter(|&ti| got[ti] as usize != r::argmax(&logits[ti * vocab..][..vocab]))
        .count();
    Ok(vec![check(
        "argmax 201088 (tie, NaN rows)",
        mism as f64,
        0.0,
    )])
}

/// One row of the sampling check: parameters, banned ids and the uniform number.
#[derive(Debug, Clone)]
pub struct SampleCase {
    pub params: SamplingParams,
    pub banned: Vec<u32>,
    pub u: f64,
}

/// Host and device sum masses in different orders, so they may pick different tokens when
/// the draw lies this close (relative to the kept mass) to a boundary; such cases are skipped.
pub const SAMPLE_MARGIN: f64 = 1e-5;

/// Uniform number in [0, 1) from 53 bits of a seed stream.
fn unit_f64(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// `rows` rows of `vocab` logits shaped like a language model's (noise plus a few dominant
/// tokens), with ties (quantised rows, a tie at the top), NaN (also at the top) and -inf
/// entries, and one parameter combination per row (greedy, temperature, top-k, top-p,
/// banned ids incl. the top token, logprob).
pub fn sampling_cases(seed: u64, vocab: usize, rows: usize) -> (Vec<f32>, Vec<SampleCase>) {
    let mut s = Seeds(seed);
    let pick = |x: u64, n: usize| (x % n as u64) as usize;
    let mut logits = Vec::with_capacity(vocab * rows);
    let mut cases = Vec::with_capacity(rows);
    for r in 0..rows {
        let mut row = f32_vec(s.next(), vocab, 4.0, 0.0);
        for _ in 0..1 + pick(s.next(), 24) {
            let i = pick(s.next(), vocab);
            row[i] = 12.0 + pick(s.next(), 1000) as f32 / 100.0;
        }
        let top = r::argmax(&row);
        match r % 4 {
            1 => row.iter_mut().for_each(|v| *v = (*v * 2.0).round() / 2.0),
            2 => {
                row[top] = f32::NAN;
                for _ in 0..3 {
                    row[pick(s.next(), vocab)] = f32::NAN;
                    row[pick(s.next(), vocab)] = f32::NEG_INFINITY;
                }
            }
            3 => {
                let other = pick(s.next(), vocab);
                row[other] = row[top];
            }
            _ => {}
        }
        let temps = [0.0, 0.3, 0.7, 1.0, 1.5];
        let top_ks = [0, 0, 1, 2, 7, 50, vocab + 3];
        let top_ps = [1.0, 1.0, 0.95, 0.6, 0.2];
        let params = SamplingParams {
            temperature: temps[pick(s.next(), temps.len())],
            top_k: top_ks[pick(s.next(), top_ks.len())],
            top_p: top_ps[pick(s.next(), top_ps.len())],
            logprobs: s.next().is_multiple_of(2).then_some(0),
            ..Default::default()
        };
        let mut banned = if s.next().is_multiple_of(3) {
            let mut b = vec![r::argmax(&row) as u32];
            b.extend((0..pick(s.next(), 4)).map(|_| pick(s.next(), vocab) as u32));
            b
        } else {
            Vec::new()
        };
        // Every sixth row a plain request (the default: no top-k, top-p, logprob or ban),
        // which the device samples on many blocks (`ops::sample_plain`); the draws above are
        // made all the same, so the other rows keep their requests.
        let mut params = params;
        if r % 6 == 5 {
            params.top_k = 0;
            params.top_p = 1.0;
            params.logprobs = None;
            banned.clear();
        }
        logits.extend(row);
        cases.push(SampleCase {
            params,
            banned,
            u: unit_f64(s.next()),
        });
    }
    (logits, cases)
}

fn check_sampling(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let mut res = Vec::new();
    for vocab in [1000usize, 4097, 50_001, 201_088] {
        let rows = 48;
        let (logits, cases) = sampling_cases(s.next(), vocab, rows);
        // Requests in reverse, so a block's index is neither its logit row nor its out row.
        let (mut reqs, mut banned) = (Vec::new(), Vec::new());
        for (i, c) in cases.iter().enumerate().rev() {
            reqs.push(ops::SampleRow {
                u: c.u,
                temperature: c.params.temperature,
                top_p: c.params.top_p,
                top_k: c.params.top_k,
                greedy: c.params.is_greedy(),
                logprob: c.params.logprobs.is_some(),
                ban_off: banned.len(),
                ban_n: c.banned.len(),
                logit_row: i,
                out_row: i,
            });
            banned.extend_from_slice(&c.banned);
        }
        banned.push(u32::MAX);
        // The plain rows on many blocks a row, the rest on one, as the backend splits them.
        let (plain, other): (Vec<_>, Vec<_>) = reqs.iter().partition(|r| r.is_plain());
        let dl = g.upload(&logits)?;
        let dp = g.upload(&ops::SampleRow::encode(&plain)?)?;
        let dr = g.upload(&ops::SampleRow::encode(&other)?)?;
        let db = g.upload(&banned)?;
        let dparts = g.alloc::<u8>(ops::sample_plain_scratch(vocab, plain.len()).max(1))?;
        let dout = g.upload(&vec![u32::MAX; 2 * rows])?;
        ops::sample_plain(
            g,
            g.ptr(&dl),
            vocab,
            g.ptr(&dp),
            plain.len(),
            g.ptr(&dparts),
            g.ptr(&dout),
        )?;
        ops::sample(
            g,
            g.ptr(&dl),
            vocab,
            g.ptr(&dr),
            other.len(),
            g.ptr(&db),
            g.ptr(&dout),
        )?;
        let out = g.download(&dout)?;
        let (mut compared, mut skipped, mut mism, mut bad) = (0usize, 0usize, 0usize, 0usize);
        let mut lp_err = 0.0f64;
        for (i, c) in cases.iter().enumerate() {
            let row = &logits[i * vocab..][..vocab];
            let tok = out[2 * i] as usize;
            if tok >= vocab || row[tok].is_nan() || c.banned.contains(&(tok as u32)) {
                bad += 1;
                continue;
            }
            if sampling::draw_margin(row, &c.banned, &c.params, c.u) < SAMPLE_MARGIN {
                skipped += 1;
            } else {
                compared += 1;
                if sampling::choose(row, &c.banned, &c.params, c.u) != tok {
                    mism += 1;
                }
            }
            if c.params.logprobs.is_some() {
                let want = row[tok] - sampling::log_sum_exp(row);
                let got = f32::from_bits(out[2 * i + 1]);
                let e = f64::from((got - want).abs());
                lp_err = lp_err.max(if e.is_nan() { f64::INFINITY } else { e });
            }
        }
        res.push(check(
            format!(
                "sample_rows + sample_plain V={vocab}: tokens vs host ({compared} of {rows} \
                 compared, {} plain rows)",
                plain.len()
            ),
            mism as f64,
            0.0,
        ));
        res.push(check(
            format!("sample_rows V={vocab}: NaN, banned or out-of-range picks"),
            bad as f64,
            0.0,
        ));
        res.push(check(
            format!("sample_rows V={vocab}: chosen logprob abs error"),
            lp_err,
            1e-4,
        ));
        res.push(check(
            format!("sample_rows V={vocab}: share skipped within {SAMPLE_MARGIN:e} of a boundary"),
            skipped as f64 / rows as f64,
            0.5,
        ));
    }
    Ok(res)
}

fn check_synthetic(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let n = 1_000_003;
    let (sb, su) = (s.next(), s.next());
    let db = g.upload(&vec![0u16; n])?;
    let du = g.upload(&vec![0u8; n])?;
    ops::fill_bf16(g, g.ptr(&db), n, sb, 0.02, 0.5)?;
    ops::fill_u8(g, g.ptr(&du), n, su, 119, 126)?;
    let (gb, gu) = (g.download(&db)?, g.download(&du)?);
    let mb = bf16_vec(sb, n, 0.02, 0.5)
        .iter()
        .zip(&gb)
        .filter(|(a, b)| a != b)
        .count();
    let mu = u8_vec(su, n, 119, 126)
        .iter()
        .zip(&gu)
        .filter(|(a, b)| a != b)
        .count();
    Ok(vec![
        check("fill_bf16 bit-exact vs host", mb as f64, 0.0),
        check("fill_u8 bit-exact vs host", mu as f64, 0.0),
    ])
}

/// bf16 test values for the MXFP4 quantizer, block by block from `seed`: ordinary blocks of
/// random magnitude, all-zero blocks (±0), huge blocks (near the bf16 maximum), tiny ones
/// (subnormal scale 2^-127), blocks of exact grid values and midpoints under a pinned scale
/// (ties), and with `nonfinite` NaN/±inf sprinkled in; also their number.
pub fn mxfp4_quantizer_inputs(seed: u64, n: usize, nonfinite: bool) -> (Vec<half::bf16>, u32) {
    use crate::engine::synthetic::{element_hash, unit};
    const GRID: [f32; 14] = [
        0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
    ];
    let mut out = Vec::with_capacity(n);
    let mut bad = 0u32;
    for b in 0..(n / 32) as u64 {
        let h = element_hash(seed, b);
        let kind = h % 8;
        let e = ((h >> 8) % 21) as i32 - 10;
        let m = ((h >> 16) % 61) as i32 - 30;
        for i in 0..32u64 {
            let r = element_hash(seed ^ 0x9e37, b * 32 + i);
            let u = 2.0 * unit(r) - 1.0;
            let sign = if r >> 63 == 1 { -1.0 } else { 1.0 };
            let v = match kind {
                0 => sign * 0.0,
                1 => u * 1.9 * 2f32.powi(127),
                2 => u * 2f32.powi(-126),
                3 if i == 0 => 6.0 * 2f32.powi(e),
                3 => sign * GRID[((r >> 8) % GRID.len() as u64) as usize] * 2f32.powi(e),
                _ => u * 2f32.powi(m),
            };
            let v = if nonfinite && (r >> 20).is_multiple_of(64) {
                bad += 1;
                [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][((r >> 30) % 3) as usize]
            } else {
                v
            };
            out.push(half::bf16::from_f32(v));
        }
    }
    (out, bad)
}

/// The device quantizer (`mxfp4_quantize_bf16`) against the host's (`engine::mxfp4`) byte for
/// byte, outputs poisoned with 0xff first (scale byte 255 is never written), and its count of
/// non-finite inputs.
fn check_mxfp4_quantize(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let mut res = Vec::new();
    for (rows, cols, nonfinite) in [(517usize, 2880usize, false), (41, 96, true), (1, 32, false)] {
        let n = rows * cols;
        let (w, bad) = mxfp4_quantizer_inputs(s.next(), n, nonfinite);
        let (want_b, want_s) = mxfp4::quantize_matrix("selftest", &w, cols)?;
        let bits: Vec<u16> = w.iter().map(|v| v.to_bits()).collect();
        let dw = g.upload(&bits)?;
        let db = g.upload(&vec![0xffu8; n / 2])?;
        let ds = g.upload(&vec![0xffu8; n / 32])?;
        let dc = g.upload(&[0u32])?;
        ops::mxfp4_quantize(g, g.ptr(&dw), g.ptr(&db), g.ptr(&ds), n, g.ptr(&dc))?;
        let (gb, gs, gc) = (g.download(&db)?, g.download(&ds)?, g.download(&dc)?);
        let mism = gb.iter().zip(&want_b).filter(|(a, b)| a != b).count()
            + gs.iter().zip(&want_s).filter(|(a, b)| a != b).count();
        let kinds = if nonfinite {
            "zero/huge/tiny/tie blocks, NaN/inf"
        } else {
            "zero/huge/tiny/tie blocks"
        };
        res.push(check(
            format!("mxfp4_quantize_bf16 {rows}x{cols} bytes vs host ({kinds})"),
            mism as f64,
            0.0,
        ));
        res.push(check(
            format!("mxfp4_quantize_bf16 {rows}x{cols} non-finite count ({bad} planted)"),
            (f64::from(gc[0]) - f64::from(bad)).abs(),
            0.0,
        ));
    }
    res.extend(check_dense_load(g)?);
    Ok(res)
}

/// The loader's quantization of a dense matrix (`DenseWeight::quantize`): blocks in the bf16
/// word layout, equal to the host's quantizer then `ops::word_layout_encode`, scales as the
/// host's; a matrix with a weight beyond the layout's scales (20: scale 2^2) refused by name.
fn check_dense_load(g: &Gpu) -> Result<Vec<Check>> {
    use crate::engine::cuda::weights::DenseWeight;
    let (rows, cols) = (3usize, 96usize);
    let w: Vec<half::bf16> = (0..rows * cols)
        .map(|i| half::bf16::from_f32(((i * 37 % 101) as f32 - 50.0) * 0.24))
        .collect();
    let (want_b, want_s) = mxfp4::quantize_matrix("selftest", &w, cols)?;
    let masks = ops::BF16_WORDS.masks()?;
    let want_b: Vec<u8> = want_b
        .chunks(4)
        .flat_map(|b| {
            ops::word_layout_encode(&masks, u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .to_le_bytes()
        })
        .collect();
    let bits: Vec<u16> = w.iter().map(|v| v.to_bits()).collect();
    let mut dw = DenseWeight::Bf16(g.upload(&bits)?);
    dw.quantize(g, "selftest dense", cols)?;
    let mism = match &dw {
        DenseWeight::Mxfp4 { blocks, scales } => {
            let (gb, gs) = (g.download(blocks)?, g.download(scales)?);
            gb.iter().zip(&want_b).filter(|(a, b)| a != b).count()
                + gs.iter().zip(&want_s).filter(|(a, b)| a != b).count()
        }
        DenseWeight::Bf16(_) => rows * cols,
    };
    let mut big = bits.clone();
    big[cols + 5] = half::bf16::from_f32(20.0).to_bits();
    let mut dbig = DenseWeight::Bf16(g.upload(&big)?);
    let refused = match dbig.quantize(g, "selftest dense", cols) {
        Err(e) => {
            let e = e.to_string();
            e.contains("selftest dense") && e.contains("2^2") && !dbig.is_mxfp4()
        }
        Ok(()) => false,
    };
    Ok(vec![
        check(
            format!("dense MXFP4 load {rows}x{cols}: bf16-layout blocks and scales vs host"),
            mism as f64,
            0.0,
        ),
        check(
            "dense MXFP4 load: a weight of 20 (scale 2^2) refused by name",
            if refused { 0.0 } else { 1.0 },
            0.0,
        ),
    ])
}

/// The MXFP4 decode GEMV against the f64 reference on dequant(quant(w)) (the host quantizer):
/// 1, 3 and 5 tokens (5 = two weight passes), with and without bias, accumulate and the fused
/// RMSNorm (whose normalised input is checked too), rows not a multiple of the block's 8 and
/// rows shorter than one block per lane.
fn check_gemv_mxfp4(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let mut res = Vec::new();
    for (rows, cols, t, bias, acc, norm) in [
        (1001, 2880, 1, true, false, false),
        (517, 4096, 5, true, true, false),
        (37, 96, 3, false, false, false),
        (2051, 2880, 3, true, true, false),
        (3000, 2880, 3, true, false, true),
        (200, 2880, 1, true, false, true),
        (100, 4096, 5, false, false, true),
        (640, 2880, 5, true, true, true),
    ] {
        let mut c = DenseCase::new(g, s, rows, cols, t, bias, acc)?;
        let (db, ds) = c.quantize_weights(g)?;
        let dy = c.out(g)?;
        let nw = bf16_vec(s.next(), cols, 0.2, 1.0);
        let dnw = g.upload(&nw)?;
        let dh = nan_f32(g, cols * t)?;
        let nrm = norm.then(|| ops::Norm {
            w: g.ptr(&dnw),
            eps: 1e-5,
            out: g.ptr(&dh),
        });
        ops::gemv_mxfp4(
            g,
            g.ptr(&db),
            g.ptr(&ds),
            c.bias_ptr(g),
            g.ptr(&c.dx),
            g.ptr(&dy),
            rows,
            cols,
            t,
            acc,
            nrm,
        )?;
        let label = format!("gemv_mxfp4 {rows}x{cols} t={t} bias={bias} acc={acc} norm={norm}");
        res.extend(fp32_input_checks(
            g,
            &c,
            label,
            &dy,
            norm.then_some((&nw, &dh)),
        )?);
    }
    Ok(res)
}

/// Checks of a GEMV that multiplies the fp32 input as it is (or rmsnorm(x) · nw in fp32):
/// its output against the f64 reference, and with `norm` (the norm weight and the kernel's
/// normalised-input output) that output too.
fn fp32_input_checks(
    g: &Gpu,
    c: &DenseCase,
    label: String,
    dy: &cudarc::driver::CudaSlice<f32>,
    norm: Option<(&Vec<u16>, &cudarc::driver::CudaSlice<f32>)>,
) -> Result<Vec<Check>> {
    let Some((nw, dh)) = norm else {
        return Ok(vec![check(
            label,
            rel_err(&g.download(dy)?, &c.want(&c.x)),
            1e-5,
        )]);
    };
    let (_, want_h) = r::rmsnorm(&c.x, None, nw, 1e-5);
    let h32: Vec<f32> = want_h.iter().map(|&v| v as f32).collect();
    Ok(vec![
        check(
            label.clone(),
            rel_err(&g.download(dy)?, &c.want(&h32)),
            1e-5,
        ),
        check(
            format!("{label} normed input"),
            rel_err(&g.download(dh)?, &want_h),
            1e-5,
        ),
    ])
}

/// The tensor-core decode GEMV (bf16 and MXFP4 weights) against the f64 reference on what
/// its MMAs multiply: bf16(x · norm_w) (or bf16(x)) and the weights (MXFP4 dequantized,
/// exact in bf16), the norm's 1/rms (from the fp32 x) applied to the sums. Only the fp32
/// accumulation order differs. Shapes: one and two n8 token tiles, partial tiles of rows and
/// tokens, two token passes (t > 16), a last chunk of columns only partly inside the row, a
/// matrix long enough (rows from the device's SM count) that a grid of the resident slots
/// streams several row tiles a block (`ops::tc_gemv_plan`), at 1, 8 and 12 tokens, and short
/// plain ones whose K is split over two blocks (the o projection's MXFP4 shape among them), each
/// launched twice to see the split's counters left at zero; blocks of one and of two row
/// tiles (`ops::dense_gemv_tc`) in one, two and three passes, alone and with the split (bf16
/// up to 8 tokens unsplit on the entry without a norm, `_plain`: the o projection's shape at
/// 1, 3 and 8 tokens, 1001 rows at 5); and
/// the wide kernel of four row tiles and 16 tokens a pass (`ops::tc_gemv_wide_plan`, the
/// planner's pick at 9–16 tokens), with and without its K split, a norm's squares split too
/// where its normalised input is not written; and units of eight row tiles a block, one warp
/// a tile (`_r128`: a streamed matrix's, `ops::TcgStream`), streamed and not.
fn check_gemv_tc(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let mut res = Vec::new();
    // Four waves of up to 8 blocks an SM, and a partial last tile.
    let long = 16 * 4 * 8 * g.sms() + 7;
    // The last entry: the row tiles a block takes where it may take several (None: the
    // model's dispatch and the planner's choice).
    for (rows, cols, t, bias, acc, norm, tiles) in [
        (long, 256, 1, true, false, true, None),
        (long, 256, 8, false, true, false, None),
        (long, 256, 12, true, false, true, None),
        (5120, 2880, 1, true, false, true, None),
        (2880, 4096, 1, true, true, false, None),
        (2880, 4096, 3, true, true, false, None),
        (2880, 4096, 8, true, true, false, None),
        (1001, 2880, 5, true, false, false, None),
        (37, 96, 3, false, false, true, None),
        (3000, 2880, 16, true, false, true, None),
        (517, 4096, 12, true, true, false, None),
        (300, 2880, 20, true, true, true, None),
        (2051, 2880, 9, false, true, true, None),
        (3000, 2880, 16, true, false, true, Some(1)),
        (517, 4096, 12, true, true, false, Some(1)),
        (2051, 2880, 9, false, true, true, Some(1)),
        (37, 96, 3, false, false, true, Some(2)),
        (1001, 2880, 5, true, false, false, Some(2)),
        // The wide kernel (four row tiles a block, 16 tokens a pass, K split by the
        // planner); with a norm whose input is not written, its split too.
        (5120, 2880, 16, true, false, true, Some(4)),
        (2880, 4096, 16, true, true, false, Some(4)),
        (1001, 2880, 12, true, true, true, Some(4)),
        (37, 96, 9, false, false, true, Some(4)),
        // Units of eight row tiles, one warp a tile over all of K (`_r128`): streamed on the
        // slots (from 2 tokens for bf16, 1 for MXFP4), and a block a unit at one bf16 token.
        (long, 256, 1, true, false, true, Some(8)),
        (long, 1024, 3, false, true, true, Some(8)),
        (long, 256, 12, true, true, false, Some(8)),
        (1001, 2880, 5, true, false, false, Some(8)),
    ] {
        for fp4 in [false, true] {
            let mut c = DenseCase::new(g, s, rows, cols, t, bias, acc)?;
            let fp4_w = if fp4 {
                Some(c.quantize_weights(g)?)
            } else {
                None
            };
            let dy = c.out(g)?;
            let nw = bf16_vec(s.next(), cols, 0.2, 1.0);
            let dnw = g.upload(&nw)?;
            let dh = nan_f32(g, cols * t)?;
            // The wide cases leave the normalised input unwritten, as the decode's qkv does,
            // so that the norm's squares are split too.
            let wide = tiles == Some(4);
            let nrm = norm.then(|| ops::Norm {
                w: g.ptr(&dnw),
                eps: 1e-5,
                out: if wide { 0 } else { g.ptr(&dh) },
            });
            let format = if fp4 { "fp4" } else { "bf16" };
            let plan = ops::tc_gemv_launch_plan(g, format, rows, cols, t, nrm, tiles)?;
            anyhow::ensure!(
                !wide || plan.tiles_per_block == 4,
                "{format} {rows}x{cols} at {t} tokens: no wide plan fits ({plan:?})"
            );
            let w = match &fp4_w {
                Some((db, ds)) => ops::DenseW::Mxfp4 {
                    blocks: g.ptr(db),
                    scales: g.ptr(ds),
                },
                None => ops::DenseW::Bf16(g.ptr(&c.dw)),
            };
            // The model's dispatch, which takes the tensor-core kernel wherever it fits.
            anyhow::ensure!(
                ops::tc_gemv_fits(g, w, rows, cols, t),
                "{format} {rows}x{cols} at {t} tokens does not fit the tensor-core GEMV"
            );
            let launch = |y: u64| -> Result<()> {
                let (b, x) = (c.bias_ptr(g), g.ptr(&c.dx));
                match tiles {
                    None => ops::dense_gemv(
                        g,
                        crate::engine::cuda::gates::DecodeGemv::TensorCore,
                        w,
                        b,
                        x,
                        y,
                        rows,
                        cols,
                        t,
                        acc,
                        nrm,
                    ),
                    Some(_) => ops::dense_gemv_tc(g, w, b, x, y, rows, cols, t, acc, nrm, tiles),
                }
            };
            if plan.ksplit > 1 {
                // A launch before the checked one: its pairs must leave their counters at zero.
                let before = c.out(g)?;
                launch(g.ptr(&before))?;
            }
            launch(g.ptr(&dy))?;
            let ntiles = rows.div_ceil(16);
            let mut grid = Vec::new();
            if plan.grid_x * plan.tiles_per_block < ntiles {
                grid.push(format!(
                    "{} blocks streaming {ntiles} row tiles",
                    plan.grid_x
                ));
            }
            if plan.ksplit > 1 {
                grid.push(format!("K split over {} blocks", plan.ksplit));
            }
            if plan.tiles_per_block > 1 {
                grid.push(format!("{} row tiles a block", plan.tiles_per_block));
            }
            // The entry without a norm (ops::tc_gemv_entry), where the launch takes it.
            let entry = ops::tc_gemv_entry(g, format, &plan, cols, t, nrm)?;
            if entry.ends_with("_plain") {
                grid.push(entry.to_string());
            }
            let grid = if grid.is_empty() {
                String::new()
            } else {
                format!(" ({})", grid.join(", "))
            };
            let label = format!(
                "gemv_tc_{format} {rows}x{cols} t={t} bias={bias} acc={acc} norm={norm}{grid}"
            );
            // What the MMAs multiply, and the per-token factor applied to the sums.
            let (xb, scale): (Vec<f32>, Vec<f64>) = if norm {
                let xb =
                    c.x.chunks(cols)
                        .flat_map(|row| row.iter().zip(&nw).map(|(&v, &n)| v * r::bf(n) as f32))
                        .collect::<Vec<f32>>();
                let rs =
                    c.x.chunks(cols)
                        .map(|row| {
                            let ms = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>();
                            1.0 / (ms / cols as f64 + 1e-5).sqrt()
                        })
                        .collect();
                (r::round_bf16(&xb), rs)
            } else {
                (r::round_bf16(&c.x), vec![1.0; t])
            };
            let sums = r::gemv(&c.w, None, &xb, None, cols);
            let want: Vec<f64> = sums
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let (ti, row) = (i / rows, i % rows);
                    let mut o = v * scale[ti];
                    if bias {
                        o += r::bf(c.b[row]);
                    }
                    if acc {
                        o += f64::from(c.y0[i]);
                    }
                    o
                })
                .collect();
            res.push(check(
                label.clone(),
                rel_err(&g.download(&dy)?, &want),
                1e-5,
            ));
            if norm && !wide {
                let (_, want_h) = r::rmsnorm(&c.x, None, &nw, 1e-5);
                res.push(check(
                    format!("{label} normed input"),
                    rel_err(&g.download(&dh)?, &want_h),
                    1e-5,
                ));
            }
        }
    }
    Ok(res)
}

/// The tensor-core decode MoEs' cases (expert count, case): one token, 8 and 16 tokens (one
/// and two n8 tiles) with experts shared by many tokens, 20 and 37 tokens (token groups of 16,
/// the last partial), and k = 2 and 4.
fn moe_tc_cases(g: &Gpu, s: &mut Seeds) -> Result<Vec<(usize, MoeCase)>> {
    let mut cases = Vec::new();
    for (e, hidden, inter, k, t) in [
        (8usize, 256usize, 192usize, 4usize, 1usize),
        (6, 2880, 2880, 4, 8),
        (16, 2880, 2880, 4, 16),
        (8, 256, 192, 4, 20),
        (4, 320, 160, 2, 37),
    ] {
        let sh = MoeShape {
            hidden,
            inter,
            k,
            limit: 7.0,
            alpha: 1.702,
        };
        cases.push((
            e,
            MoeCase::new(g, s, e, sh, t, |s| skewed_routing(s, t, e, k, 3, 2))?,
        ));
    }
    Ok(cases)
}

/// The tensor-core decode MoE (in-kernel grouping by expert, gate_up + SwiGLU, down, slot
/// combine) against the f64 reference on bf16-rounded inputs and SwiGLU outputs (what its
/// MMAs multiply), on `moe_tc_cases`.
fn check_moe_tc(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let mut res = Vec::new();
    for (e, c) in moe_tc_cases(g, s)? {
        let (sh, t) = (c.sh, c.t);
        let (hidden, inter, k) = (sh.hidden, sh.inter, sh.k);
        let want = c.want(&r::round_bf16(&c.x), true);
        let dact = nan_f32(g, t * k * inter)?;
        let dpart = nan_f32(g, t * k * hidden)?;
        let dy = g.upload(&c.y0)?;
        let w = c.weights(g);
        ops::moe_gate_up_tc(g, &w, sh, e, g.ptr(&c.dx), g.ptr(&c.di), g.ptr(&dact), t)?;
        ops::moe_down_tc(
            g,
            &w,
            sh,
            e,
            g.ptr(&c.di),
            g.ptr(&c.dw),
            g.ptr(&dact),
            g.ptr(&dpart),
            g.ptr(&dy),
            t,
            true,
        )?;
        // As for the grouped MoE: the SwiGLU output is rounded to bf16 from fp32 (GPU) vs f64
        // (reference) sums, so a value near a rounding boundary may land one bf16 ulp apart.
        res.push(check(
            format!("moe tensor-core gemv E={e} H={hidden} I={inter} k={k} t={t}"),
            rel_err(&g.download(&dy)?, &want),
            1e-3,
        ));
    }
    Ok(res)
}

/// The fp16 tensor-core decode MoE (grouping by expert, gate_up + SwiGLU, down, the slot
/// combine of the last block) against the f64 reference on the values its MMAs multiply: each
/// token's input and each SwiGLU output row as fp16 of x / D (`round_f16_row`; the weights are
/// exact). On `moe_tc_cases`, at K splits 1 and 8 (and the batch's own), and the
/// combine's counters back at zero after every call.
fn check_moe_f16(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let mut res = Vec::new();
    for (e, c) in moe_tc_cases(g, s)? {
        let (sh, t) = (c.sh, c.t);
        let (hidden, inter, k) = (sh.hidden, sh.inter, sh.k);
        let xr: Vec<f32> = c.x.chunks(hidden).flat_map(r::round_f16_row).collect();
        let want = c.want_with(&xr, &r::round_act_f16);
        let auto = ops::MoeF16Split::for_batch(g.sms(), sh, e, t);
        let mut splits = vec![(1, 1), (8, 8), (auto.gate_up, auto.down)];
        splits.dedup();
        for (kg, kd) in splits {
            let dact = nan_f32(g, t * k * inter)?;
            let dpart = nan_f32(g, t * k * hidden)?;
            let dy = g.upload(&c.y0)?;
            let ctr = g.upload(&vec![0u32; ops::moe_counters(hidden, t)])?;
            let w = c.weights(g);
            ops::moe_gate_up_f16(
                g,
                &w,
                sh,
                e,
                g.ptr(&c.dx),
                g.ptr(&c.di),
                g.ptr(&dact),
                t,
                kg,
            )?;
            ops::moe_down_f16(
                g,
                &w,
                sh,
                e,
                g.ptr(&c.di),
                g.ptr(&c.dw),
                g.ptr(&dact),
                g.ptr(&dpart),
                g.ptr(&dy),
                t,
                true,
                kd,
                g.ptr(&ctr),
            )?;
            let label = format!(
                "moe fp16 tensor-core gemv E={e} H={hidden} I={inter} k={k} t={t} ks={kg}/{kd}"
            );
            // The SwiGLU outputs come from fp32 (GPU) vs f64 (reference) sums, so a value near
            // an fp16 rounding boundary may land one ulp apart: as the bf16 path's bound.
            res.push(check(
                label.clone(),
                rel_err(&g.download(&dy)?, &want),
                1e-3,
            ));
            let left = g.download(&ctr)?.iter().filter(|&&v| v != 0).count();
            res.push(check(
                format!("{label}: counters left non-zero"),
                left as f64,
                0.0,
            ));
        }
    }
    Ok(res)
}

/// The MXFP4 tensor-core GEMM against the f64 reference on dequant(quant(w)) and bf16-rounded
/// activations (what the MMA multiplies; the weights dequantize exactly to bf16), so only the
/// fp32 accumulation order differs: the shapes of `check_gemm`.
fn check_gemm_mxfp4(g: &Gpu, s: &mut Seeds) -> Result<Vec<Check>> {
    let mut res = Vec::new();
    for (m, n, k, bias, acc) in [
        (1, 5120, 2880, true, false),
        (70, 300, 32, true, true),
        (129, 2880, 4096, true, true),
        (64, 128, 2880, false, false),
        (200, 1000, 96, false, true),
    ] {
        let mut c = DenseCase::new(g, s, n, k, m, bias, acc)?;
        let (db, ds) = c.quantize_weights(g)?;
        let dy = c.out(g)?;
        ops::gemm_mxfp4(
            g,
            g.ptr(&db),
            g.ptr(&ds),
            c.bias_ptr(g),
            g.ptr(&c.dx),
            g.ptr(&dy),
            m,
            n,
            k,
            acc,
        )?;
        res.push(check(
            format!("gemm_mxfp4_tc {m}x{n}x{k} bias={bias} acc={acc}"),
            rel_err(&g.download(&dy)?, &c.want(&r::round_bf16(&c.x))),
            1e-5,
        ));
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quantization error the loose `act8_moe_bound` checks allow, measured on host data
    /// drawn as `MoeCase` draws it (both shapes of `check_moe`, the outlier groups included);
    /// the f64 reference stands in for the GPU, which differs from it by ~1e-6.
    #[test]
    fn quantized_moe_error_matches_the_selftest_bounds() {
        // (E, H, I, k, t, outliers). The gpt-oss shape only in release builds (slow in debug).
        let mut shapes = vec![(4usize, 160usize, 96usize, 2usize, 3usize, false)];
        if !cfg!(debug_assertions) || std::env::var_os("MXTUNE_TEST_BIG").is_some() {
            shapes.push((8, 2880, 2880, 4, 2, true));
        }
        for (e, h, i, k, t, outliers) in shapes {
            let mut s = Seeds(0x51ab ^ h as u64);
            let gu_blocks = u8_vec(s.next(), e * 2 * i * h / 2, 0, 255);
            let gu_scales = u8_vec(s.next(), e * 2 * i * h / 32, 119, 126);
            let gu_bias = bf16_vec(s.next(), e * 2 * i, 1.0, 0.0);
            let dn_blocks = u8_vec(s.next(), e * h * i / 2, 0, 255);
            let dn_scales = u8_vec(s.next(), e * h * i / 32, 119, 126);
            let dn_bias = bf16_vec(s.next(), e * h, 1.0, 0.0);
            let mut x = f32_vec(s.next(), h * t, 1.0, 0.0);
            let y0 = f32_vec(s.next(), h * t, 10.0, 0.0);
            if outliers {
                x[..32].fill(0.0);
                x[37] = 40.0;
            }
            let host = r::MoeHost {
                gu_blocks: &gu_blocks,
                gu_scales: &gu_scales,
                gu_bias: &gu_bias,
                dn_blocks: &dn_blocks,
                dn_scales: &dn_scales,
                dn_bias: &dn_bias,
            };
            for codes in [MoeCodes::Q8, MoeCodes::Fp8, MoeCodes::F16] {
                let (mut got, mut want) = (Vec::new(), Vec::new());
                for ti in 0..t {
                    let xt = &x[ti * h..][..h];
                    let x64: Vec<f64> = xt.iter().map(|&v| f64::from(v)).collect();
                    let xq = quant::dequantized_codes(xt, codes);
                    let mut yq: Vec<f64> =
                        y0[ti * h..][..h].iter().map(|&v| f64::from(v)).collect();
                    let mut yr = yq.clone();
                    for si in 0..k {
                        let ex = (ti + 3 * si) % e;
                        let w = 1.0 / k as f64;
                        let act = if codes == MoeCodes::F16 {
                            r::expert_act_f16(&host, xt, ex, i, 7.0, 1.702)
                        } else {
                            r::expert_act(&host, &xq, ex, i, 7.0, 1.702)
                        };
                        let a: Vec<f32> = act.iter().map(|&v| v as f32).collect();
                        let down = if codes == MoeCodes::F16 {
                            r::expert_down_f16(&host, &a, ex, h)
                        } else {
                            r::expert_down(&host, &quant::dequantized_codes(&a, codes), ex, h)
                        };
                        for (y, d) in yq.iter_mut().zip(down) {
                            *y += w * d;
                        }
                        let a = r::expert_act(&host, &x64, ex, i, 7.0, 1.702);
                        for (y, d) in yr.iter_mut().zip(r::expert_down(&host, &a, ex, h)) {
                            *y += w * d;
                        }
                    }
                    got.extend(yq.iter().map(|&v| v as f32));
                    want.extend(yr);
                }
                let err = rel_err(&got, &want);
                let name = codes_name(codes);
                println!("{name} H={h} I={i}: error vs unquantized {err:.3e}");
                assert!(err < act8_moe_bound(codes) / 2.0, "{name} H={h}: {err:.3e}");
            }
        }
    }

    /// The device check compares tokens only away from boundaries; its cases must leave most
    /// rows comparable, or the check would pass without testing anything.
    #[test]
    fn sampling_cases_are_mostly_away_from_boundaries() {
        for (vocab, rows) in [(1000, 48), (4097, 48), (201_088, 12)] {
            let (logits, cases) = sampling_cases(vocab as u64, vocab, rows);
            assert_eq!(logits.len(), vocab * rows);
            let skipped = cases
                .iter()
                .enumerate()
                .filter(|(i, c)| {
                    let row = &logits[i * vocab..][..vocab];
                    sampling::draw_margin(row, &c.banned, &c.params, c.u) < SAMPLE_MARGIN
                })
                .count();
            assert!(
                skipped * 4 <= rows,
                "V={vocab}: {skipped} of {rows} cases within the margin"
            );
            let plain = |c: &SampleCase| {
                c.params.top_k == 0
                    && c.params.top_p >= 1.0
                    && c.params.logprobs.is_none()
                    && c.banned.is_empty()
            };
            assert!(
                cases.iter().any(|c| plain(c) && !c.params.is_greedy()),
                "V={vocab}: no plain sampled row"
            );
            let greedy = cases.iter().filter(|c| c.params.is_greedy()).count();
            let nucleus = cases.iter().filter(|c| c.params.top_p < 1.0).count();
            let banned = cases.iter().filter(|c| !c.banned.is_empty()).count();
            assert!(
                greedy > 0 && nucleus > 0 && banned > 0,
                "V={vocab}: {cases:?}"
            );
        }
    }
}
