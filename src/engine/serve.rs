//! `mxtune serve`: build a backend (checkpoint or synthetic model), print the kernel-path
//! report, and run the OpenAI-compatible server until SIGINT/SIGTERM.

use super::backend::ModelBackend;
use super::cpu::CpuBackend;
use super::server::{Server, ServerOptions};
use super::weights::Weights;
use super::{loader, synthetic};
use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use half::bf16;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// The best backend this build has (CPU until the CUDA backend is wired in).
    Auto,
    /// The CPU reference backend.
    Cpu,
    /// The CUDA backend.
    Cuda,
}

/// MoE kernel gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MoeKernel {
    Auto,
    Gemv,
    Grouped,
}

/// Activation format gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Activation {
    Bf16,
    Q8,
    Fp8,
}

/// MoE tile gate (grouped kernel only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Tile {
    Auto,
    #[value(name = "64x128")]
    T64x128,
    #[value(name = "128x128")]
    T128x128,
}

/// Which layers run in MXFP4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mxfp4Layers {
    #[value(name = "moe")]
    Moe,
    #[value(name = "moe,qkv,o")]
    MoeQkvO,
    #[value(name = "moe,qkv,o,lm_head")]
    All,
}

/// KV-cache element type gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvDtype {
    Bf16,
    Fp8,
}

/// An on/off gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

/// The gated paths, with the names the flags table renders.
#[derive(Debug, Clone, Args)]
pub struct Gates {
    /// MoE kernel (CUDA only).
    #[arg(long, value_enum, default_value = "auto")]
    pub moe_kernel: MoeKernel,
    /// Activation format fed to the MoE (CUDA only).
    #[arg(long, value_enum, default_value = "bf16")]
    pub activation: Activation,
    /// MoE tile of the grouped kernel (CUDA only).
    #[arg(long, value_enum, default_value = "auto")]
    pub tile: Tile,
    /// Layers kept in (or quantized at load to) MXFP4 (CUDA only).
    #[arg(long, value_enum, default_value = "moe")]
    pub mxfp4_layers: Mxfp4Layers,
    /// KV-cache element type (CUDA only).
    #[arg(long, value_enum, default_value = "bf16")]
    pub kv_dtype: KvDtype,
    /// Attention sinks; `off` is diagnostic only (gpt-oss produces garbage without them).
    #[arg(long, value_enum, default_value = "on")]
    pub sinks: OnOff,
    /// CUDA graphs for decode steps (CUDA only).
    #[arg(long, value_enum, default_value = "on")]
    pub cuda_graphs: OnOff,
}

/// Arguments of `mxtune serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Checkpoint directory in the HF release layout (config.json + *.safetensors).
    #[arg(
        long,
        required_unless_present = "synthetic",
        conflicts_with = "synthetic"
    )]
    pub model: Option<PathBuf>,
    /// Serve a synthetic model with deterministic pseudo-random weights:
    /// gpt-oss-120b, gpt-oss-20b or tiny.
    #[arg(long)]
    pub synthetic: Option<String>,
    /// Seed of the synthetic weights.
    #[arg(long, default_value_t = 0)]
    pub synthetic_seed: u64,
    /// Backend device.
    #[arg(long, value_enum, default_value = "auto")]
    pub device: Device,
    /// Address to bind (127.0.0.1 keeps the server local).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind; 0 picks a free one (the ready line says which).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Model name for the API (default: the --model path, or `synthetic-<NAME>`).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Most positions (prompt + output) per request (default: the model's maximum).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Most requests decoded together.
    #[arg(long, default_value_t = 8)]
    pub max_num_seqs: usize,
    /// Most tokens per engine step; longer prompts are prefilled in chunks.
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// KV-cache capacity in positions over all requests (default:
    /// max-num-seqs × max-model-len); requests wait for room when it is full.
    #[arg(long)]
    pub kv_cache_tokens: Option<usize>,
    /// Require `Authorization: Bearer <KEY>` on /v1/*.
    #[arg(long)]
    pub api_key: Option<String>,
    #[command(flatten)]
    pub gates: Gates,
}

/// A combination of gates no backend can run, as data: (is it this case?, why).
type Conflict = (fn(&Gates) -> bool, &'static str);

const CONFLICTS: &[Conflict] = &[(
    |g| g.tile != Tile::Auto && g.moe_kernel != MoeKernel::Grouped,
    "--tile chooses the tile of the grouped MoE kernel; add --moe-kernel grouped or drop --tile",
)];

/// Which backend serves, for the kernel-path report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
}

fn resolve_device(d: Device) -> Result<BackendKind> {
    match d {
        Device::Auto | Device::Cpu => Ok(BackendKind::Cpu),
        Device::Cuda => {
            bail!("CUDA backend not available in this build; use --device cpu (or auto)")
        }
    }
}

