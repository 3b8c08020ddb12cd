//! The counter-based generator behind synthetic weights, bit-identical to
//! `engine-kernels/synthetic.cu`, so the host can recompute any element the GPU generated.

/// SplitMix64 finaliser of `z + golden`.
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn hash(seed: u64, i: u64) -> u64 {
    splitmix64(seed ^ i.wrapping_mul(0xd134_2543_de82_ef95))
}

/// Uniform in [0, 1) with 24 bits, element `i` of stream `seed`.
pub fn unit_uniform(seed: u64, i: u64) -> f32 {
    (hash(seed, i) >> 40) as f32 * (1.0 / 16_777_216.0)
}

/// Element `i` of `fill_bf16(seed, scale, offset)` as a bf16 bit pattern.
pub fn bf16_at(seed: u64, i: u64, scale: f32, offset: f32) -> u16 {
    half::bf16::from_f32(offset + scale * (2.0 * unit_uniform(seed, i) - 1.0)).to_bits()
}

/// Element `i` of `fill_u8(seed, lo, hi)`.
pub fn u8_at(seed: u64, i: u64, lo: u8, hi: u8) -> u8 {
    let span = u64::from(hi - lo) + 1;
    lo + (hash(seed, i) % span) as u8
}

/// `n` values of a uniform bf16 stream (host-side inputs for tests and the CPU reference).
pub fn bf16_vec(seed: u64, n: usize, scale: f32, offset: f32) -> Vec<u16> {
    (0..n as u64)
        .map(|i| bf16_at(seed, i, scale, offset))
        .collect()
}

/// `n` values of a uniform fp32 stream in `offset ± scale`.
pub fn f32_vec(seed: u64, n: usize, scale: f32, offset: f32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| offset + scale * (2.0 * unit_uniform(seed, i) - 1.0))
        .collect()
}

/// `n` bytes of a uniform byte stream in `lo..=hi`.
pub fn u8_vec(seed: u64, n: usize, lo: u8, hi: u8) -> Vec<u8> {
    (0..n as u64).map(|i| u8_at(seed, i, lo, hi)).collect()
}
