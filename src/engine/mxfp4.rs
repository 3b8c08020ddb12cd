//! MXFP4 (OCP microscaling FP4) decoding: E2M1 nibbles in blocks of 32 sharing one E8M0 scale.
//!
//! Layout (HF gpt-oss release): groups of 32 run along the reduction axis of each output
//! row; byte j of a 16-byte block holds element 2j in its low nibble and 2j+1 in its high one.

use super::config::MXFP4_GROUP;

// Decoding is one of the CPU engine's inner loops: it lives in the optimised kernel crate.
pub use mxtune_cpu_kernels::mxfp4::{BLOCK_BYTES, E2M1, decode_block, decode_row, e8m0_scale};

const _: () = assert!(mxtune_cpu_kernels::mxfp4::GROUP == MXFP4_GROUP);

// ---- Quantization (bf16 → MXFP4), for dense layers converted at load (`--mxfp4-layers`).
//
// The one definition, shared bit for bit by this host code and the device kernel
// `mxfp4_quantize_bf16` (engine-kernels/mxfp4_dense.cu), per block of 32 consecutive values
// along a row's input axis:
//
// 1. amax = the largest magnitude among the block's finite values, found as the largest
//    magnitude bit pattern (sign cleared; non-finite values count as 0).
// 2. The scale exponent e is the smallest integer with amax ≤ 6 · 2^e, clamped to the E8M0
//    range [-127, 127], computed from amax's float bits (biased exponent E, mantissa M):
//    e = E − 129 + (M > 0x400000), since amax = 1.f · 2^(E−127) ≤ 1.5 · 2^(e+2) exactly when
//    E − 127 ≤ e + 2 with f ≤ .5, one more otherwise (no log2, so both sides agree exactly).
//    A block with amax = 0 gets the fixed scale byte [`ZERO_BLOCK_SCALE`] (2^0).
//    The scale byte is e + 127 (0..=254; 255, NaN, is never written).
// 3. Each value v becomes the E2M1 code nearest to |v| / 2^e, ties to the even code
//    (0.25 → 0, 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4), saturating at 6,
//    with v's sign bit as the code's sign (−0 stays −0). The comparisons are made against
//    the midpoints times 2^e, products that are exact in f32 (or overflow to +inf alike on
//    both sides), so no division or rounding step can differ between host and device.
//    NaN becomes ±0 and ±inf ±6·2^e; loaders refuse non-finite weights before that matters.
//
// Dequantizing gives E2M1 · 2^e: at most 2 significant bits, so every value is exact in bf16
// (and f32) except where 4 · 2^e or 6 · 2^e exceeds the bf16 range (blocks with amax above
// 1.75 · 2^127, which no trained weight has).

/// Scale byte of an all-zero block: 2^0 (any scale decodes zeros exactly; this one keeps
/// the decode paths away from the subnormal 2^−127).
pub const ZERO_BLOCK_SCALE: u8 = 127;

/// E2M1 midpoints between neighbouring magnitude codes k and k+1 (k = 0..6), and whether a
/// value exactly on one rounds up (the upper code is even).
const MIDPOINTS: [(f32, bool); 7] = [
    (0.25, false),
    (0.75, true),
    (1.25, false),
    (1.75, true),
    (2.5, false),
    (3.5, true),
    (5.0, false),
];

/// Magnitude bits of `v` (sign cleared) when finite, else 0: the quantity the block maximum
/// is taken over.
fn finite_magnitude_bits(v: f32) -> u32 {
    let m = v.to_bits() & 0x7fff_ffff;
    if m < 0x7f80_0000 { m } else { 0 }
}

/// The E8M0 scale byte of a block whose largest finite magnitude has bits `amax_bits`.
pub fn scale_byte(amax_bits: u32) -> u8 {
    if amax_bits == 0 {
        return ZERO_BLOCK_SCALE;
    }
    let (exp, man) = ((amax_bits >> 23) as i32, amax_bits & 0x7f_ffff);
    let e = (exp - 129 + i32::from(man > 0x40_0000)).clamp(-127, 127);
    (e + 127) as u8
}

/// The E2M1 code (sign in bit 3) of `v` under the block scale `unit` = 2^e.
pub fn e2m1_code(v: f32, unit: f32) -> u8 {
    let a = v.abs();
    let mut mag = 0u8;
    for (m, up_on_tie) in MIDPOINTS {
        let t = m * unit;
        if a > t || (up_on_tie && a == t) {
            mag += 1;
        }
    }
    mag | (((v.to_bits() >> 31) as u8) << 3)
}

