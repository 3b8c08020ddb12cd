//! Host mirror of the decode MoE's 8-bit activation formats (`--activation q8|fp8`): the
//! kernels in `engine-kernels/moe_gemv.cu` quantize each group of 32 activations while staging
//! them, and these functions compute the same codes and scales bit for bit (same fp32
//! operations in the same order), so the self-test's CPU reference multiplies exactly the
//! values the GPU multiplies.
//!
//! Per group of 32 values x (NaN-propagating amax = max |x|):
//! * q8: d = amax / 127, q = rint(x · (1/d)) in −127..=127 (round half to even), value q · d.
//! * fp8: d = amax / 448, code = E4M3(x · (1/d)) (round to nearest even, saturating at ±448),
//!   value E4M3⁻¹(code) · d.
//!
//! When d < 2⁻¹²⁶ (amax = 0, or so small that 1/d would overflow) every code is 0.
//!
//! The bf16 format's fp16 dot ([`MoeCodes::F16`]) codes each group as fp16 too: D is the
//! smallest power of two at or above amax (at least 2⁻¹⁰⁰), the codes are the fp16 (round to
//! nearest even) of x · 2¹⁵ / D and the stored scale D / 2¹⁵; [`f16_block_dot`] sums a block
//! as the kernel does, in fp16, with the weights as the experts' fp16 layout decodes them (the
//! E2M1 value times 2⁻¹⁴, `ops::ExpertLayout::F16`).

use half::f16;

use super::gates::ActFormat;
use super::ops::MoeCodes;

/// Activations per quantization group (one scale each).
pub const GROUP: usize = 32;

/// Largest q8 code magnitude.
pub const Q8_MAX: f32 = 127.0;

/// Largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;

/// Smallest scale quantized normally (the kernels' `ACT8_MIN_SCALE`, f32::MIN_POSITIVE).
const MIN_SCALE: f32 = f32::MIN_POSITIVE;

/// max(a, b) that is NaN when either is (PTX `max.NaN.f32`).
fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

/// The group's scale d = amax / `qmax` and the multiplier 1/d the codes are computed with
/// (0 when d is below the smallest normal scale, or NaN).
fn scale(x: &[f32], qmax: f32) -> (f32, f32) {
    let amax = x.iter().fold(0.0f32, |m, v| max_nan(m, v.abs()));
    let d = amax / qmax;
    let id = if d >= MIN_SCALE { 1.0 / d } else { 0.0 };
    (d, id)
}

/// One q8 group: the scale d and the int8 codes (value = code · d).
pub fn q8_group(x: &[f32]) -> (f32, Vec<i8>) {
    let (d, id) = scale(x, Q8_MAX);
    let q = x
        .iter()
        // `as i32` maps NaN to 0, as the GPU's cvt.rni.s32.f32 does.
        .map(|&v| ((v * id).round_ties_even() as i32).clamp(-127, 127) as i8)
        .collect();
    (d, q)
}

/// f32 → FP8 E4M3 (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no infinities, 0x7f
/// and 0xff NaN): round to nearest even, saturating to ±448 (PTX
/// `cvt.rn.satfinite.e4m3x2.f32`). NaN gives 0x7f.
pub fn e4m3_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    // Halfway between 448 and the next (absent) step, 480, rounds to 448 (even mantissa);
    // everything above saturates.
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    // Codes are monotone in the magnitude: code = biased exponent · 8 + mantissa, with the
    // subnormals (exponent 0, step 2⁻⁹) continuing into the normals; a mantissa rounded up
    // to 8 carries into the exponent.
    let code = if a < 2f32.powi(-6) {
        // Subnormal range: a · 2⁹ is exact (a power-of-two scaling).
        (a * 512.0).round_ties_even() as u8
    } else {
        let e = ((a.to_bits() >> 23) & 0xff) as i32 - 127; // −6..=8, a is a normal f32
        let frac = a / 2f32.powi(e) - 1.0; // [0, 1), exact
        let m = (frac * 8.0).round_ties_even() as u8; // 0..=8
        (((e + 7) as u8) << 3) + m
    };
    sign | code
}

