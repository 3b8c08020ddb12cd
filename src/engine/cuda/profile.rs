//! `mxtune engine profile`: one decode step of a synthetic model on the GPU, measured as
//! METHOD.md asks — bytes counted first, GPU time from events, the read-bandwidth roofline
//! measured in the same run. The bytes are those of the step the batch really ran
//! (`roofline::decode_step_bytes`: the experts its rows routed to, each row's K/V).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};

use super::backend::CudaBackend;
use super::clocks;
use super::device::Gpu;
use super::gates::{DecodeGemv, DecodeOptions, KvDtype};
use super::model::{ATTN_MIN_SPLIT, Decoder, Profile};
use super::roofline::{self, StepBytes, StepGroup};
use super::timeline;
use super::{ops, weights};
use crate::engine::backend::{ModelBackend, RowSample, SeqId, SeqStep};
use crate::engine::config::ModelConfig;
use crate::engine::sampling::{Sampler, SamplingParams};
use crate::engine::serve::{self, Activation, Mxfp4Layers, OnOff, Tile};
use crate::engine::synthetic;
use crate::record::perfrows::{self, PerfKind, PerfRow};

/// Arguments of `mxtune engine profile`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProfileArgs {
    /// Synthetic model shape: gpt-oss-120b, gpt-oss-20b or tiny.
    #[arg(long, default_value = "gpt-oss-120b")]
    pub synthetic: String,
    /// Context tokens already in the KV cache before the measured steps.
    #[arg(long, default_value_t = 0)]
    pub depth: usize,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Decode steps timed (after 3 warm-up steps).
    #[arg(long, default_value_t = 64)]
    pub steps: usize,
    /// Attention sinks on|off.
    #[arg(long, value_enum, default_value = "on")]
    pub sinks: OnOff,
    /// KV cache element type: bf16, f32 or fp8 (E4M3).
    #[arg(long, default_value = "bf16", value_parser = ["bf16", "f32", "fp8"])]
    pub kv_dtype: String,
    /// Layers in MXFP4 (as `serve --mxfp4-layers`): the experts only, or also the attention
    /// qkv/o projections (and the lm_head), quantized on the device at load.
    #[arg(long, value_enum, default_value = "moe")]
    pub mxfp4_layers: Mxfp4Layers,
    /// Activation format of the decode (GEMV) MoE: bf16 (fp32 staged, the reference path),
    /// q8 or fp8 (8-bit per block of 32); the prefill's grouped MoE stays bf16.
    #[arg(long, value_enum, default_value = "bf16")]
    pub activation: Activation,
    /// Tile of the grouped (prefill) MoE: auto (per prefill pass: 32x128 up to 32 routed rows
    /// an expert, 64x128 up to 64, else 128x128), 32x128, 64x128 or 128x128.
    #[arg(long, value_enum, default_value = "auto")]
    pub tile: Tile,
    /// Also time a prefill of this many prompt tokens through the batched path, for each of
    /// the `--batch` sequences (after `--depth` cached positions), all in one step as a
    /// server's step of that many arriving prompts; 0 skips it.
    #[arg(long, default_value_t = 0)]
    pub prefill: usize,
    /// Rows of one prefill pass, as `serve --max-num-batched-tokens` (a step's prompts run in
    /// passes of this many rows). Default: serve's default for the device (8192 on GPUs of
    /// at least 70 GiB other than the A100, else 2048).
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// KV positions per sequence, as `serve --max-model-len`: the captured decode graph is
    /// sized for them (its attention grids cover every position), so this times the step a
    /// server with that limit runs. Default: just what the measured steps need.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// Also time the graph step without each kernel group in turn (its values then wrong,
    /// its time real): each group's marginal cost in the captured step.
    #[arg(long)]
    pub ablate: bool,
    /// Append this run's figures to a JSON array file (the schema of docs/perf/h100.json):
    /// a decode row (graphs on), and a prefill row with `--prefill`. Created when missing;
    /// a file that is not a JSON array is refused before the run, untouched.
    #[arg(long, value_name = "FILE")]
    pub json_out: Option<PathBuf>,
    /// Also put one graph step on a time line, kernel by kernel: each block's entry and the
    /// moment its wait on the previous kernel ends (the kernels compiled to record them, so
    /// every figure of this run is a little slow: not with `--json-out`).
    #[arg(long)]
    pub timeline: bool,
}

/// The `--kv-dtype` value (checked by clap: bf16, f32 or fp8).
fn kv_dtype(v: &str) -> KvDtype {
    match v {
        "f32" => KvDtype::F32,
        "fp8" => KvDtype::Fp8,
        _ => KvDtype::Bf16,
    }
}

