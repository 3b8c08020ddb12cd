//! Per-kernel CPU references in f64 (inputs as the GPU sees them: bf16 bits, fp32, MXFP4
//! bytes). The self-test compares every kernel with these on fresh random inputs. The larger
//! ones spread their output rows (or heads) over rayon's threads: each output is its own sum
//! in a fixed order, so the results do not depend on the thread count.

use rayon::prelude::*;

use super::quant::{self, e4m3_from_f32, e4m3_to_f32};

/// bf16 bits → f64.
pub fn bf(v: u16) -> f64 {
    f64::from(half::bf16::from_bits(v).to_f32())
}

/// f32 → bf16 bits (round to nearest even), as the kernels store K/V.
pub fn to_bf(v: f32) -> u16 {
    half::bf16::from_f32(v).to_bits()
}

/// `x` rounded to FP8 E4M3 and back (what an fp8 KV cache holds).
pub fn round_e4m3(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| e4m3_to_f32(e4m3_from_f32(v))).collect()
}

/// E2M1 values of the 16 nibbles.
pub const FP4: [f64; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Dequantise one MXFP4 row of `cols` elements (blocks of 16 bytes + one scale byte each).
pub fn mxfp4_row(blocks: &[u8], scales: &[u8], cols: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(cols);
    for b in 0..cols / 32 {
        let s = (f64::from(scales[b]) - 127.0).exp2();
        for j in 0..16 {
            let byte = blocks[b * 16 + j];
            out.push(FP4[(byte & 15) as usize] * s);
            out.push(FP4[(byte >> 4) as usize] * s);
        }
    }
    out
}

/// Embedding rows of `tokens`.
pub fn embed(table: &[u16], tokens: &[u32], hidden: usize) -> Vec<f64> {
    tokens
        .iter()
        .flat_map(|&t| {
            table[t as usize * hidden..][..hidden]
                .iter()
                .map(|&v| bf(v))
        })
        .collect()
}

/// RMSNorm of each row of `x` (+ `delta` first); returns (new x, y).
pub fn rmsnorm(x: &[f32], delta: Option<&[f32]>, w: &[u16], eps: f64) -> (Vec<f64>, Vec<f64>) {
    let n = w.len();
    let mut xs: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    if let Some(d) = delta {
        for (a, b) in xs.iter_mut().zip(d) {
            *a += f64::from(*b);
        }
    }
    let mut y = vec![0.0; xs.len()];
    for (row, yr) in xs.chunks(n).zip(y.chunks_mut(n)) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
        let r = 1.0 / (ms + eps).sqrt();
        for ((o, v), wv) in yr.iter_mut().zip(row).zip(w) {
            *o = v * r * bf(*wv);
        }
    }
    (xs, y)
}

/// y[t, r] = y0 + W[r] · x[t] + b[r] for `t = x.len() / cols` tokens.
pub fn gemv(
    w: &[u16],
    bias: Option<&[u16]>,
    x: &[f32],
    y0: Option<&[f32]>,
    cols: usize,
) -> Vec<f64> {
    let rows = w.len() / cols;
    let t = x.len() / cols;
    (0..rows * t)
        .into_par_iter()
        .map(|i| {
            let (ti, r) = (i / rows, i % rows);
            let xt = &x[ti * cols..][..cols];
            let wr = &w[r * cols..][..cols];
            let mut s: f64 = wr.iter().zip(xt).map(|(a, b)| bf(*a) * f64::from(*b)).sum();
            if let Some(b) = bias {
                s += bf(b[r]);
            }
            if let Some(y0) = y0 {
                s += f64::from(y0[i]);
            }
            s
        })
        .collect()
}