/// FP8 E4M3 → f32 (exact); 0x7f and 0xff are NaN.
pub fn e4m3_to_f32(c: u8) -> f32 {
    let sign = if c & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = i32::from((c >> 3) & 0xf);
    let m = f32::from(c & 7);
    if e == 15 && m == 7.0 {
        return f32::NAN;
    }
    let mag = if e == 0 {
        m * 2f32.powi(-9)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    };
    sign * mag
}

/// One fp8 group: the scale d and the E4M3 codes (value = E4M3⁻¹(code) · d).
pub fn fp8_group(x: &[f32]) -> (f32, Vec<u8>) {
    let (d, id) = scale(x, E4M3_MAX);
    (d, x.iter().map(|&v| e4m3_from_f32(v * id)).collect())
}

/// fp16 codes are x · F16_CODE_SCALE / D (kernel constant `F16_CODE_SCALE`).
const F16_CODE_SCALE: f32 = 32768.0;

/// The fp16 dot's weights are E2M1 values times this (the experts' fp16 layout decodes them
/// so; the kernels' stored scale carries the inverse, `F16_W_INV`).
const F16_WEIGHT_SCALE: f64 = 1.0 / 16384.0;

/// One group of the fp16 dot: the scale D / 2¹⁵ and the fp16 codes (value = code · scale),
/// computed with the kernel's fp32 operations (`F16Codes` in moe_gemv.cu, which stores this
/// scale times 2¹⁴ for its weights' 2⁻¹⁴).
pub fn f16_group(x: &[f32]) -> (f32, Vec<f16>) {
    let amax = x.iter().fold(0.0f32, |m, v| max_nan(m, v.abs()));
    // The next power of two at or above amax by its bits (NaN and infinity handled below).
    let mut d = f32::from_bits(amax.to_bits().wrapping_add(0x007f_ffff) & 0x7f80_0000);
    d = d.max(2f32.powi(-100));
    if amax.is_nan() {
        d = amax;
    }
    let stored = d * (1.0 / F16_CODE_SCALE);
    let inv = F16_CODE_SCALE / d;
    (stored, x.iter().map(|&v| f16::from_f32(v * inv)).collect())
}

/// `x` rounded to fp16, to nearest even, in one step (as the GPU's fp16 operations round
/// their exact results). `half`'s `f16::from_f64` goes through f32 first, and that double
/// rounding lands on the other side of a tie now and then (1 + 2⁻¹¹ + 2⁻⁴⁰ gives 1).
pub fn f16_round(x: f64) -> f16 {
    if x.is_nan() {
        return f16::NAN;
    }
    let a = x.abs();
    if a == 0.0 {
        return f16::from_f64(x);
    }
    // 65520 is the tie between fp16's largest finite value and the next step (2¹⁶): even
    // is infinity.
    if a >= 65520.0 {
        return if x > 0.0 {
            f16::INFINITY
        } else {
            f16::NEG_INFINITY
        };
    }
    // fp16's step at a: 2^(exponent − 10), or the subnormal step 2⁻²⁴ below 2⁻¹⁴.
    let exp = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let step = 2f64.powi(exp.max(-14) - 10);
    // a / step and the product back are exact (powers of two); the result is an fp16 value,
    // so the final conversion is exact.
    f16::from_f64(((a / step).round_ties_even() * step).copysign(x))
}

/// What the fp16 dot computes for one 32-element MXFP4 block (16 bytes) against one group's
/// fp16 codes, before any scale: two fp16 pair accumulators (words 0-1 and 2-3 of the block,
/// the low halves taking the even elements) each summing its products (the weights times 2⁻¹⁴,
/// as the fp16 layout decodes them) with one rounding per fused multiply-add, the two added in
/// fp16, the pair's halves summed in fp32; returned times 2¹⁴ (exact), i.e. in the codes'
/// units.
pub fn f16_block_dot(block: &[u8], codes: &[f16]) -> f32 {
    let mut acc = [[f16::ZERO; 2]; 2];
    for (e, c) in codes.iter().enumerate().take(32) {
        let byte = block[e / 2];
        let nib = if e % 2 == 0 { byte & 15 } else { byte >> 4 };
        let a = &mut acc[e / 16][e % 2];
        // Exact in f64 (a 2-bit weight times an 11-bit code plus an fp16), rounded once.
        let w = super::reference::FP4[nib as usize] * F16_WEIGHT_SCALE;
        *a = f16_round(w * c.to_f64() + a.to_f64());
    }
    let lo = f16_round(acc[0][0].to_f64() + acc[1][0].to_f64());
    let hi = f16_round(acc[0][1].to_f64() + acc[1][1].to_f64());
    (lo.to_f32() + hi.to_f32()) * (1.0 / F16_WEIGHT_SCALE) as f32
}