/// Refuse gate combinations that cannot run anywhere.
pub fn check_gates(g: &Gates) -> Result<()> {
    let problems: Vec<&str> = CONFLICTS
        .iter()
        .filter(|(hit, _)| hit(g))
        .map(|(_, why)| *why)
        .collect();
    if !problems.is_empty() {
        bail!("impossible flag combination: {}", problems.join("; "));
    }
    Ok(())
}

fn value_name<T: ValueEnum>(v: T) -> String {
    v.to_possible_value()
        .map_or_else(|| "?".into(), |p| p.get_name().to_string())
}

/// The start-up report: exactly one `kernel-path <key>=<value>` line per gated path, `n/a`
/// where the backend has no such path. The launcher's kernel-path check reads these lines.
pub fn kernel_path_lines(kind: BackendKind, g: &Gates) -> Vec<String> {
    let na = || "n/a".to_string();
    let pairs: [(&str, String); 8] = match kind {
        // The CPU reference has one path per stage; only sinks can be switched.
        BackendKind::Cpu => [
            ("backend", "cpu".into()),
            ("moe_kernel", na()),
            ("activation", na()),
            ("tile", na()),
            ("mxfp4_layers", na()),
            ("kv_dtype", na()),
            ("sinks", value_name(g.sinks)),
            ("cuda_graphs", na()),
        ],
    };
    pairs
        .into_iter()
        .map(|(k, v)| format!("kernel-path {k}={v}"))
        .collect()
}

/// Gates the backend ignores although the operator set them away from the default.
fn ignored_gates(kind: BackendKind, g: &Gates) -> Vec<String> {
    match kind {
        BackendKind::Cpu => {
            let mut v = Vec::new();
            if g.moe_kernel != MoeKernel::Auto {
                v.push(format!("--moe-kernel {}", value_name(g.moe_kernel)));
            }
            if g.activation != Activation::Bf16 {
                v.push(format!("--activation {}", value_name(g.activation)));
            }
            if g.tile != Tile::Auto {
                v.push(format!("--tile {}", value_name(g.tile)));
            }
            if g.mxfp4_layers != Mxfp4Layers::Moe {
                v.push(format!("--mxfp4-layers {}", value_name(g.mxfp4_layers)));
            }
            if g.kv_dtype != KvDtype::Bf16 {
                v.push(format!("--kv-dtype {}", value_name(g.kv_dtype)));
            }
            if g.cuda_graphs == OnOff::Off {
                v.push("--cuda-graphs off".into());
            }
            v
        }
    }
}

/// Sinks off: a sink logit of −∞ adds e^−∞ = 0 to every softmax denominator, which is
/// exactly attention without sinks, for any backend that takes these weights.
fn disable_sinks(w: &mut Weights) {
    for layer in &mut w.layers {
        let shape = layer.sinks.shape().to_vec();
        let n = layer.sinks.data().len();
        layer.sinks = super::weights::Tensor::owned(vec![bf16::NEG_INFINITY; n], shape);
    }
}

/// Everything `serve` prepared before binding: the backend and the server's options.
pub struct Prepared {
    /// The backend that will serve.
    pub backend: Box<dyn ModelBackend>,
    /// Server settings resolved from the arguments and the model config.
    pub options: ServerOptions,
    /// Lines to print before the readiness line.
    pub report: Vec<String>,
}

