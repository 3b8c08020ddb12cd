//! MXFP4 (OCP microscaling FP4) decoding: E2M1 nibbles in blocks of 32 sharing one E8M0 scale.
//!
//! Layout (HF gpt-oss release): groups of 32 run along the reduction axis of each output
//! row; byte j of a 16-byte block holds element 2j in its low nibble and 2j+1 in its high one.

use super::config::MXFP4_GROUP;

/// Bytes in one packed block of [`MXFP4_GROUP`] values.
pub const BLOCK_BYTES: usize = MXFP4_GROUP / 2;

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
        .zip(out.chunks_exact_mut(MXFP4_GROUP))
    {
        decode_block(blk, s, o);
    }
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
}
