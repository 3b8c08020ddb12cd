//! The innermost loops of the CPU reference engine (`mxtune::engine::cpu`): dot products,
//! bf16 widening and MXFP4 block decoding.
//!
//! They live in their own crate so that the workspace's `Cargo.toml` can build them
//! optimised in debug builds too (`[profile.dev.package.mxtune-cpu-kernels]`): unoptimised,
//! the tiny synthetic model's 201k-row unembedding made every CPU-engine test spend most of
//! its time stepping range iterators. The results are the same at every opt-level: the
//! loops fix their order of summation and Rust does not reassociate floats.

use half::bf16;

/// fp32 dot product with 8 independent partial sums (lets the compiler use SIMD).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (xa, xb) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += xa[k] * xb[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `out[t] = dot(w, x_t) + bias` for each row `x_t` (width `w.len()`) of `x`.
pub fn dot_rows(w: &[f32], x: &[f32], bias: f32, out: &mut [f32]) {
    for (o, xr) in out.iter_mut().zip(x.chunks_exact(w.len())) {
        *o = dot(w, xr) + bias;
    }
}

/// `out += p · v`, element by element.
pub fn axpy(p: f32, v: &[f32], out: &mut [f32]) {
    for (o, vi) in out.iter_mut().zip(v) {
        *o += p * vi;
    }
}

/// Widens a bf16 row into `out` (same length).
pub fn widen_bf16(row: &[bf16], out: &mut [f32]) {
    for (o, v) in out.iter_mut().zip(row) {
        *o = v.to_f32();
    }
}

/// MXFP4 (OCP microscaling FP4): E2M1 nibbles in blocks of 32 sharing one E8M0 scale.
///
/// Layout (HF gpt-oss release): groups of 32 run along the reduction axis of each output
/// row; byte j of a 16-byte block holds element 2j in its low nibble and 2j+1 in its high one.
pub mod mxfp4 {
    /// Values sharing one scale.
    pub const GROUP: usize = 32;

    /// Bytes in one packed block of [`GROUP`] values.
    pub const BLOCK_BYTES: usize = GROUP / 2;

    /// E2M1 value of each nibble 0..15 (bit 3 is the sign).
    pub const E2M1: [f32; 16] = [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];

    /// 2^(s−127) for an E8M0 scale byte, as `ldexp` computes it (0 → 2^−127, 255 → +inf).
    pub fn e8m0_scale(s: u8) -> f32 {
        match s {
            0 => f32::from_bits(0x0040_0000),
            255 => f32::INFINITY,
            _ => f32::from_bits(u32::from(s) << 23),
        }
    }

    /// Decode one 16-byte block into its 32 values (scale applied).
    pub fn decode_block(block: &[u8], scale: u8, out: &mut [f32]) {
        let s = e8m0_scale(scale);
        for (j, &b) in block.iter().enumerate().take(BLOCK_BYTES) {
            out[2 * j] = E2M1[usize::from(b & 0x0F)] * s;
            out[2 * j + 1] = E2M1[usize::from(b >> 4)] * s;
        }
    }

    /// Decode a whole packed row (`cols / 32` blocks and scales) into `out` (length `cols`).
    pub fn decode_row(blocks: &[u8], scales: &[u8], out: &mut [f32]) {
        for ((blk, &s), o) in blocks
            .chunks_exact(BLOCK_BYTES)
            .zip(scales)
            .zip(out.chunks_exact_mut(GROUP))
        {
            decode_block(blk, s, o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_sums_every_element_including_the_tail() {
        let a: Vec<f32> = (0..19).map(|i| i as f32).collect();
        let b = vec![2.0f32; 19];
        assert_eq!(dot(&a, &b), 2.0 * (0..19).sum::<i32>() as f32);
        let mut out = [0.0; 2];
        dot_rows(&[1.0, -1.0], &[3.0, 1.0, 5.0, 7.0], 0.5, &mut out);
        assert_eq!(out, [2.5, -1.5]);
    }

    #[test]
    fn mxfp4_nibbles_decode_low_first_with_the_scale() {
        let mut block = [0u8; mxfp4::BLOCK_BYTES];
        block[0] = 0x9F; // low nibble 0xF = -6, high nibble 0x9 = -0.5
        let mut out = [0.0f32; mxfp4::GROUP];
        mxfp4::decode_block(&block, 128, &mut out);
        assert_eq!((out[0], out[1], out[2]), (-12.0, -1.0, 0.0));
        assert_eq!(mxfp4::e8m0_scale(0), 2f32.powi(-127));
        assert!(mxfp4::e8m0_scale(255).is_infinite());
    }
}