/// Rotate one head (rotate-half) at `pos`: θ in fp32 as the model defines it.
pub fn rope_head(x: &[f32], pos: u32, inv_freq: &[f32], mscale: f32) -> Vec<f64> {
    let half = x.len() / 2;
    let mut o = vec![0.0; x.len()];
    for i in 0..half {
        let theta = f64::from(pos as f32 * inv_freq[i]);
        let (c, s) = (
            theta.cos() * f64::from(mscale),
            theta.sin() * f64::from(mscale),
        );
        let (a, b) = (f64::from(x[i]), f64::from(x[i + half]));
        o[i] = a * c - b * s;
        o[i + half] = b * c + a * s;
    }
    o
}

/// One decode query against a KV cache region: keys [lo, pos], sinks in the denominator once.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k_cache: &[u16],
    v_cache: &[u16],
    pos: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    window: usize,
    sinks: Option<&[u16]>,
    scale: f64,
) -> Vec<f64> {
    let lo = if window > 0 {
        (pos + 1).saturating_sub(window)
    } else {
        0
    };
    let heads: Vec<Vec<f64>> = (0..hq)
        .into_par_iter()
        .map(|h| {
            let mut o = vec![0.0; d];
            let kvh = h / (hq / hkv);
            let qh = &q[h * d..][..d];
            let scores: Vec<f64> = (lo..=pos)
                .map(|j| {
                    let kr = &k_cache[(j * hkv + kvh) * d..][..d];
                    qh.iter()
                        .zip(kr)
                        .map(|(a, b)| f64::from(*a) * bf(*b))
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let sink = sinks.map(|s| bf(s[h]));
            let m = scores
                .iter()
                .copied()
                .chain(sink)
                .fold(f64::NEG_INFINITY, f64::max);
            let mut den = sink.map(|s| (s - m).exp()).unwrap_or(0.0);
            for (j, s) in (lo..=pos).zip(&scores) {
                let p = (s - m).exp();
                den += p;
                let vr = &v_cache[(j * hkv + kvh) * d..][..d];
                for (oi, v) in o.iter_mut().zip(vr) {
                    *oi += p * bf(*v);
                }
            }
            for oi in o.iter_mut() {
                *oi /= den;
            }
            o
        })
        .collect();
    heads.concat()
}

/// Top-k (ties: lower index) and softmax over those k.
pub fn router_topk(logits: &[f32], k: usize) -> (Vec<usize>, Vec<f64>) {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let top: Vec<usize> = order[..k].to_vec();
    let m = f64::from(logits[top[0]]);
    let e: Vec<f64> = top
        .iter()
        .map(|&i| (f64::from(logits[i]) - m).exp())
        .collect();
    let s: f64 = e.iter().sum();
    (top, e.iter().map(|v| v / s).collect())
}

/// The clamped SwiGLU of gpt-oss.
pub fn swiglu(gate: f64, lin: f64, limit: f64, alpha: f64) -> f64 {
    let g = gate.min(limit);
    let l = lin.clamp(-limit, limit);
    g / (1.0 + (-alpha * g).exp()) * (l + 1.0)
}

/// One layer's MXFP4 experts in checkpoint layout, host side.
pub struct MoeHost<'a> {
    /// gate_up blocks [E, 2I, H/32, 16].
    pub gu_blocks: &'a [u8],
    /// gate_up scales [E, 2I, H/32].
    pub gu_scales: &'a [u8],
    /// gate_up bias [E, 2I].
    pub gu_bias: &'a [u16],
    /// down blocks [E, H, I/32, 16].
    pub dn_blocks: &'a [u8],
    /// down scales [E, H, I/32].
    pub dn_scales: &'a [u8],
    /// down bias [E, H].
    pub dn_bias: &'a [u16],
}

/// The SwiGLU outputs swiglu(W1_e x + b1_e) of expert `e` for one token's input `x` (the
/// values the kernel multiplies, hence f64: a dequantized 8-bit activation need not fit f32).
pub fn expert_act(
    w: &MoeHost<'_>,
    x: &[f64],
    e: usize,
    inter: usize,
    limit: f64,
    alpha: f64,
) -> Vec<f64> {
    let h = x.len();
    expert_act_by(w, h, e, inter, limit, alpha, |b, s| {
        mxfp4_row(b, s, h).iter().zip(x).map(|(a, v)| a * v).sum()
    })
}

/// [`expert_act`] with the fp16 dot's sums ([`quant::f16_row_dot`]) of x's fp16 codes.
pub fn expert_act_f16(
    w: &MoeHost<'_>,
    x: &[f32],
    e: usize,
    inter: usize,
    limit: f64,
    alpha: f64,
) -> Vec<f64> {
    let (stored, codes) = quant::f16_groups(x);
    expert_act_by(w, x.len(), e, inter, limit, alpha, |b, s| {
        quant::f16_row_dot(b, s, &stored, &codes)
    })
}

/// swiglu(W1_e x + b1_e) with `dot(blocks, scales)` giving a gate_up row's dot with x (`h`
/// inputs).
fn expert_act_by(
    w: &MoeHost<'_>,
    h: usize,
    e: usize,
    inter: usize,
    limit: f64,
    alpha: f64,
    dot: impl Fn(&[u8], &[u8]) -> f64 + Sync,
) -> Vec<f64> {
    let nbh = h / 32;
    (0..inter)
        .into_par_iter()
        .map(|j| {
            let mut u = [0.0; 2];
            for (half, uv) in u.iter_mut().enumerate() {
                let r = e * 2 * inter + 2 * j + half;
                *uv = dot(&w.gu_blocks[r * nbh * 16..], &w.gu_scales[r * nbh..]) + bf(w.gu_bias[r]);
            }
            swiglu(u[0], u[1], limit, alpha)
        })
        .collect()
}

/// W2_e act + b2_e of expert `e` (`h` output rows) for one token's SwiGLU outputs `act`.
pub fn expert_down(w: &MoeHost<'_>, act: &[f64], e: usize, h: usize) -> Vec<f64> {
    let inter = act.len();
    expert_down_by(w, inter, e, h, |b, s| {
        mxfp4_row(b, s, inter)
            .iter()
            .zip(act)
            .map(|(a, v)| a * v)
            .sum()
    })
}

/// [`expert_down`] with the fp16 dot's sums of act's fp16 codes.
pub fn expert_down_f16(w: &MoeHost<'_>, act: &[f32], e: usize, h: usize) -> Vec<f64> {
    let (stored, codes) = quant::f16_groups(act);
    expert_down_by(w, act.len(), e, h, |b, s| {
        quant::f16_row_dot(b, s, &stored, &codes)
    })
}

/// W2_e act + b2_e with `dot(blocks, scales)` giving a down row's dot with act (`inter`
/// inputs).
fn expert_down_by(
    w: &MoeHost<'_>,
    inter: usize,
    e: usize,
    h: usize,
    dot: impl Fn(&[u8], &[u8]) -> f64 + Sync,
) -> Vec<f64> {
    let nbi = inter / 32;
    (0..h)
        .into_par_iter()
        .map(|r| {
            let row_i = e * h + r;
            dot(
                &w.dn_blocks[row_i * nbi * 16..],
                &w.dn_scales[row_i * nbi..],
            ) + bf(w.dn_bias[row_i])
        })
        .collect()
}

/// Σ_s w_s (W2_e swiglu(W1_e x + b1_e) + b2_e) for one token. With `act_bf16` the SwiGLU
/// output is rounded to bf16 before the down projection, as the tensor-core prefill path
/// feeds it to its MMA.
#[allow(clippy::too_many_arguments)]
pub fn moe(
    w: &MoeHost<'_>,
    x: &[f32],
    experts: &[usize],
    weights: &[f64],
    inter: usize,
    limit: f64,
    alpha: f64,
    act_bf16: bool,
) -> Vec<f64> {
    let keep = |_: &mut [f64]| {};
    let round: &dyn Fn(&mut [f64]) = if act_bf16 { &round_act_bf16 } else { &keep };
    moe_with(w, x, experts, weights, inter, limit, alpha, round)
}

/// A SwiGLU output row as the tensor-core prefill path feeds it on: bf16 of its f32 values.
pub fn round_act_bf16(act: &mut [f64]) {
    for a in act.iter_mut() {
        *a = bf(to_bf(*a as f32));
    }
}

/// A SwiGLU output row as the fp16 tensor-core MoE feeds it on: [`round_f16_row`] of its f32
/// values.
pub fn round_act_f16(act: &mut [f64]) {
    let a32: Vec<f32> = act.iter().map(|&v| v as f32).collect();
    for (o, v) in act.iter_mut().zip(round_f16_row(&a32)) {
        *o = f64::from(v);
    }
}

/// [`moe`] with each expert's SwiGLU output passed through `act_round` (what a kernel feeds
/// the down projection) before it.
#[allow(clippy::too_many_arguments)]
pub fn moe_with(
    w: &MoeHost<'_>,
    x: &[f32],
    experts: &[usize],
    weights: &[f64],
    inter: usize,
    limit: f64,
    alpha: f64,
    act_round: &dyn Fn(&mut [f64]),
) -> Vec<f64> {
    let h = x.len();
    let x64: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let mut y = vec![0.0; h];
    for (&e, &we) in experts.iter().zip(weights) {
        let mut act = expert_act(w, &x64, e, inter, limit, alpha);
        act_round(&mut act);
        for (yr, d) in y.iter_mut().zip(expert_down(w, &act, e, h)) {
            *yr += we * d;
        }
    }
    y
}

/// One row as the fp16 tensor-core MoE feeds it to its MMAs (kernel `moe16_stage`): fp16 of
/// x / D, D = 2^(E - 7) for the row's largest magnitude in [2^E, 2^(E+1)), times D (exact in
/// f32); a row whose largest magnitude is below 2^-119 is zeros.
pub fn round_f16_row(x: &[f32]) -> Vec<f32> {
    let m = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let ef = m.to_bits() >> 23;
    if !(8..=254).contains(&ef) {
        return vec![0.0; x.len()];
    }
    let d = f32::from_bits((ef - 7) << 23);
    let id = f32::from_bits((261 - ef) << 23);
    x.iter()
        .map(|&v| half::f16::from_f32(v * id).to_f32() * d)
        .collect()
}

/// `x` rounded to bf16 and back, as the tensor-core GEMMs read their fp32 activations.
pub fn round_bf16(x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| half::bf16::from_f32(v).to_f32())
        .collect()
}