/// Multiply-adds ×2 of one prompt token at position `pos` (dense projections, router, the k
/// routed experts, attention over its keys); the lm_head is left out (prefill runs it for
/// the last row only).
pub fn flops_per_prompt_token(c: &ModelConfig, pos: usize) -> f64 {
    let (h, hq, hkv, d) = (
        c.hidden_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
    );
    let (e, k, i) = (
        c.num_local_experts,
        c.num_experts_per_tok,
        c.intermediate_size,
    );
    let mut total = 0.0;
    for &sliding in &c.layer_is_sliding {
        let keys = if sliding {
            (pos + 1).min(c.sliding_window)
        } else {
            pos + 1
        };
        let macs = (hq + 2 * hkv) * d * h + h * hq * d + e * h + k * 3 * i * h + 2 * keys * hq * d;
        total += 2.0 * macs as f64;
    }
    total
}

fn ev(g: &Gpu) -> Result<cudarc::driver::CudaEvent> {
    g.context()
        .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| anyhow::anyhow!("creating a CUDA event: {:?}", e.0))
}

fn elapsed(a: &cudarc::driver::CudaEvent, b: &cudarc::driver::CudaEvent) -> Result<f64> {
    a.elapsed_ms(b)
        .map(f64::from)
        .map_err(|e| anyhow::anyhow!("reading CUDA event time: {:?}", e.0))
}

fn record(g: &Gpu, e: &cudarc::driver::CudaEvent) -> Result<()> {
    e.record(g.stream())
        .map_err(|e| anyhow::anyhow!("recording a CUDA event: {:?}", e.0))
}

/// Median of a non-empty list.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Measured read bandwidth in GB/s: median of 10 reads of a 4 GiB buffer.
fn read_bandwidth(g: &Gpu) -> Result<f64> {
    let bytes = 4usize << 30;
    let buf = g.alloc::<u8>(bytes)?;
    ops::fill_u8(g, g.ptr(&buf), bytes, 7, 0, 255)?;
    let sink = g.alloc::<u32>(ops::PROBE_THREADS)?;
    let mut times = Vec::new();
    for rep in 0..12 {
        let ms = gpu_ms(g, || ops::read_probe(g, g.ptr(&buf), bytes, g.ptr(&sink)))?;
        if rep >= 2 {
            times.push(ms);
        }
    }
    Ok(bytes as f64 / (median(times) * 1e-3) / 1e9)
}

/// The prefill pass `--max-num-batched-tokens` asks for, checked before the GPU is opened
/// (`None`: the device's default, known once it is).
fn prefill_pass(args: &ProfileArgs) -> Result<Option<usize>> {
    let limit = super::model::PREFILL_ROWS_LIMIT;
    match args.max_num_batched_tokens {
        Some(n) if !(1..=limit).contains(&n) => bail!(
            "--max-num-batched-tokens {n}: a prefill pass holds 1 to {limit} rows; give a \
             value in that range"
        ),
        v => Ok(v),
    }
}

/// KV positions per sequence: `--max-model-len`, or what the measured steps need rounded up.
fn cache_positions(args: &ProfileArgs) -> Result<usize> {
    let needed = args.depth + (args.steps + 8).max(args.prefill);
    match args.max_model_len {
        Some(m) if m < needed => bail!(
            "--max-model-len {m} is shorter than the {needed} positions --depth {} and --steps {} \
             (or --prefill {}) need; raise it or lower those",
            args.depth,
            args.steps,
            args.prefill
        ),
        Some(m) => Ok(m),
        None => Ok(needed.div_ceil(ATTN_MIN_SPLIT) * ATTN_MIN_SPLIT),
    }
}