/// Quantize one block of [`MXFP4_GROUP`] values: its 16 packed bytes (element 2j in the low
/// nibble of byte j) and its scale byte.
pub fn quantize_block(v: &[f32]) -> ([u8; BLOCK_BYTES], u8) {
    debug_assert_eq!(v.len(), MXFP4_GROUP);
    let amax = v
        .iter()
        .map(|&x| finite_magnitude_bits(x))
        .max()
        .unwrap_or(0);
    let s = scale_byte(amax);
    let unit = e8m0_scale(s);
    let mut out = [0u8; BLOCK_BYTES];
    for (j, o) in out.iter_mut().enumerate() {
        *o = e2m1_code(v[2 * j], unit) | (e2m1_code(v[2 * j + 1], unit) << 4);
    }
    (out, s)
}

/// Quantize a row-major bf16 matrix with `cols` input columns: blocks [rows, cols/32, 16] and
/// scales [rows, cols/32], the checkpoint's expert layout. `what` names the tensor in the
/// error when `cols` is not a multiple of 32.
pub fn quantize_matrix(
    what: &str,
    src: &[half::bf16],
    cols: usize,
) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    check_quantizable(what, cols)?;
    anyhow::ensure!(
        src.len().is_multiple_of(cols),
        "{what}: {} values are not whole rows of {cols}",
        src.len()
    );
    let n = src.len() / MXFP4_GROUP;
    let (mut blocks, mut scales) = (Vec::with_capacity(n * BLOCK_BYTES), Vec::with_capacity(n));
    let mut buf = [0.0f32; MXFP4_GROUP];
    for chunk in src.chunks_exact(MXFP4_GROUP) {
        for (b, v) in buf.iter_mut().zip(chunk) {
            *b = v.to_f32();
        }
        let (q, s) = quantize_block(&buf);
        blocks.extend_from_slice(&q);
        scales.push(s);
    }
    Ok((blocks, scales))
}

/// Refuse a tensor whose rows cannot be cut into MXFP4 blocks, naming it and the way out.
pub fn check_quantizable(what: &str, cols: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        cols > 0 && cols.is_multiple_of(MXFP4_GROUP),
        "{what}: {cols} input columns are not a multiple of {MXFP4_GROUP}, so it cannot be \
         quantized to MXFP4 blocks; keep it in bf16 (--mxfp4-layers moe)"
    );
    Ok(())
}