/// Index of the largest value (ties: lower index; NaN never wins).
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    let mut bv = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        if v > bv {
            bv = v;
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rows_scale_by_a_power_of_two_and_keep_eleven_bits() {
        // Largest magnitude 3.0 (in [2, 4)): D = 2^-6, so x / D < 256.
        let x = [3.0f32, -1.0 / 3.0, 1e-9, 0.0];
        let r = round_f16_row(&x);
        assert_eq!(r[0], 3.0);
        assert_eq!(r[3], 0.0);
        let third = half::f16::from_f32(-64.0 / 3.0).to_f32() / 64.0;
        assert_eq!(r[1], third);
        assert!((f64::from(r[1]) + 1.0 / 3.0).abs() < 1.0 / 3.0 * 2f64.powi(-11));
        // 1e-9 / D = 6.4e-8 is below fp16's smallest subnormal (6e-8 rounds to it or to 0).
        assert!(r[2].abs() <= 2f32.powi(-24) / 64.0);
        // Tiny and empty rows are zeros; a row with inf is zeros too (the kernel's D is NaN).
        assert_eq!(round_f16_row(&[1e-37, -2e-38]), vec![0.0, 0.0]);
        assert_eq!(round_f16_row(&[f32::INFINITY, 1.0]), vec![0.0, 0.0]);
    }

    #[test]
    fn e4m3_known_values() {
        let cases: &[(f32, u8)] = &[
            (0.0, 0x00),
            (-0.0, 0x80),
            (1.0, 0x38),
            (-2.0, 0xc0),
            (448.0, 0x7e),
            (-448.0, 0xfe),
            // Saturation: beyond the largest finite value, and infinities.
            (449.0, 0x7e),
            (464.0, 0x7e),
            (1e9, 0x7e),
            (-500.0, 0xfe),
            (f32::INFINITY, 0x7e),
            (f32::NEG_INFINITY, 0xfe),
            // Subnormals: 2^-9 = 0.001953125 is the smallest; 0.0019531 rounds to it.
            (0.001953125, 0x01),
            (0.0019531, 0x01),
            (-0.0019531, 0x81),
            (7.0 * 0.001953125, 0x07),
            // Ties to even: half of 2^-9 → 0; 1.5 × 2^-9 → 2 × 2^-9; 7.5 × 2^-9 → 2^-6.
            (0.0009765625, 0x00),
            (1.5 * 0.001953125, 0x02),
            (7.5 * 0.001953125, 0x08),
            (0.0009766, 0x01),
            // Ties in the normals: 1.0625 between 1 (even) and 1.125; 1.1875 between 1.125 and
            // 1.25 (even); 15.5 between 15 and 16 (even, next binade); 464 would tie 448/480.
            (1.0625, 0x38),
            (1.1875, 0x3a),
            (-1.0625, 0xb8),
            (15.5, 0x58),
            (1.0626, 0x39),
            (0.015625, 0x08),
            (240.0, 0x77),
            (256.0, 0x78),
        ];
        for &(v, bits) in cases {
            assert_eq!(e4m3_from_f32(v), bits, "{v}: got {:#04x}", e4m3_from_f32(v));
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 0.001953125);
        assert_eq!(e4m3_to_f32(0x08), 0.015625);
        assert_eq!(e4m3_to_f32(0x39), 1.125);
        assert!(e4m3_to_f32(0x80).is_sign_negative() && e4m3_to_f32(0x80) == 0.0);
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
        assert!(e4m3_to_f32(e4m3_from_f32(f32::NAN)).is_nan());
        assert!(e4m3_to_f32(e4m3_from_f32(-f32::NAN)).is_nan());
    }

    #[test]
    fn e4m3_round_trips_and_rounds_to_the_nearest() {
        let finite: Vec<u8> = (0..=255u8).filter(|b| b & 0x7f != 0x7f).collect();
        for &b in &finite {
            let v = e4m3_to_f32(b);
            assert_eq!(e4m3_from_f32(v), b, "{b:#04x} = {v}");
            // Every E4M3 number is a bf16 number (an fp8 cache's values pass through bf16
            // references exactly).
            assert_eq!(half::bf16::from_f32(v).to_f32(), v);
        }
        // Against a brute-force nearest (ties to the even code) on a sweep of inputs.
        let mut x = 1e-4f32;
        while x < 600.0 {
            for v in [x, -x] {
                let got = e4m3_to_f32(e4m3_from_f32(v));
                let want = if v.abs() >= 448.0 {
                    448f32.copysign(v)
                } else {
                    let mut best: Option<(f64, u8)> = None;
                    for &b in finite
                        .iter()
                        .filter(|&&b| (b & 0x80 != 0) == v.is_sign_negative())
                    {
                        let d = (f64::from(e4m3_to_f32(b)) - f64::from(v)).abs();
                        if best.is_none_or(|(bd, _)| d < bd || (d == bd && b & 1 == 0)) {
                            best = Some((d, b));
                        }
                    }
                    e4m3_to_f32(best.map_or(0, |(_, b)| b))
                };
                assert_eq!(got, want, "{v}");
            }
            x *= 1.013;
        }
    }
}