/// Load or build the model and resolve every setting; prints nothing.
pub fn prepare(args: &ServeArgs) -> Result<Prepared> {
    check_gates(&args.gates)?;
    let kind = resolve_device(args.device)?;
    let mut weights = match (&args.model, &args.synthetic) {
        (Some(dir), None) => loader::load(dir)
            .with_context(|| format!("loading the checkpoint in {}", dir.display()))?,
        (None, Some(name)) => synthetic::build(name, args.synthetic_seed)
            .with_context(|| format!("building synthetic model {name}"))?,
        _ => bail!("give exactly one of --model DIR or --synthetic NAME"),
    };
    if args.gates.sinks == OnOff::Off {
        disable_sinks(&mut weights);
    }
    let cfg = weights.config.clone();
    let max_model_len = args.max_model_len.unwrap_or(cfg.max_position_embeddings);
    if max_model_len > cfg.max_position_embeddings {
        bail!(
            "--max-model-len {max_model_len} exceeds the model's max_position_embeddings ({})",
            cfg.max_position_embeddings
        );
    }
    if args.max_num_seqs == 0 || args.max_num_batched_tokens == 0 {
        bail!("--max-num-seqs and --max-num-batched-tokens must be at least 1");
    }
    let kv_tokens = args
        .kv_cache_tokens
        .unwrap_or(args.max_num_seqs.saturating_mul(max_model_len));
    let served_model_name = match (&args.served_model_name, &args.synthetic, &args.model) {
        (Some(n), _, _) => n.clone(),
        (None, Some(s), _) => format!("synthetic-{s}"),
        (None, None, Some(dir)) => dir.display().to_string(),
        (None, None, None) => bail!("give --model DIR or --synthetic NAME"),
    };
    let mut report = vec![format!(
        "mxtune serve: model {} ({} layers, hidden {}, {} experts top-{}, vocab {}); \
         max-model-len {max_model_len}, max-num-seqs {}, kv-cache {kv_tokens} positions",
        weights.source,
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.num_local_experts,
        cfg.num_experts_per_tok,
        cfg.vocab_size,
        args.max_num_seqs,
    )];
    if let Some(name) = &args.synthetic {
        report.push(format!(
            "mxtune serve: synthetic model {name} (deterministic pseudo-random weights, seed {}): \
             speeds are real, generated text is meaningless",
            args.synthetic_seed
        ));
    }
    for g in ignored_gates(kind, &args.gates) {
        report.push(format!(
            "mxtune serve: warning: {g} has no effect on the cpu backend (reported n/a)"
        ));
    }
    if args.gates.sinks == OnOff::Off {
        report.push(
            "mxtune serve: warning: sinks off is diagnostic only; gpt-oss output is garbage without them"
                .into(),
        );
    }
    report.extend(kernel_path_lines(kind, &args.gates));
    let backend: Box<dyn ModelBackend> = match kind {
        BackendKind::Cpu => Box::new(CpuBackend::new(weights, kv_tokens)),
    };
    Ok(Prepared {
        backend,
        options: ServerOptions {
            served_model_name,
            max_model_len,
            max_num_seqs: args.max_num_seqs,
            max_num_batched_tokens: args.max_num_batched_tokens,
            kv_cache_tokens: kv_tokens,
            api_key: args.api_key.clone(),
        },
        report,
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

/// Run `mxtune serve` until SIGINT or SIGTERM.
pub fn run(args: ServeArgs) -> Result<ExitCode> {
    let prepared = prepare(&args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let server = Server::new(prepared.backend, prepared.options)?;
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| {
                format!(
                    "binding {}:{} (is another server on that port? choose --port)",
                    args.host, args.port
                )
            })?;
        let addr = listener.local_addr().context("reading the bound address")?;
        let mut out = std::io::stdout().lock();
        for line in &prepared.report {
            writeln!(out, "{line}")?;
        }
        writeln!(out, "mxtune serve: ready on http://{addr}")?;
        out.flush()?;
        drop(out);
        server.serve(listener, shutdown_signal()).await?;
        // stdout may be closed by now (the reader went away); that is no reason to fail.
        let _ = writeln!(std::io::stdout(), "mxtune serve: stopped");
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn parse(argv: &[&str]) -> Result<ServeArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("serve").chain(argv.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn cpu_report_has_every_key_once_in_order() {
        let a = parse(&["--synthetic", "tiny", "--sinks", "off"]).unwrap();
        assert_eq!(
            kernel_path_lines(BackendKind::Cpu, &a.gates),
            vec![
                "kernel-path backend=cpu",
                "kernel-path moe_kernel=n/a",
                "kernel-path activation=n/a",
                "kernel-path tile=n/a",
                "kernel-path mxfp4_layers=n/a",
                "kernel-path kv_dtype=n/a",
                "kernel-path sinks=off",
                "kernel-path cuda_graphs=n/a",
            ]
        );
    }

    #[test]
    fn flag_names_and_values_match_the_flags_table() {
        let a = parse(&[
            "--model",
            "/m",
            "--moe-kernel",
            "grouped",
            "--activation",
            "fp8",
            "--tile",
            "64x128",
            "--mxfp4-layers",
            "moe,qkv,o,lm_head",
            "--kv-dtype",
            "fp8",
            "--sinks",
            "on",
            "--cuda-graphs",
            "off",
        ])
        .unwrap();
        assert!(check_gates(&a.gates).is_ok());
        assert_eq!(value_name(a.gates.tile), "64x128");
        assert_eq!(value_name(a.gates.mxfp4_layers), "moe,qkv,o,lm_head");
        assert_eq!(ignored_gates(BackendKind::Cpu, &a.gates).len(), 6);
        assert!(parse(&["--model", "/m", "--synthetic", "tiny"]).is_err());
        assert!(parse(&[]).is_err());
        assert!(parse(&["--synthetic", "tiny", "--tile", "32x32"]).is_err());
    }

    #[test]
    fn impossible_combinations_and_cuda_are_refused() {
        let a = parse(&[
            "--synthetic",
            "tiny",
            "--tile",
            "64x128",
            "--moe-kernel",
            "gemv",
        ])
        .unwrap();
        let e = check_gates(&a.gates).unwrap_err().to_string();
        assert!(e.contains("--moe-kernel grouped"), "{e}");
        let e = resolve_device(Device::Cuda).unwrap_err().to_string();
        assert!(
            e.contains("CUDA backend not available in this build"),
            "{e}"
        );
        assert_eq!(resolve_device(Device::Auto).unwrap(), BackendKind::Cpu);
    }
}