/// dequant(quant(w)) of a row-major bf16 matrix: the values an MXFP4 copy of `src` holds,
/// back in bf16 (exact; see the quantizer's notes). References use it to mirror a quantized
/// device layer.
pub fn fake_quantize(
    what: &str,
    src: &[half::bf16],
    cols: usize,
) -> anyhow::Result<Vec<half::bf16>> {
    let (blocks, scales) = quantize_matrix(what, src, cols)?;
    let mut row = vec![0.0f32; MXFP4_GROUP];
    let mut out = Vec::with_capacity(src.len());
    for (blk, &s) in blocks.chunks_exact(BLOCK_BYTES).zip(&scales) {
        decode_block(blk, s, &mut row);
        out.extend(row.iter().map(|&v| half::bf16::from_f32(v)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nibble_order_is_low_then_high() {
        // 0x71: low nibble 1 (0.5) is element 0, high nibble 7 (6.0) is element 1.
        let mut block = [0u8; BLOCK_BYTES];
        block[0] = 0x71;
        block[15] = 0xA8; // low 8 = -0.0 (element 30), high 0xA = -1.0 (element 31)
        let mut out = [f32::NAN; MXFP4_GROUP];
        decode_block(&block, 127, &mut out);
        assert_eq!(out[0], 0.5);
        assert_eq!(out[1], 6.0);
        assert_eq!(out[30], 0.0);
        assert!(out[30].is_sign_negative());
        assert_eq!(out[31], -1.0);
        assert!(out[2..30].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn scales_are_powers_of_two_around_127() {
        assert_eq!(e8m0_scale(127), 1.0);
        assert_eq!(e8m0_scale(128), 2.0);
        assert_eq!(e8m0_scale(120), 1.0 / 128.0);
        assert_eq!(e8m0_scale(1), 2f32.powi(-126));
        assert_eq!(e8m0_scale(0), 2f32.powi(-127));
        assert_eq!(e8m0_scale(255), f32::INFINITY);
        let block = [0x2Fu8; BLOCK_BYTES]; // low 0xF = -6, high 0x2 = 1
        let mut out = [0.0; MXFP4_GROUP];
        decode_block(&block, 125, &mut out);
        assert_eq!(out[0], -1.5);
        assert_eq!(out[1], 0.25);
    }

    /// Quantize a block given as values (padded with zeros to 32).
    fn q(vals: &[f32]) -> ([u8; BLOCK_BYTES], u8) {
        let mut v = [0.0f32; MXFP4_GROUP];
        v[..vals.len()].copy_from_slice(vals);
        quantize_block(&v)
    }

    fn code(block: &[u8; BLOCK_BYTES], i: usize) -> u8 {
        (block[i / 2] >> (4 * (i % 2))) & 15
    }

    fn deq(block: &[u8; BLOCK_BYTES], s: u8) -> [f32; MXFP4_GROUP] {
        let mut out = [0.0; MXFP4_GROUP];
        decode_block(block, s, &mut out);
        out
    }

    #[test]
    fn known_values_on_the_grid_of_scale_one() {
        // amax 6 → e = 0 (scale byte 127); every grid value maps to its own code.
        let vals = [
            0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -6.0, 0.3, 2.2, -4.9,
        ];
        let (b, s) = q(&vals);
        assert_eq!(s, 127);
        let want = [0, 1, 2, 3, 4, 5, 6, 7, 9, 15, 1, 4, 14];
        for (i, &w) in want.iter().enumerate() {
            assert_eq!(code(&b, i), w, "value {}", vals[i]);
        }
        // Element 0 in the low nibble, element 1 in the high one.
        assert_eq!(b[0], 0x10);
        assert_eq!(b[3], 0x76);
    }

    #[test]
    fn scale_is_the_smallest_power_that_fits_amax() {
        // amax ≤ 6 · 2^e, smallest e: 6 → 0, 6.0001 → 1, 3 → −1, 3.01 → 0, 12 → 1, 0.75 → −3.
        for (amax, e) in [
            (6.0f32, 0),
            (6.000_001, 1),
            (3.0, -1),
            (3.01, 0),
            (12.0, 1),
            (0.75, -3),
            (1.0, -2),
            (448.0, 7),
        ] {
            assert_eq!(scale_byte(amax.to_bits()), (e + 127) as u8, "amax {amax}");
        }
        // Against the definition, by brute force over many magnitudes (bf16 values included).
        let mut x = 0x1234_5678_9abc_def0u64;
        for _ in 0..20_000 {
            x = crate::engine::synthetic::splitmix64(x);
            let v = f32::from_bits((x as u32) % 0x7f80_0000);
            if v == 0.0 {
                continue;
            }
            let want = (-127..=127)
                .find(|&e| f64::from(v) <= 6.0 * 2f64.powi(e))
                .unwrap();
            assert_eq!(scale_byte(v.to_bits()), (want + 127) as u8, "amax {v:e}");
        }
        // Clamped at the bottom of the E8M0 range: tiny and subnormal blocks use 2^−127.
        assert_eq!(scale_byte(1), 0);
        assert_eq!(scale_byte(1e-38f32.to_bits()), 0);
        assert_eq!(scale_byte(f32::MAX.to_bits()), 253);
    }

    #[test]
    fn ties_round_to_the_even_code() {
        // amax 6 pins e = 0; each midpoint goes to the code with an even mantissa.
        let vals = [
            6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5,
            -5.0,
        ];
        let (b, s) = q(&vals);
        assert_eq!(s, 127);
        let want = [7, 0, 2, 2, 4, 4, 6, 6, 8, 10, 10, 12, 12, 14, 14];
        for (i, &w) in want.iter().enumerate() {
            assert_eq!(code(&b, i), w, "value {}", vals[i]);
        }
        // Just off a midpoint goes to the nearer side.
        let up = f32::from_bits(0.25f32.to_bits() + 1);
        let down = f32::from_bits(0.75f32.to_bits() - 1);
        let (b, _) = q(&[6.0, up, down]);
        assert_eq!((code(&b, 1), code(&b, 2)), (1, 1));
        // The same ties under another scale (amax 24 → e = 2).
        let (b, s) = q(&[24.0, 1.0, 3.0, 5.0, 20.0]);
        assert_eq!(s, 129);
        assert_eq!(
            (code(&b, 1), code(&b, 2), code(&b, 3), code(&b, 4)),
            (0, 2, 2, 6)
        );
    }

    #[test]
    fn largest_value_saturates_at_six() {
        // 5.9 is the amax: e = 0 and it rounds up to the top code 6; 5.01 too.
        let (b, s) = q(&[5.9, -5.01, 4.99]);
        assert_eq!(s, 127);
        assert_eq!((code(&b, 0), code(&b, 1), code(&b, 2)), (7, 15, 6));
        // Non-finite values: inf saturates to ±6 · 2^e, NaN becomes ±0 (loaders refuse them).
        let (b, s) = q(&[1.5, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
        assert_eq!(s, 125);
        assert_eq!((code(&b, 1), code(&b, 2), code(&b, 3)), (7, 15, 0));
        assert_eq!(code(&b, 0), 7);
    }

    #[test]
    fn zero_block_gets_the_fixed_scale() {
        let (b, s) = q(&[]);
        assert_eq!(s, ZERO_BLOCK_SCALE);
        assert_eq!(b, [0u8; BLOCK_BYTES]);
        let (b, s) = q(&[-0.0, 0.0, -0.0]);
        assert_eq!(s, ZERO_BLOCK_SCALE);
        assert_eq!((code(&b, 0), code(&b, 1), code(&b, 2)), (8, 0, 8));
        let d = deq(&b, s);
        assert!(d[0] == 0.0 && d[0].is_sign_negative() && d[1].is_sign_positive());
    }

    #[test]
    fn exactly_representable_values_round_trip() {
        let mut x = 99u64;
        let mut next = || {
            x = crate::engine::synthetic::splitmix64(x);
            x
        };
        for _ in 0..2000 {
            let mut block = [0u8; BLOCK_BYTES];
            for b in block.iter_mut() {
                *b = next() as u8;
            }
            // A top code (6 or 7) somewhere pins the scale, so the bytes come back too.
            block[(next() % 16) as usize] |= 0x06;
            let s = (next() % 253) as u8; // 6 · 2^(s−127) stays finite
            let vals = deq(&block, s);
            let (b2, s2) = quantize_block(&vals);
            assert_eq!((b2, s2), (block, s), "scale {s}");
            // Without a top code the scale may shrink, but the values still come back exactly.
            let mut low = block;
            for b in low.iter_mut() {
                *b &= 0xbb; // magnitudes ≤ 3 (codes 0..3 and 8..11)
            }
            let v1 = deq(&low, s);
            let (b3, s3) = quantize_block(&v1);
            let v2 = deq(&b3, s3);
            for (a, b) in v1.iter().zip(&v2) {
                assert_eq!(a.to_bits(), b.to_bits(), "scale {s}: {v1:?}");
            }
        }
    }

    #[test]
    fn codes_are_the_nearest_grid_point() {
        // Brute force: the chosen value minimises |v − q| over the block's grid, ties to the
        // even code, for random bf16 blocks of assorted magnitudes.
        let mut x = 7u64;
        for _ in 0..3000 {
            x = crate::engine::synthetic::splitmix64(x);
            let mag = ((x >> 40) % 40) as i32 - 20;
            let vals: Vec<f32> = (0..MXFP4_GROUP)
                .map(|i| {
                    let h = crate::engine::synthetic::element_hash(x, i as u64);
                    let u = (h >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                    half::bf16::from_f32(u * 2f32.powi(mag)).to_f32()
                })
                .collect();
            let (b, s) = quantize_block(&vals);
            let unit = f64::from(e8m0_scale(s));
            let amax = vals.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert!(f64::from(amax) <= 6.0 * unit && f64::from(amax) > 3.0 * unit);
            for (i, &v) in vals.iter().enumerate() {
                let a = f64::from(v.abs()) / unit;
                let best = (0..8usize)
                    .min_by(|&p, &q| {
                        let (dp, dq) = (
                            (f64::from(E2M1[p]) - a).abs(),
                            (f64::from(E2M1[q]) - a).abs(),
                        );
                        dp.total_cmp(&dq).then((p % 2).cmp(&(q % 2)))
                    })
                    .unwrap();
                assert_eq!(usize::from(code(&b, i) & 7), best, "{v} / {unit}");
                assert_eq!(code(&b, i) >> 3, u8::from(v.is_sign_negative()));
            }
        }
    }

    #[test]
    fn matrices_are_refused_unless_rows_are_whole_blocks() {
        let src = vec![half::bf16::from_f32(1.0); 3 * 40];
        let e = quantize_matrix("model.layers.0.self_attn.o_proj.weight", &src, 40)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("o_proj.weight") && e.contains("multiple of 32"),
            "{e}"
        );
        assert!(e.contains("--mxfp4-layers moe"), "{e}");
        let src: Vec<half::bf16> = (0..2 * 64)
            .map(|i| half::bf16::from_f32(i as f32 * 0.25 - 3.0))
            .collect();
        let (blocks, scales) = quantize_matrix("w", &src, 64).unwrap();
        assert_eq!((blocks.len(), scales.len()), (2 * 64 / 2, 4));
        let fq = fake_quantize("w", &src, 64).unwrap();
        let mut row = [0.0f32; MXFP4_GROUP];
        decode_block(&blocks[16..32], scales[1], &mut row);
        assert_eq!(
            fq[32..64].iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
            row
        );
    }
}