/// Run the profile and print its report.
pub fn run(args: &ProfileArgs) -> Result<()> {
    let cfg = synthetic::config(&args.synthetic)?;
    ensure!(
        args.batch > 0 && args.steps > 0,
        "--batch and --steps must be positive"
    );
    // Checked before the GPU is opened and the weights generated.
    let max_pos = cache_positions(args)?;
    let pass = prefill_pass(args)?;
    ensure!(
        !(args.timeline && args.json_out.is_some()),
        "--timeline runs instrumented kernels, slower than the real ones: its figures are not \
         rows of record; leave out --json-out (or --timeline)"
    );
    if let Some(path) = &args.json_out {
        perfrows::check_file(path)?;
    }
    let sinks = args.sinks == OnOff::On;
    let t_open = Instant::now();
    let g = Arc::new(if args.timeline {
        Gpu::open_timeline(args.gpu)?
    } else {
        Gpu::open(args.gpu)?
    });
    let lr = &g.load_report;
    println!(
        "device: {} ({}); kernels {} compiled, {} cached, {:.2} s to load; open {:.2} s",
        g.name(),
        g.arch(),
        lr.compiled,
        lr.cached,
        lr.seconds,
        t_open.elapsed().as_secs_f64()
    );
    let bw = read_bandwidth(&g).context("measuring read bandwidth")?;
    println!("read bandwidth (4 GiB streamed read, median of 10): {bw:.0} GB/s");
    let t_w = Instant::now();
    let w = weights::synthetic_device(&g, &cfg, 0x6770_7400)?;
    let fp4_layers = serve::fp4_layers(args.mxfp4_layers);
    println!(
        "synthetic {} weights generated on the device in {:.2} s",
        args.synthetic,
        t_w.elapsed().as_secs_f64()
    );
    // The server's backend, so the served step (sampling kernel, token copy) can be timed
    // too; its decoder is timed directly for the kernel and graph figures.
    let mut be = CudaBackend::new(
        g.clone(),
        &cfg,
        w,
        DecodeOptions {
            sinks,
            kv_dtype: kv_dtype(&args.kv_dtype),
            tile: serve::moe_tile(args.tile),
            fp4_layers,
            activation: serve::act_format(args.activation),
            gemv: DecodeGemv::from_env()?,
            ..DecodeOptions::default()
        },
        args.batch,
        max_pos,
        args.batch,
        true,
    )?;
    let dec = be.decoder_mut();
    dec.fill_kv(&g, 0x4b56)?;
    let o = dec.options();
    println!(
        "kv cache {} ({} byte(s) per element), grouped moe tile {} (prefill)",
        o.kv_dtype.name(),
        o.kv_dtype.size(),
        o.tile.name()
    );
    let b = args.batch;
    let slots: Vec<u32> = (0..b as u32).collect();
    let toks: Vec<u32> = (0..b as u32).map(|i| 1000 + i).collect();
    let per_tok =
        roofline::batch_one_bytes(&cfg, fp4_layers, dec.options().kv_dtype.size(), args.depth)?;
    println!(
        "model {}: {} layers, {} experts; mxfp4 layers {} (dense projections + lm_head held: \
         {:.3} GB); batch {b}, depth {}; activation {}; bytes/token at batch 1 (counted): \
         {:.3} GB",
        args.synthetic,
        cfg.num_hidden_layers,
        cfg.num_local_experts,
        fp4_layers.report(),
        dec.dense_bytes() as f64 / 1e9,
        args.depth,
        dec.options().activation.report(),
        per_tok as f64 / 1e9
    );
    // Per-kernel GPU time (events between kernel groups; the events add small gaps).
    let mut prof = Profile::default();
    let pos: Vec<u32> = vec![args.depth as u32; b];
    dec.set_inputs(&g, &toks, &pos, &slots)?;
    dec.run_profiled(&g, b, args.depth + 1, &mut Profile::default())?;
    for _ in 0..5 {
        dec.run_profiled(&g, b, args.depth + 1, &mut prof)?;
    }
    let prof_bytes = last_step_bytes(&g, dec, &vec![args.depth; b])?;
    print_profile(
        &prof,
        5.0,
        &format!(
            "per-kernel GPU time of one decode step (mean of 5 profiled steps), bytes counted \
             for its batch of {b}"
        ),
        Some((&prof_bytes, bw)),
    );
    // (graphs, median ms, mean ms, std ms, median host wall ms) of the timed steps.
    let mut timed = Vec::new();
    let mut clock = None;
    for graphs in [false, true] {
        // NVML's SM clock while the graph steps run (clocks.rs: what an instruction-bound
        // kernel's time moves with).
        let watch = graphs.then(|| clocks::ClockWatch::start(g.pci_bus_id().ok()));
        let (times, walls) = time_steps(&g, dec, &toks, &slots, args, graphs)?;
        if let Some(w) = watch {
            clock = Some(w.finish());
        }
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        let sd =
            (times.iter().map(|t| (t - mean).powi(2)).sum::<f64>() / times.len() as f64).sqrt();
        timed.push((graphs, median(times), mean, sd, median(walls)));
    }
    // The last timed step (graphs on) is the one counted: its rows' positions, its routing.
    let last = args.depth + 2 + args.steps;
    let step = last_step_bytes(&g, dec, &vec![last; b])?;
    println!(
        "counted bytes of the last timed step (batch {b}, each row at position {last}): {:.3} GB \
         = dense weights {:.3} + experts {:.3} ({} distinct (layer, expert) pairs of {} routed; \
         the model has {}) + KV {:.3}",
        step.total() as f64 / 1e9,
        (step.total() - step.experts() - step.kv()) as f64 / 1e9,
        step.experts() as f64 / 1e9,
        step.distinct_experts(),
        cfg.num_hidden_layers * b * cfg.num_experts_per_tok,
        cfg.num_hidden_layers * cfg.num_local_experts,
        step.kv() as f64 / 1e9
    );
    let bytes = step.total() as f64;
    let mut decode_row = None;
    for &(graphs, med, mean, sd, wall) in &timed {
        let tps = b as f64 / (med * 1e-3);
        let achieved = bytes / (med * 1e-3) / 1e9;
        let pct = 100.0 * achieved / bw;
        println!(
            "decode step, graphs {}: median {:.3} ms (mean {:.3} ± {:.3}, n={}) -> {:.1} tok/s; \
             counted bytes at {:.0} GB/s = {:.1}% of the measured read roofline ({:.1} tok/s)",
            if graphs { "on " } else { "off" },
            med,
            mean,
            sd,
            args.steps,
            tps,
            achieved,
            pct,
            b as f64 * bw * 1e9 / bytes
        );
        println!("  host wall per step (inputs, launch, sync): median {wall:.3} ms");
        if graphs {
            let p = roofline::project_step(b, bytes, med, bw, roofline::GB10_BANDWIDTH_GBS);
            println!(
                "  GB10 projection (not a measurement; docs/perf.md): the same {pct:.1}% of {} \
                 GB/s gives {:.1} tok/s; these bytes at {} GB/s plus twice this step's {:.3} ms \
                 beyond its bytes give {:.1} tok/s",
                roofline::GB10_BANDWIDTH_GBS,
                p.share,
                roofline::GB10_BANDWIDTH_GBS,
                p.beyond_ms,
                p.latency
            );
            decode_row = Some(PerfRow {
                sm_clock_mhz: clock.as_ref().and_then(clocks::ClockReport::median_mhz),
                ..PerfRow::now(
                    &args.synthetic,
                    fp4_layers.layout_name(),
                    PerfKind::Decode,
                    b,
                    args.depth,
                    tps,
                    Some(pct),
                    bw,
                )
            });
        }
    }
    if let Some(c) = &clock {
        println!("  {}", c.line("during the timed graph steps"));
    }
    if let Some(&(_, med, ..)) = timed.iter().find(|t| t.0) {
        let b2b = back_to_back(&g, dec, &toks, &slots, args)?;
        println!(
            "  graphs enqueued back to back ({BACK_TO_BACK} steps between two events, the same \
             inputs): {b2b:.3} ms a step; the single step's median is {:.3} ms above it (the \
             launch's start on the device and the boundary between graphs)",
            med - b2b
        );
    }
    host_side(&g, dec, &toks, &slots, args)?;
    let sampled = dec.sampled(&g, b)?;
    println!("last sampled ids: {sampled:?}");
    if args.ablate {
        let base = timed.iter().find(|t| t.0).map_or(0.0, |t| t.1);
        ablate(&g, dec, &toks, &slots, args, base)?;
    }
    if args.timeline {
        step_timeline(&g, dec, &toks, &slots, args)?;
    }
    let mut rows: Vec<PerfRow> = decode_row.into_iter().collect();
    if args.prefill > 0 {
        let pass = pass.unwrap_or_else(|| {
            serve::default_max_num_batched_tokens(Some((g.name(), g.total_mem())))
        });
        dec.reserve_prefill(&g, pass).with_context(|| {
            format!("allocating the prefill pass of {pass} rows (--max-num-batched-tokens)")
        })?;
        let med = profile_prefill(&g, dec, &cfg, args.depth, args.prefill, b)?;
        // A prefill is compute-bound: no bandwidth roofline share.
        rows.push(PerfRow::now(
            &args.synthetic,
            fp4_layers.layout_name(),
            PerfKind::Prefill,
            b,
            args.depth,
            (b * args.prefill) as f64 / (med * 1e-3),
            None,
            bw,
        ));
    }
    profile_served(&mut be, args.steps, b)?;
    if let Some(path) = &args.json_out {
        perfrows::append(path, &rows)?;
        println!("appended {} row(s) to {}", rows.len(), path.display());
    }
    Ok(())
}

