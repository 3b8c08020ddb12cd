//! `mxtune engine selftest --device cuda`: every kernel against its CPU reference on fresh
//! random inputs. Outputs are poisoned with NaN before each run, so an element a kernel
//! fails to write fails the check; NaN never passes.
//!
//! By what they check: `kernels` (each kernel against its CPU reference, `run_kernel_checks`),
//! `fixtures` (end to end through `CudaBackend` against the CPU backend: the tiny synthetic
//! model and the oracle fixtures, `run_model_checks`), `gate_matrix` (every gate combination,
//! `run_gate_matrix`); here the [`Check`] each reports and what they share.

use anyhow::Result;

use super::device::Gpu;

mod fixtures;
mod gate_matrix;
mod kernels;

pub use fixtures::{
    E2E_ACT8_LOGIT_BOUND, E2E_ACT8_PLAIN_GREEDY_AGREEMENT, E2E_BATCHED_LOGIT_BOUND,
    E2E_BF16_GREEDY_AGREEMENT, E2E_FIXTURE_GREEDY_AGREEMENT, E2E_FP8_GREEDY_AGREEMENT,
    E2E_FP8_LOGIT_BOUND, E2E_LOGIT_BOUND, E2E_SYNTHETIC_GREEDY_AGREEMENT, greedy_mismatch_bound,
    mismatch_bound, run_model_checks,
};
pub use gate_matrix::{GATE_MATRIX_GREEDY_AGREEMENT, run_gate_matrix};
pub use kernels::{
    SAMPLE_MARGIN, SampleCase, act8_moe_bound, mxfp4_quantizer_inputs, run_kernel_checks,
    sampling_cases,
};

/// One kernel check.
#[derive(Debug, Clone)]
pub struct Check {
    /// Kernel and case.
    pub name: String,
    /// ‖gpu − ref‖ / ‖ref‖ (or mismatches for index outputs).
    pub error: f64,
    /// The bound the error must stay under.
    pub bound: f64,
    /// Whether it passed (bound met and no NaN).
    pub pass: bool,
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:<44} error {:.3e}  bound {:.0e}",
            if self.pass { "PASS" } else { "FAIL" },
            self.name,
            self.error,
            self.bound
        )
    }
}

/// Relative L2 error; any NaN/inf in `got` gives +inf.
pub fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    if got.len() != want.len() || got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (f64::from(*g) - w).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den.max(1e-300)).sqrt()
}

/// Elements whose bits differ between `a` and `b`, plus any difference in length (0 when the
/// two are bit-identical).
pub fn bits_apart(a: &[f32], b: &[f32]) -> f64 {
    (a.iter()
        .zip(b)
        .filter(|(p, q)| p.to_bits() != q.to_bits())
        .count()
        + a.len().abs_diff(b.len())) as f64
}

fn check(name: impl Into<String>, error: f64, bound: f64) -> Check {
    Check {
        name: name.into(),
        error,
        bound,
        pass: error.is_finite() && error <= bound,
    }
}

/// Seeds for one self-test run: each input draws its own stream.
struct Seeds(u64);

impl Seeds {
    fn next(&mut self) -> u64 {
        self.0 = super::synthetic::splitmix64(self.0);
        self.0
    }
}

fn nan_f32(g: &Gpu, n: usize) -> Result<cudarc::driver::CudaSlice<f32>> {
    g.upload(&vec![f32::NAN; n])
}