/// One row's dot product as the fp16-dot kernels form it: each block's [`f16_block_dot`]
/// times its group's stored scale and the block's UE8M0 scale, summed in f64 (the kernels sum
/// in fp32, in their own order).
pub fn f16_row_dot(blocks: &[u8], scales: &[u8], stored: &[f32], codes: &[f16]) -> f64 {
    stored
        .iter()
        .enumerate()
        .map(|(b, &st)| {
            let s = (f64::from(scales[b]) - 127.0).exp2();
            f64::from(f16_block_dot(
                &blocks[b * 16..][..16],
                &codes[b * 32..][..32],
            )) * f64::from(st)
                * s
        })
        .sum()
}

/// Every group of `x` coded for the fp16 dot: (stored scales, codes).
pub fn f16_groups(x: &[f32]) -> (Vec<f32>, Vec<f16>) {
    let (mut stored, mut codes) = (Vec::new(), Vec::new());
    for grp in x.chunks(GROUP) {
        let (s, c) = f16_group(grp);
        stored.push(s);
        codes.extend(c);
    }
    (stored, codes)
}

/// The values the decode MoE kernels multiply for activations `x` (whole groups of 32) in
/// format `fmt`: quantized per group and dequantized, exactly (in f64). `Bf16` is the
/// reference path, which multiplies the fp32 values themselves.
pub fn dequantized(x: &[f32], fmt: ActFormat) -> Vec<f64> {
    dequantized_codes(x, fmt.into())
}

/// [`dequantized`] for the kernels' codes, the fp16 dot's included (its values: code ·
/// stored scale; its sums are [`f16_row_dot`]'s, not these values' exact products).
pub fn dequantized_codes(x: &[f32], codes: MoeCodes) -> Vec<f64> {
    assert!(
        x.len().is_multiple_of(GROUP),
        "{} activations: not whole groups of {GROUP}",
        x.len()
    );
    let mut out = Vec::with_capacity(x.len());
    for grp in x.chunks(GROUP) {
        match codes {
            MoeCodes::F32 => out.extend(grp.iter().map(|&v| f64::from(v))),
            MoeCodes::F16 => {
                let (d, q) = f16_group(grp);
                out.extend(q.iter().map(|&c| c.to_f64() * f64::from(d)));
            }
            MoeCodes::Q8 => {
                let (d, q) = q8_group(grp);
                out.extend(q.iter().map(|&c| f64::from(c) * f64::from(d)));
            }
            MoeCodes::Fp8 => {
                let (d, q) = fp8_group(grp);
                out.extend(q.iter().map(|&c| f64::from(e4m3_to_f32(c)) * f64::from(d)));
            }
        }
    }
    out
}

fn q8_round_trip(x: &[f32]) -> Vec<f32> {
    dequantized(x, ActFormat::Q8)
        .iter()
        .map(|&v| v as f32)
        .collect()
}

fn fp8_round_trip(x: &[f32]) -> Vec<f32> {
    dequantized(x, ActFormat::Fp8)
        .iter()
        .map(|&v| v as f32)
        .collect()
}