/// Run `args.steps` decode steps of `toks` in `slots` (after 3 untimed ones), each at the
/// next position from `args.depth`, with or without the captured graph; each step's GPU time
/// (events around it) and host wall time, in ms.
fn time_steps(
    g: &Gpu,
    dec: &mut Decoder,
    toks: &[u32],
    slots: &[u32],
    args: &ProfileArgs,
    graphs: bool,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let b = toks.len();
    let (mut times, mut walls) = (Vec::new(), Vec::new());
    for rep in 0..3 + args.steps {
        let p: Vec<u32> = vec![(args.depth + rep) as u32; b];
        let t0 = Instant::now();
        let ms = timed_step(g, dec, toks, &p, slots, args.depth + rep + 1, graphs)?;
        if rep >= 3 {
            times.push(ms);
            walls.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok((times, walls))
}

/// Where the host's share of a step goes, by wall clock (medians of 20): the inputs' upload
/// (`set_inputs`) and a sync; an empty sync; the graph's launch and sync beyond the step's GPU
/// time (events around the launch).
fn host_side(
    g: &Gpu,
    dec: &mut Decoder,
    toks: &[u32],
    slots: &[u32],
    args: &ProfileArgs,
) -> Result<()> {
    let b = toks.len();
    let at = args.depth + 3 + args.steps;
    let pos = vec![at as u32; b];
    let (mut up, mut empty, mut over) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..20 {
        g.sync()?;
        let t = Instant::now();
        dec.set_inputs(g, toks, &pos, slots)?;
        g.sync()?;
        up.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        g.sync()?;
        empty.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        let ms = gpu_ms(g, || dec.run(g, b, at + 1, true))?;
        over.push(t.elapsed().as_secs_f64() * 1e6 - ms * 1e3);
    }
    println!(
        "  host side of a step (wall clock, medians of 20): inputs uploaded and synced {:.1} µs, \
         an empty sync {:.1} µs, the graph's launch and sync beyond its GPU time {:.1} µs",
        median(up),
        median(empty),
        median(over)
    );
    Ok(())
}

/// Steps enqueued at once by [`back_to_back`].
const BACK_TO_BACK: usize = 8;

/// The graph step launched [`BACK_TO_BACK`] times in a row between two events, its inputs set
/// once (each launch recomputes the same step at the position after the timed ones): the GPU
/// time a step when the host never leaves the device idle between steps, in ms (the median of
/// five such runs).
fn back_to_back(
    g: &Gpu,
    dec: &mut Decoder,
    toks: &[u32],
    slots: &[u32],
    args: &ProfileArgs,
) -> Result<f64> {
    let b = toks.len();
    let at = args.depth + 3 + args.steps;
    dec.set_inputs(g, toks, &vec![at as u32; b], slots)?;
    let mut runs = Vec::new();
    for _ in 0..5 {
        let ms = gpu_ms(g, || {
            (0..BACK_TO_BACK).try_for_each(|_| dec.run(g, b, at + 1, true))
        })?;
        runs.push(ms / BACK_TO_BACK as f64);
    }
    Ok(median(runs))
}

/// One decode step of `toks` at positions `pos` in `slots` (keys up to `keys`), with or
/// without the captured graph: its GPU time ([`gpu_ms`]).
fn timed_step(
    g: &Gpu,
    dec: &mut Decoder,
    toks: &[u32],
    pos: &[u32],
    slots: &[u32],
    keys: usize,
    graphs: bool,
) -> Result<f64> {
    dec.set_inputs(g, toks, pos, slots)?;
    gpu_ms(g, || dec.run(g, toks.len(), keys, graphs))
}

/// The GPU time of what `work` enqueues, run to completion: events recorded around it, in ms.
fn gpu_ms(g: &Gpu, work: impl FnOnce() -> Result<()>) -> Result<f64> {
    let (a, e) = (ev(g)?, ev(g)?);
    record(g, &a)?;
    work()?;
    record(g, &e)?;
    g.sync()?;
    elapsed(&a, &e)
}

/// `--timeline`: the graph captured afresh so its launches are logged, replayed once to warm
/// it, then once more with its blocks recorded: each kernel's share of the step's critical
/// path (timeline.rs).
fn step_timeline(
    g: &Gpu,
    dec: &mut Decoder,
    toks: &[u32],
    slots: &[u32],
    args: &ProfileArgs,
) -> Result<()> {
    let b = toks.len();
    let pos = args.depth + 3 + args.steps;
    // Dropping the graphs makes the step capture its launches again (into the log).
    dec.set_ablated(&[]);
    g.timeline_reset(true)?;
    dec.set_inputs(g, toks, &vec![pos as u32; b], slots)?;
    dec.run(g, b, pos + 1, true)?;
    g.timeline_reset(false)?;
    let step_ms = timed_step(g, dec, toks, &vec![pos as u32 + 1; b], slots, pos + 2, true)?;
    let (records, launches, dropped) = g.timeline_read()?;
    ensure!(
        !dropped,
        "the step's blocks left more than {} timeline records",
        timeline::CAPACITY
    );
    let placed = timeline::place(&launches, &records).map_err(|e| {
        anyhow::anyhow!("the timeline's records do not match the step's launches: {e}")
    })?;
    println!(
        "timeline of one graph step (instrumented kernels: {step_ms:.3} ms; {} launches, {} \
         blocks): crit = from a kernel's wait ending (its predecessor done) to the next \
         kernel's, summed over its runs; lead = how long before that its first block entered; \
         early = its blocks resident by then",
        launches.len(),
        records.len()
    );
    print!(
        "{}",
        timeline::table(&timeline::summarize(&placed), step_ms * 1e3)
    );
    Ok(())
}

/// `--ablate`: the graph step timed again without each kernel group in turn (the values it
/// computes are then wrong; the time is real), so each group's marginal cost in the captured
/// step shows — what the graph saves if the group cost nothing, which the per-kernel table's
/// events (a gap at every group boundary) overstate. `base` is the full step's median (ms).
fn ablate(
    g: &Gpu,
    dec: &mut Decoder,
    toks: &[u32],
    slots: &[u32],
    args: &ProfileArgs,
    base: f64,
) -> Result<()> {
    println!(
        "ablation (graphs on, each group left out of the step in turn; its values wrong, its \
         time real):"
    );
    println!(
        "  {:<36} {:>9} {:>9} {:>7}",
        "left out", "step ms", "saves ms", "share"
    );
    for group in StepGroup::ALL
        .into_iter()
        .filter(|&s| s != StepGroup::Embed)
    {
        dec.set_ablated(&[group]);
        let (times, _) = time_steps(g, dec, toks, slots, args, true)?;
        let med = median(times);
        println!(
            "  {:<36} {:>9.3} {:>9.3} {:>6.1}%",
            group.label(false),
            med,
            base - med,
            100.0 * (base - med) / base
        );
    }
    dec.set_ablated(&[]);
    Ok(())
}

/// The bytes of the step `dec` ran last, its rows at `depths`: the experts it routed to,
/// read back from the device and counted per layer.
fn last_step_bytes(g: &Gpu, dec: &Decoder, depths: &[usize]) -> Result<StepBytes> {
    let routed = dec.routed_experts(g, depths.len())?;
    let o = dec.options();
    roofline::decode_step_bytes(
        dec.config(),
        o.fp4_layers,
        o.kv_dtype.size(),
        depths,
        &roofline::distinct_experts(&routed),
    )
}

/// Time the step the server runs per decoded token: `forward_sampled` (inputs, the graph,
/// the sampling kernel, the token copy back), greedy and at temperature 1, for `batch` fresh
/// sequences, each fed its own first token and sampling with its own seed — the engine's share
/// of the served time per token, without scheduler and HTTP.
fn profile_served(be: &mut CudaBackend, steps: usize, batch: usize) -> Result<()> {
    for (label, temperature) in [("greedy", 0.0f32), ("temperature 1.0", 1.0)] {
        let seqs = (0..batch)
            .map(|_| {
                be.alloc_seq(steps + 8)
                    .context("no free KV slot for the served-step timing")
            })
            .collect::<Result<Vec<SeqId>>>()?;
        // Each row its own first token and its own draws: rows fed alike stay alike, route
        // to the same experts and time a degenerate MoE (at batch 16 all rows on 4 experts).
        let mut samplers: Vec<Sampler> = (0..batch)
            .map(|b| {
                Sampler::new(SamplingParams {
                    temperature,
                    seed: Some(7 + b as u64),
                    max_tokens: steps + 8,
                    ignore_eos: true,
                    ..SamplingParams::default()
                })
            })
            .collect();
        let vocab = be.config().vocab_size as u32;
        let mut last: Vec<u32> = (0..batch as u32)
            .map(|b| (1000 + 7919 * b) % vocab)
            .collect();
        let mut walls = Vec::new();
        for rep in 0..3 + steps {
            let toks = last.clone();
            let t0 = Instant::now();
            let step: Vec<SeqStep<'_>> = seqs
                .iter()
                .zip(&toks)
                .map(|(&seq, t)| SeqStep {
                    seq,
                    tokens: std::slice::from_ref(t),
                })
                .collect();
            let mut rows: Vec<RowSample<'_>> = samplers
                .iter_mut()
                .map(|s| RowSample {
                    sampler: Some(s),
                    banned: &[],
                    forced: None,
                })
                .collect();
            let out = be.forward_sampled(&step, &mut rows)?;
            if rep >= 3 {
                walls.push(t0.elapsed().as_secs_f64() * 1e3);
            }
            for (b, o) in out.into_iter().enumerate() {
                last[b] = o.context("the served step sampled no token")?.token;
            }
        }
        for s in seqs {
            be.free_seq(s);
        }
        let med = median(walls);
        println!(
            "served step ({label}; forward_sampled: inputs, graph, sampling kernel, token copy): \
             median {med:.3} ms -> {:.1} tok/s",
            batch as f64 / (med * 1e-3)
        );
    }
    Ok(())
}

/// Print per-kernel-group times (summed over `reps` profiled runs) as a table.
fn print_profile(prof: &Profile, reps: f64, title: &str, bytes: Option<(&StepBytes, f64)>) {
    print!("{}", profile_table(prof, reps, title, bytes));
}

/// Groups reading less than this share of the step's counted bytes show no rate: their
/// time is launch and latency, not bandwidth.
const NEGLIGIBLE_SHARE: f64 = 1e-3;

/// The per-kernel table: per group ms/step, launches and share of the time; with `bytes`
/// (the step's counted bytes and the measured read bandwidth in GB/s) also the bytes the
/// group must read, the rate that time gives them and its share of the bandwidth.
fn profile_table(
    prof: &Profile,
    reps: f64,
    title: &str,
    bytes: Option<(&StepBytes, f64)>,
) -> String {
    use std::fmt::Write;
    let total_ms: f64 = prof.rows.iter().map(|r| r.1).sum::<f64>() / reps;
    let mut out = format!("{title}:\n");
    // Formats the byte columns of `b` bytes read in `ms`; dashes where the rate means nothing.
    let rate = |b: Option<u64>, ms: f64| -> String {
        let Some((step, bw)) = bytes else {
            return String::new();
        };
        let b = b.unwrap_or(0);
        let mb = if b == 0 {
            "-".to_string()
        } else {
            format!("{:.3}", b as f64 / 1e6)
        };
        if (b as f64) < NEGLIGIBLE_SHARE * step.total() as f64 || ms <= 0.0 {
            return format!(" {mb:>11} {:>8} {:>8}", "-", "-");
        }
        let gbs = b as f64 / (ms * 1e-3) / 1e9;
        format!(" {mb:>11} {gbs:>8.0} {:>7.1}%", 100.0 * gbs / bw)
    };
    let head = if bytes.is_some() {
        format!(" {:>11} {:>8} {:>8}", "MB read", "GB/s", "% of BW")
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "  {:<36} {:>9} {:>8} {:>7}{head}",
        "kernel", "ms/step", "launches", "share"
    );
    for (l, ms, n) in &prof.rows {
        let ms = ms / reps;
        let group = StepGroup::from_label(l);
        let b = bytes.and_then(|(s, _)| group.map(|g| s.group(g)));
        let _ = writeln!(
            out,
            "  {:<36} {:>9.4} {:>8} {:>6.1}%{}",
            l,
            ms,
            *n as f64 / reps,
            100.0 * ms / total_ms,
            rate(b, ms)
        );
    }
    let all = bytes.map(|(s, _)| s.total());
    let _ = writeln!(
        out,
        "  {:<36} {:>9.4} {:>8} {:>7}{}",
        "sum",
        total_ms,
        "",
        "",
        rate(all, total_ms)
    );
    out
}

/// Time a prefill of `n` prompt tokens in each of KV slots 0..seqs after `depth` cached
/// positions, all in one call (a server step's prompts); its median GPU time in ms.
fn profile_prefill(
    g: &Gpu,
    dec: &mut Decoder,
    cfg: &ModelConfig,
    depth: usize,
    n: usize,
    seqs: usize,
) -> Result<f64> {
    // Each sequence its own prompt, its rows in position order, one after the other.
    let toks: Vec<u32> = (0..seqs * n)
        .map(|i| (synthetic_token(i) % cfg.vocab_size as u64) as u32)
        .collect();
    let pos: Vec<u32> = (0..seqs)
        .flat_map(|_| (0..n).map(|i| (depth + i) as u32))
        .collect();
    let slots: Vec<u32> = (0..seqs as u32)
        .flat_map(|s| std::iter::repeat_n(s, n))
        .collect();
    let outs: Vec<u32> = (1..=seqs).map(|s| (s * n - 1) as u32).collect();
    let flops: f64 = seqs as f64
        * (0..n)
            .map(|i| flops_per_prompt_token(cfg, depth + i))
            .sum::<f64>();
    let total = seqs * n;
    let mut times = Vec::new();
    for rep in 0..4 {
        let ms = gpu_ms(g, || dec.prefill(g, &toks, &pos, &slots, &outs))?;
        if rep >= 1 {
            times.push(ms);
        }
    }
    let mut prof = Profile::default();
    dec.prefill_profiled(g, &toks, &pos, &slots, &outs, &mut prof)?;
    print_profile(
        &prof,
        1.0,
        &format!("per-kernel GPU time of one {total}-token prefill"),
        None,
    );
    let med = median(times.clone());
    let prompts = if seqs == 1 {
        String::new()
    } else {
        format!("{seqs} prompts of {n} = ")
    };
    println!(
        "prefill of {prompts}{total} tokens at depth {depth} (batched path, {} pass(es) of up \
         to {} rows): median {:.2} ms (runs {:?}) -> {:.0} tok/s, {:.1} TFLOP/s (counted {:.2} \
         TFLOP)",
        total.div_ceil(dec.prefill_rows()),
        dec.prefill_rows(),
        med,
        times.iter().map(|t| format!("{t:.2}")).collect::<Vec<_>>(),
        total as f64 / (med * 1e-3),
        flops / (med * 1e-3) / 1e12,
        flops / 1e12
    );
    Ok(med)
}

/// A spread of token ids for the profiled prompt.
fn synthetic_token(i: usize) -> u64 {
    super::synthetic::splitmix64(i as u64 ^ 0x7072_6566)
}

#[cfg(test)]
mod tests {
    use super::super::gates::{Fp4Layers, MoeTile};
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ProfileArgs,
    }

    fn parse(argv: &[&str]) -> Result<ProfileArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("profile").chain(argv.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn kv_dtype_and_tile_flags_map_to_decode_options() {
        let a = parse(&["--kv-dtype", "fp8", "--tile", "128x128"]).unwrap();
        assert_eq!(kv_dtype(&a.kv_dtype), KvDtype::Fp8);
        assert_eq!(serve::moe_tile(a.tile), MoeTile::T128x128);
        let a = parse(&[]).unwrap();
        assert_eq!(kv_dtype(&a.kv_dtype), KvDtype::Bf16);
        assert_eq!(serve::moe_tile(a.tile), MoeTile::Auto);
        assert_eq!(kv_dtype("f32"), KvDtype::F32);
        let a = parse(&["--tile", "64x128"]).unwrap();
        assert_eq!(serve::moe_tile(a.tile), MoeTile::T64x128);
        assert!(parse(&["--kv-dtype", "fp16"]).is_err());
        assert!(parse(&["--tile", "32x32"]).is_err());
    }

    #[test]
    fn the_prefill_pass_is_checked_before_the_gpu_opens() {
        let pass = |argv: &[&str]| prefill_pass(&parse(argv).unwrap());
        assert_eq!(pass(&[]).unwrap(), None);
        assert_eq!(
            pass(&["--max-num-batched-tokens", "2048"]).unwrap(),
            Some(2048)
        );
        for bad in ["0", "16385"] {
            let e = pass(&["--max-num-batched-tokens", bad])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("--max-num-batched-tokens {bad}")) && e.contains("16384"),
                "{e}"
            );
        }
    }

    /// A profile of one 120b step with made-up times, one row per group.
    fn fake_profile(fp4: bool) -> Profile {
        let rows = StepGroup::ALL
            .iter()
            .enumerate()
            .map(|(i, g)| (g.label(fp4), 0.1 * (i + 1) as f64, 36))
            .collect();
        Profile { rows }
    }

    #[test]
    fn the_kernel_table_gives_each_group_its_bytes_and_rate() {
        let c = synthetic::config("gpt-oss-120b").unwrap();
        let step = roofline::decode_step_bytes(&c, Fp4Layers::Moe, 2, &[0; 4], &[10; 36]).unwrap();
        let t = profile_table(&fake_profile(false), 1.0, "title", Some((&step, 3000.0)));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "title:");
        // Header, 9 groups, sum: every line as wide as the header.
        assert_eq!(lines.len(), 12, "{t}");
        let width = lines[1].chars().count();
        assert!(lines[1..].iter().all(|l| l.chars().count() == width), "{t}");
        let row = |label: &str| {
            lines
                .iter()
                .find(|l| l.trim_start().starts_with(label))
                .unwrap()
                .split_whitespace()
                .rev()
                .take(3)
                .collect::<Vec<_>>()
        };
        // qkv: 36 layers of bf16 weights in 0.2 ms.
        let qkv = step.group(StepGroup::Qkv) as f64;
        let gbs = qkv / 0.2e-3 / 1e9;
        assert_eq!(
            row("rmsnorm+gemv qkv"),
            [
                format!("{:.1}%", 100.0 * gbs / 3000.0),
                format!("{gbs:.0}"),
                format!("{:.3}", qkv / 1e6)
            ]
        );
        // Nothing to read (rope) or next to nothing (the embedding rows, attention at depth
        // 0): no rate.
        assert_eq!(row("rope_kv_write"), ["-", "-", "-"]);
        assert_eq!(row("embed_gather")[..2], ["-", "-"]);
        assert_eq!(row("attention")[..2], ["-", "-"]);
        let sum = row("sum");
        assert_eq!(sum[2], format!("{:.3}", step.total() as f64 / 1e6));
        // Without bytes (the prefill's table) only the times.
        let t = profile_table(&fake_profile(true), 1.0, "prefill", None);
        assert!(t.contains("rmsnorm+gemv_mxfp4 qkv"));
        assert!(!t.contains("GB/s"));
    }

    #[test]
    fn timeline_is_refused_with_json_out_before_the_gpu_opens() {
        let a = parse(&["--timeline", "--json-out", "/nonexistent/dir/rows.json"]).unwrap();
        assert!(a.timeline);
        let e = run(&a).unwrap_err().to_string();
        assert!(e.contains("--timeline") && e.contains("--json-out"), "{e}");
    }

    #[test]
    fn json_out_takes_a_file() {
        let a = parse(&["--json-out", "docs/perf/h100.json"]).unwrap();
        assert_eq!(
            a.json_out.as_deref(),
            Some(std::path::Path::new("docs/perf/h100.json"))
        );
        assert!(parse(&[]).unwrap().json_out.is_none());
    }

    #[test]
    fn fp8_cache_counts_one_byte_per_element_in_the_roofline() {
        let c = synthetic::config("gpt-oss-120b").unwrap();
        let (depth, kv_elems_per_key) = (4096, 2 * c.num_key_value_heads * c.head_dim);
        let keys: usize = c
            .layer_is_sliding
            .iter()
            .map(|&s| if s { c.sliding_window } else { depth + 1 })
            .sum();
        let size =
            |kv: KvDtype| roofline::batch_one_bytes(&c, Fp4Layers::Moe, kv.size(), depth).unwrap();
        // bf16 → fp8 saves exactly one byte per cached element read; f32 costs two more.
        assert_eq!(
            size(KvDtype::Bf16) - size(KvDtype::Fp8),
            (keys * kv_elems_per_key) as u64
        );
        assert_eq!(
            size(KvDtype::F32) - size(KvDtype::Bf16),
            (2 * keys * kv_elems_per_key) as u64
        );
    }
}
