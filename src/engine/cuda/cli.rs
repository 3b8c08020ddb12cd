//! Command-line faces of the CUDA backend (`mxtune engine selftest`).

use std::process::ExitCode;

use anyhow::{Result, bail};

use super::device::Gpu;
use super::selftest;

/// Arguments of `mxtune engine selftest`.
#[derive(Debug, Clone, clap::Args)]
pub struct SelftestArgs {
    /// Device whose kernels are checked against the CPU reference (only `cuda` has kernels).
    #[arg(long, default_value = "cuda")]
    pub device: String,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// Seed of the random inputs (default: drawn from the clock and printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Directory of oracle fixture checkpoints (one per subdirectory with a config.json) to
    /// run end to end against the CPU backend; `tests/fixtures/oracle` when it exists.
    #[arg(long)]
    pub fixtures: Option<std::path::PathBuf>,
    /// Also run every combination of the CUDA gates (--moe-kernel, --activation,
    /// --mxfp4-layers, --kv-dtype, --tile, --sinks, --cuda-graphs) end to end on the tiny
    /// synthetic model: 432 combinations, a few minutes.
    #[arg(long)]
    pub all_gates: bool,
}

/// Run the self-test; exit code 0 only when every check passed.
pub fn selftest(args: &SelftestArgs) -> Result<ExitCode> {
    if args.device != "cuda" {
        bail!(
            "engine selftest checks GPU kernels against the CPU reference; use --device cuda \
             (got {:?})",
            args.device
        );
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let g = std::sync::Arc::new(Gpu::open(args.gpu)?);
    let lr = &g.load_report;
    println!(
        "device: cuda:{} {} ({}); kernels: {} compiled, {} cached in {:.2} s ({})",
        args.gpu,
        g.name(),
        g.arch(),
        lr.compiled,
        lr.cached,
        lr.seconds,
        lr.cache_dir
    );
    for (name, regs, local, shared) in g.resources() {
        println!(
            "kernel {name:<20} registers {regs:>3}  local bytes {local:>4}  shared bytes {shared:>5}"
        );
    }
    println!("seed: {seed}");
    let mut checks = selftest::run_kernel_checks(&g, seed)?;
    let fixtures = args.fixtures.clone().or_else(|| {
        let d = std::path::PathBuf::from("tests/fixtures/oracle");
        d.is_dir().then_some(d)
    });
    match &fixtures {
        Some(d) => println!("fixtures: {}", d.display()),
        None => println!("fixtures: none (pass --fixtures DIR to run the oracle models)"),
    }
    checks.extend(selftest::run_model_checks(&g, seed, fixtures.as_deref())?);
    if args.all_gates {
        checks.extend(selftest::run_gate_matrix(&g, seed)?);
    }
    for c in &checks {
        println!("{c}");
    }
    let failed = checks.iter().filter(|c| !c.pass).count();
    println!("{} checks, {} failed", checks.len(), failed);
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
