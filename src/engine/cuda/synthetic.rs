//! Random test inputs for the self-test, drawn from engine-core's counter hash
//! (`engine::synthetic`), the same function the `fill_bf16`/`fill_u8` kernels compute.

use crate::engine::synthetic::{element_hash, unit};

pub use crate::engine::synthetic::splitmix64;

/// `n` values of the bf16 stream `seed` in `offset ± scale`, as bit patterns.
pub fn bf16_vec(seed: u64, n: usize, scale: f32, offset: f32) -> Vec<u16> {
    (0..n as u64)
        .map(|i| {
            half::bf16::from_f32(offset + scale * (2.0 * unit(element_hash(seed, i)) - 1.0))
                .to_bits()
        })
        .collect()
}

/// `n` values of the fp32 stream `seed` in `offset ± scale`.
pub fn f32_vec(seed: u64, n: usize, scale: f32, offset: f32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| offset + scale * (2.0 * unit(element_hash(seed, i)) - 1.0))
        .collect()
}

/// `n` bytes of the stream `seed` in `lo..=hi`.
pub fn u8_vec(seed: u64, n: usize, lo: u8, hi: u8) -> Vec<u8> {
    let span = u64::from(hi - lo) + 1;
    (0..n as u64)
        .map(|i| lo + (element_hash(seed, i) % span) as u8)
        .collect()
}