/// Quantize-dequantize of `fmt` as an f32 transform (rounded to f32 from the exact values),
/// for the CPU reference's MoE ([`crate::engine::cpu::CpuBackend::set_moe_activation`]);
/// `None` for the unquantized `Bf16` path.
pub fn round_trip(fmt: ActFormat) -> Option<crate::engine::cpu::ops::ActTransform> {
    match fmt {
        ActFormat::Bf16 => None,
        ActFormat::Q8 => Some(q8_round_trip),
        ActFormat::Fp8 => Some(fp8_round_trip),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_known_values() {
        for (x, c) in [
            (0.0f32, 0x00u8),
            (-0.0, 0x80),
            (1.0, 0x38),
            (-1.0, 0xb8),
            (1.125, 0x39),
            (1.75, 0x3e),
            (2.0, 0x40),
            (448.0, 0x7e),
            (-448.0, 0xfe),
            (2f32.powi(-6), 0x08),       // smallest normal
            (2f32.powi(-9), 0x01),       // smallest subnormal
            (7.0 * 2f32.powi(-9), 0x07), // largest subnormal
            (240.0, 0x77),
            (256.0, 0x78),
        ] {
            assert_eq!(e4m3_from_f32(x), c, "{x}");
            assert_eq!(e4m3_to_f32(c), x, "{c:#x}");
        }
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
        assert_eq!(e4m3_from_f32(f32::NAN), 0x7f);
    }

    #[test]
    fn e4m3_rounds_to_nearest_even_and_saturates() {
        // Ties: 1 + 1/16 lies halfway between 1 (mantissa 0, even) and 1.125 (odd).
        assert_eq!(e4m3_from_f32(1.0625), 0x38);
        // 1.1875 between 1.125 (odd) and 1.25 (even).
        assert_eq!(e4m3_from_f32(1.1875), 0x3a);
        // Just above a tie rounds up, just below down.
        assert_eq!(e4m3_from_f32(f32::from_bits(1.0625f32.to_bits() + 1)), 0x39);
        assert_eq!(e4m3_from_f32(f32::from_bits(1.0625f32.to_bits() - 1)), 0x38);
        // Mantissa carry into the exponent: 1.9375 is halfway between 1.875 (odd) and 2.
        assert_eq!(e4m3_from_f32(1.9375), 0x40);
        // Subnormal ties: 1.5 · 2⁻⁹ → 2 · 2⁻⁹ (even); 2.5 · 2⁻⁹ → 2 · 2⁻⁹; 0.5 · 2⁻⁹ → 0.
        assert_eq!(e4m3_from_f32(1.5 * 2f32.powi(-9)), 0x02);
        assert_eq!(e4m3_from_f32(2.5 * 2f32.powi(-9)), 0x02);
        assert_eq!(e4m3_from_f32(0.5 * 2f32.powi(-9)), 0x00);
        assert_eq!(e4m3_from_f32(-0.5 * 2f32.powi(-9)), 0x80);
        // The top subnormal rounding up into the smallest normal.
        assert_eq!(e4m3_from_f32(7.5 * 2f32.powi(-9)), 0x08);
        // 464 is halfway between 448 and 480: even → 448; above saturates, infinities too.
        for x in [449.0f32, 464.0, 465.0, 1e6, f32::INFINITY] {
            assert_eq!(e4m3_from_f32(x), 0x7e, "{x}");
            assert_eq!(e4m3_from_f32(-x), 0xfe, "{x}");
        }
    }

    #[test]
    fn e4m3_round_trips_every_code_and_rounds_to_the_nearest() {
        let finite: Vec<u8> = (0u8..=255).filter(|c| c & 0x7f != 0x7f).collect();
        for &c in &finite {
            let v = e4m3_to_f32(c);
            let back = e4m3_from_f32(v);
            // ±0 keep their sign.
            assert_eq!(back, c, "{c:#x} -> {v} -> {back:#x}");
        }
        // A dense sweep: the chosen code is at least as near as any other finite code.
        let vals: Vec<f32> = finite.iter().map(|&c| e4m3_to_f32(c)).collect();
        let mut x = -500.0f32;
        while x < 500.0 {
            let got = e4m3_to_f32(e4m3_from_f32(x));
            let best = vals
                .iter()
                .map(|v| (v - x).abs())
                .fold(f32::INFINITY, f32::min);
            assert!((got - x).abs() <= best, "{x}: {got}");
            x += 0.0137;
        }
    }

    #[test]
    fn q8_groups() {
        // amax 127 → d = 1: codes are the values rounded half to even.
        let mut x = vec![0.0f32; 32];
        x[0] = 127.0;
        x[1] = -127.0;
        x[2] = 2.5;
        x[3] = 3.5;
        x[4] = -2.5;
        x[5] = 0.49;
        x[6] = 126.51;
        let (d, q) = q8_group(&x);
        assert_eq!(d, 1.0);
        assert_eq!(&q[..7], &[127, -127, 2, 4, -2, 0, 127]);
        assert!(q[7..].iter().all(|&c| c == 0));
        // General scale: the largest magnitude maps to ±127 and every value to the nearest
        // step of d.
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 13.3) * 0.071).collect();
        let (d, q) = q8_group(&x);
        assert_eq!(d, x[31].abs().max(x[0].abs()) / 127.0);
        assert_eq!(q[31], 127);
        for (v, c) in x.iter().zip(&q) {
            assert!((f64::from(*c) * f64::from(d) - f64::from(*v)).abs() <= 0.5001 * f64::from(d));
        }
        // Zero and tiny groups quantize to zero codes.
        let (d, q) = q8_group(&[0.0; 32]);
        assert_eq!(d, 0.0);
        assert!(q.iter().all(|&c| c == 0));
        let (_, q) = q8_group(&[1e-37; 32]);
        assert!(q.iter().all(|&c| c == 0));
        // NaN poisons the scale.
        let mut x = vec![1.0f32; 32];
        x[9] = f32::NAN;
        assert!(q8_group(&x).0.is_nan());
    }

    #[test]
    fn f16_groups() {
        // amax 3 → D = 4: codes x · 2¹³, scale 4 / 2¹⁵; a power of two is its own D.
        let mut x = vec![0.0f32; 32];
        x[0] = 3.0;
        x[1] = -1.5;
        x[2] = 1e-3;
        let (d, q) = f16_group(&x);
        assert_eq!(d, 4.0 / 32768.0);
        assert_eq!(q[0].to_f32(), 24576.0);
        assert_eq!(q[1].to_f32(), -12288.0);
        assert_eq!(q[2], f16::from_f32(8.192));
        x[0] = 4.0;
        assert_eq!(f16_group(&x).0, 4.0 / 32768.0);
        // Every value within fp16's half-ulp of itself; no code above 2¹⁵.
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 13.3) * 0.071).collect();
        let (d, q) = f16_group(&x);
        for (v, c) in x.iter().zip(&q) {
            let back = c.to_f64() * f64::from(d);
            assert!((back - f64::from(*v)).abs() <= f64::from(v.abs()) * 2f64.powi(-11));
            assert!(c.to_f32().abs() <= 32768.0);
        }
        // Zero groups: D at its floor, zero codes; NaN and infinity reach the scale.
        let (d, q) = f16_group(&[0.0; 32]);
        assert_eq!(d, 2f32.powi(-115));
        assert!(q.iter().all(|c| c.to_f32() == 0.0));
        let mut x = vec![1.0f32; 32];
        x[9] = f32::NAN;
        assert!(f16_group(&x).0.is_nan());
        x[9] = f32::INFINITY;
        assert!(f16_group(&x).0.is_infinite());
    }

    #[test]
    fn f16_round_is_one_rounding_to_nearest_even() {
        let r = |x: f64| f16_round(x).to_f64();
        // Just above a tie rounds up (f16::from_f64 gives 1 here), ties go to even.
        assert_eq!(
            r(1.0 + 2f64.powi(-11) + 2f64.powi(-40)),
            1.0 + 2f64.powi(-10)
        );
        assert_eq!(r(1.0 + 2f64.powi(-11)), 1.0);
        assert_eq!(r(1.0 + 3.0 * 2f64.powi(-11)), 1.0 + 2f64.powi(-9));
        assert_eq!(
            r(-(1.0 + 2f64.powi(-11) + 2f64.powi(-40))),
            -(1.0 + 2f64.powi(-10))
        );
        // Subnormals: steps of 2⁻²⁴; half a step is a tie to even (0).
        assert_eq!(r(3.0 * 2f64.powi(-26)), 2f64.powi(-24));
        assert_eq!(r(2f64.powi(-25)), 0.0);
        assert_eq!(r(2f64.powi(-25) + 2f64.powi(-60)), 2f64.powi(-24));
        // The top of the range: 65504 stays, the tie above it is infinity.
        assert_eq!(r(65504.0), 65504.0);
        assert_eq!(r(65519.9), 65504.0);
        assert!(f16_round(65520.0).is_infinite() && f16_round(-1e9).is_infinite());
        assert!(f16_round(f64::NAN).is_nan());
        assert_eq!(f16_round(-0.0).to_bits(), 0x8000);
        // Agrees with the f32 conversion wherever a value is already an f32.
        for i in 0..2000 {
            let v = (i as f32 - 1000.0) * 0.013_7 + 1e-3;
            assert_eq!(f16_round(f64::from(v)), f16::from_f32(v), "{v}");
        }
    }

    #[test]
    fn f16_block_dot_sums_like_the_exact_dot_within_fp16() {
        // Every nibble value against codes of both signs: the fp16 sums stay within a few
        // fp16 ulps of the exact dot, and an exact case (small integers) is exact.
        let block: Vec<u8> = (0..16u8).map(|j| j.wrapping_mul(37) ^ 0x5a).collect();
        let codes: Vec<f16> = (0..32)
            .map(|i| f16::from_f32((i as f32 - 15.5) * 934.4))
            .collect();
        let exact: f64 = (0..32)
            .map(|e| {
                let nib = if e % 2 == 0 {
                    block[e / 2] & 15
                } else {
                    block[e / 2] >> 4
                };
                crate::engine::cuda::reference::FP4[nib as usize] * codes[e].to_f64()
            })
            .sum();
        let got = f64::from(f16_block_dot(&block, &codes));
        let mag: f64 = codes.iter().map(|c| 6.0 * c.to_f64().abs()).sum();
        assert!((got - exact).abs() <= mag * 2f64.powi(-10), "{got} {exact}");
        let twos = vec![f16::from_f32(2.0); 32];
        let all_one = vec![0x22u8; 16]; // every element 1.0
        assert_eq!(f16_block_dot(&all_one, &twos), 64.0);
        // The largest codes against the largest weights stay finite (products ≤ 12 · 2¹⁵ ·
        // 2⁻¹⁴ in the kernels' units).
        let top = vec![f16::from_f32(32768.0); 32];
        let all_six = vec![0x77u8; 16];
        assert_eq!(f16_block_dot(&all_six, &top), 32.0 * 6.0 * 32768.0);
    }

    #[test]
    fn fp8_groups_and_dequantized() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 31.5) * 0.37)
            .collect();
        let (d, q) = fp8_group(&x[..32]);
        let amax = x[..32].iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(d, amax / 448.0);
        // The largest magnitude maps to ±448 (up to the rounding of 1/d).
        assert!(q.iter().any(|&c| c & 0x7f == 0x7e));
        let deq = dequantized(&x, ActFormat::Fp8);
        for (v, w) in x.iter().zip(&deq) {
            // 3 mantissa bits: within 2⁻⁴ relative (or a subnormal step) of the input.
            let v = f64::from(*v);
            assert!(
                (w - v).abs() <= v.abs() / 16.0 + 2f64.powi(-9) * f64::from(d),
                "{v} {w}"
            );
        }
        let deq = dequantized(&x, ActFormat::Q8);
        let dq = q8_group(&x[..32]).0;
        for (v, w) in x[..32].iter().zip(&deq) {
            assert!((w - f64::from(*v)).abs() <= 0.5001 * f64::from(dq));
        }
        let same = dequantized(&x, ActFormat::Bf16);
        assert!(same.iter().zip(&x).all(|(a, b)| *a == f64::from(*b)));
        let (d, q) = fp8_group(&[0.0; 32]);
        assert_eq!(d, 0.0);
        assert!(q.iter().all(|&c| c == 0));
        assert!(
            dequantized(&[-0.0; 32], ActFormat::Fp8)
                .iter()
                .all(|&v| v == 0.0)
        );
    }
}
