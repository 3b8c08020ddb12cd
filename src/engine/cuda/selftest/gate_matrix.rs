//! The gate matrix (`engine selftest --all-gates`): every combination of the CUDA gates, end
//! to end on the tiny synthetic model.

use anyhow::Result;

use super::fixtures::{compare_backends, mismatch_bound, tiny_reference};
use super::{Check, check};
use crate::engine::cuda::device::Gpu;
use crate::engine::cuda::gates::ActFormat;

/// Greedy agreement every gate combination must keep with its matched reference in
/// [`run_gate_matrix`]: a broken path (NaN, a kernel reading the wrong buffer) agrees on almost
/// none of the tiny model's choices, while rounding (bf16, fp8 KV, 8-bit activations, a router
/// near-tie) costs a few. The tight per-gate bounds are the regular checks.
pub const GATE_MATRIX_GREEDY_AGREEMENT: f64 = 0.5;

/// Every combination of the CUDA gates, end to end on the tiny synthetic model against the CPU
/// backend built to match it (sinks, the MXFP4 layers as dequant(quant(w)), the 8-bit
/// activations quantized alike): per combination, finite logits and greedy agreement ≥
/// [`GATE_MATRIX_GREEDY_AGREEMENT`]; the logit errors are printed. `engine selftest
/// --all-gates`.
pub fn run_gate_matrix(g: &std::sync::Arc<Gpu>, seed: u64) -> Result<Vec<Check>> {
    use crate::engine::cuda::backend::CudaBackend;
    use crate::engine::cuda::gates::{
        DecodeGemv, DecodeOptions, Fp4Layers, KvDtype, MoePath, MoeTile,
    };

    let cfg = crate::engine::synthetic::config("tiny")?;
    let mut res = Vec::new();
    let mut n = 0usize;
    // The CPU reference depends on sinks, the MXFP4 layers and the activation format; the
    // other gates change only the device path.
    let references = [true, false].into_iter().flat_map(|sinks| {
        [Fp4Layers::Moe, Fp4Layers::MoeQkvO, Fp4Layers::All]
            .into_iter()
            .flat_map(move |fp4| {
                [ActFormat::Bf16, ActFormat::Q8, ActFormat::Fp8].map(move |act| (sinks, fp4, act))
            })
    });
    let device_paths: Vec<_> = [MoePath::Auto, MoePath::Gemv, MoePath::Grouped]
        .into_iter()
        .flat_map(|moe| {
            [KvDtype::Bf16, KvDtype::Fp8]
                .into_iter()
                .flat_map(move |kv| {
                    [MoeTile::T64x128, MoeTile::T128x128]
                        .into_iter()
                        .flat_map(move |tile| {
                            [true, false].map(move |graphs| (moe, kv, tile, graphs))
                        })
                })
        })
        .collect();
    for (sinks, fp4, act) in references {
        let mut cpu = tiny_reference(seed, sinks, fp4, act)?;
        for &(moe, kv, tile, graphs) in &device_paths {
            let dw = crate::engine::cuda::weights::synthetic_device(g, &cfg, seed)?;
            let opts = DecodeOptions {
                sinks,
                kv_dtype: kv,
                moe,
                fp4_layers: fp4,
                activation: act,
                tile,
                gemv: DecodeGemv::TensorCore,
            };
            let mut be = CudaBackend::new(g.clone(), &cfg, dw, opts, 3, 64, 2, graphs)?;
            let r = compare_backends(&mut be, &mut cpu, seed)?;
            n += 1;
            let label = format!(
                "gates sinks={} moe={} act={} mxfp4_layers={} kv={} tile={} graphs={}",
                if sinks { "on" } else { "off" },
                moe.report(),
                act.name(),
                fp4.report(),
                kv.name(),
                tile.name(),
                if graphs { "on" } else { "off" },
            );
            println!(
                "info {label}: logits error worst {:.3e}, median {:.3e}, greedy mismatches {} of {}",
                r.worst, r.median, r.mismatched, r.steps
            );
            // `worst` is +inf when any logit was NaN/inf.
            res.push(check(
                format!("{label}: finite logits"),
                if r.worst.is_finite() { 0.0 } else { 1.0 },
                0.0,
            ));
            res.push(check(
                format!("{label}: greedy mismatches of {}", r.steps),
                r.mismatched as f64,
                mismatch_bound(GATE_MATRIX_GREEDY_AGREEMENT, r.steps),
            ));
        }
    }
    println!("gate matrix: {n} combinations");
    Ok(res)
}
