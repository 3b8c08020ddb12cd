//! The decode step on the GPU: every layer of gpt-oss for a batch of single tokens (each from
//! its own sequence at its own position), ending in logits and an on-device argmax.
//! Token ids, positions and cache offsets live in device buffers, so a whole step can be
//! captured once into a CUDA graph and replayed.

use anyhow::{Result, ensure};
use cudarc::driver::{CudaEvent, CudaGraph, CudaSlice};

use super::device::Gpu;
use super::gates::{ActFormat, DecodeGemv, DecodeOptions, KvDtype, MoeTile};
use super::ops::{self, AttnScratch, AttnShape, MoeShape, MoeWeights, Norm};
use super::roofline::StepGroup;
use super::weights::{DeviceWeights, Layer};
use crate::engine::config::ModelConfig;

/// Fewest keys any decode-attention split takes (`ops::AttnKernel::min_split` per kernel; this
/// bound sizes the scratch): a row's keys are shared evenly among the splits, so a short context
/// uses few, a long one up to [`ATTN_MAX_SPLITS`].
pub const ATTN_MIN_SPLIT: usize = 8;

/// Most splits per (row, head): the scratch size, and the grid of a graph captured for a long
/// cache (where each split then takes up to `max_positions / ATTN_MAX_SPLITS` keys).
pub use super::ops::ATTN_MAX_SPLITS;

/// Decode-attention splits for rows of up to `keys` keys, at least `min_split` keys each,
/// given a scratch of `max_splits`.
pub fn attn_splits(keys: usize, min_split: usize, max_splits: usize) -> usize {
    keys.div_ceil(min_split.max(1)).clamp(1, max_splits.max(1))
}

/// Prompt rows one prefill pass holds unless told otherwise ([`Decoder::reserve_prefill`]);
/// longer batches run in chunks of this many.
pub const PREFILL_MAX_ROWS: usize = 2048;

/// The most rows [`Decoder::reserve_prefill`] takes: several prefill kernels put a row per
/// block in the grid's y dimension, which CUDA caps at 65 535, and the buffers grow by
/// ~170 KB a row for gpt-oss-120b.
pub const PREFILL_ROWS_LIMIT: usize = 16384;

/// Per-row inputs and activations of one pass (a decode step or a prefill chunk), for up to
/// `rows` rows.
struct RowBufs {
    tokens: CudaSlice<u32>,
    pos: CudaSlice<u32>,
    kv_off: CudaSlice<u64>,
    x: CudaSlice<f32>,
    h: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    q: CudaSlice<f32>,
    attn: CudaSlice<f32>,
    r_logits: CudaSlice<f32>,
    /// Routed expert indices, one [rows, k] slice per layer: each layer keeps its own, so a
    /// step's routing can be read back after it (the profile counts the distinct experts).
    r_idx: CudaSlice<i32>,
    /// Elements of one layer's slice of `r_idx` (rows · k).
    idx_stride: usize,
    r_w: CudaSlice<f32>,
    act: CudaSlice<f32>,
    /// Each routed expert's weighted output [rows, k, H] before the slots are summed.
    part: CudaSlice<f32>,
    /// The fused router's per-token-group completion counters (kept zeroed by the kernel).
    topk_ctr: CudaSlice<u32>,
    /// The decode MoE's per-(row range, token) slot counters (kept zeroed by the kernel).
    moe_ctr: CudaSlice<u32>,
    /// The router's expert announcements to gate_up and gate_up's counts to down, [rows, k]
    /// each ([`ops::MoeWords`]; the announcements kept zeroed between layers by down).
    moe_ready: CudaSlice<u32>,
    moe_done: CudaSlice<u32>,
    /// The decode down's mailbox ([`ops::moe_mail_words`], kept zeroed by the kernel), for the
    /// rows that use it (fewer than [`ops::MOE_MAIL_BELOW`]); one word where the rows never run
    /// the decode MoE (a prefill pass) or it is switched off.
    moe_mail: CudaSlice<u32>,
}

impl RowBufs {
    fn new(g: &Gpu, c: &ModelConfig, rows: usize, mail: bool) -> Result<Self> {
        let (hq, hkv, d, hid) = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.hidden_size,
        );
        let (e, k) = (c.num_local_experts, c.num_experts_per_tok);
        Ok(Self {
            tokens: g.alloc(rows)?,
            pos: g.alloc(rows)?,
            kv_off: g.alloc(rows)?,
            x: g.alloc(rows * hid)?,
            h: g.alloc(rows * hid)?,
            qkv: g.alloc(rows * (hq + 2 * hkv) * d)?,
            q: g.alloc(rows * hq * d)?,
            attn: g.alloc(rows * hq * d)?,
            r_logits: g.alloc(rows * e)?,
            r_idx: g.alloc(c.num_hidden_layers * rows * k)?,
            idx_stride: rows * k,
            r_w: g.alloc(rows * k)?,
            act: g.alloc(rows * k * c.intermediate_size)?,
            part: g.alloc(rows * k * hid)?,
            topk_ctr: g.alloc(ops::topk_counters(rows, e))?,
            moe_ctr: g.alloc(ops::moe_counters(hid, rows))?,
            moe_ready: g.alloc(rows * k)?,
            moe_done: g.alloc(rows * k)?,
            moe_mail: g.alloc(if mail {
                ops::moe_mail_words(moe_shape(c), rows.min(ops::MOE_MAIL_BELOW - 1))
            } else {
                1
            })?,
        })
    }

    /// Device address of layer `li`'s routed expert indices.
    fn idx_ptr(&self, g: &Gpu, li: usize) -> u64 {
        g.ptr(&self.r_idx) + (li * self.idx_stride * std::mem::size_of::<i32>()) as u64
    }

    /// Copy the first rows' token ids, positions and KV offsets to the device.
    fn upload(&mut self, g: &Gpu, tokens: &[u32], pos: &[u32], offs: &[u64]) -> Result<()> {
        let n = tokens.len();
        let mut tk = self.tokens.slice_mut(0..n);
        g.stream()
            .memcpy_htod(tokens, &mut tk)
            .map_err(|e| anyhow::anyhow!("copying token ids: {:?}", e.0))?;
        let mut pp = self.pos.slice_mut(0..n);
        g.stream()
            .memcpy_htod(pos, &mut pp)
            .map_err(|e| anyhow::anyhow!("copying positions: {:?}", e.0))?;
        let mut oo = self.kv_off.slice_mut(0..n);
        g.stream()
            .memcpy_htod(offs, &mut oo)
            .map_err(|e| anyhow::anyhow!("copying KV offsets: {:?}", e.0))?;
        Ok(())
    }
}

/// Buffers of the prefill pass, sized for `cap` rows (allocated at the first prompt): the
/// row buffers plus the grouped MoE's scratch and the rows gathered for the head.
struct PrefillBufs {
    cap: usize,
    rows: RowBufs,
    perm: CudaSlice<i32>,
    tiles: CudaSlice<i32>,
    ntiles: CudaSlice<i32>,
    out_rows: CudaSlice<u32>,
    /// The tensor-core prefill attention's row tiles of the chunk ([`ops::prefill_attn_tiles`]).
    attn_tiles: CudaSlice<u32>,
    /// Partial sums of the split passes (`ops::split_count`), [`split_floats`] floats; only
    /// under `MXTUNE_PREFILL_SPLIT=auto`.
    split: Option<CudaSlice<f32>>,
}

/// Row-splits the split scratch holds: a pass splits only while its rows times its splits
/// fit ([`ops::split_count`]), so passes of more rows split less or not at all.
const SPLIT_SCRATCH_ROWS: usize = 1024;

/// Floats of the split scratch for model `c`: [`SPLIT_SCRATCH_ROWS`] rows of the widest
/// partial a split writes (a qkv or o output row, or a row's attention outputs with their
/// running maxima and sums).
fn split_floats(c: &ModelConfig) -> usize {
    let d = c.head_dim;
    let widest = ((c.num_attention_heads + 2 * c.num_key_value_heads) * d)
        .max(c.hidden_size)
        .max(c.num_attention_heads * (d + 2));
    SPLIT_SCRATCH_ROWS * widest
}

impl PrefillBufs {
    fn new(
        g: &Gpu,
        c: &ModelConfig,
        cap: usize,
        max_batch: usize,
        (tile, split): (MoeTile, bool),
    ) -> Result<Self> {
        let (e, k) = (c.num_local_experts, c.num_experts_per_tok);
        Ok(Self {
            cap,
            rows: RowBufs::new(g, c, cap, false)?,
            perm: g.alloc(cap * k)?,
            tiles: g.alloc(3 * ops::moe_max_tiles(cap * k, e, tile))?,
            ntiles: g.alloc(1)?,
            out_rows: g.alloc(max_batch)?,
            attn_tiles: g.alloc(2 * cap)?,
            split: if split {
                Some(g.alloc(split_floats(c))?)
            } else {
                None
            },
        })
    }
}

/// What every layer's kernels take besides the row buffers: shapes and constants.
struct PassShape {
    attn: AttnShape,
    moe: MoeShape,
    kv: KvDtype,
    eps: f32,
    scale: f32,
}

/// One layer's cache pointers, attention window and sink, and expert weights.
struct LayerPtrs {
    k_cache: u64,
    v_cache: u64,
    /// 0 for full attention.
    window: usize,
    sinks: Option<u64>,
    moe: MoeWeights,
}

/// Per-kernel GPU time of profiled steps.
#[derive(Debug, Default, Clone)]
pub struct Profile {
    /// (kernel group, total milliseconds, launches) in first-seen order.
    pub rows: Vec<(&'static str, f64, usize)>,
}

impl Profile {
    /// Add the time between consecutive events, each to the label of its later event.
    fn add_marks(&mut self, marks: &Marks) -> Result<()> {
        for w in marks.events.windows(2) {
            let ms = w[0]
                .1
                .elapsed_ms(&w[1].1)
                .map_err(|e| anyhow::anyhow!("reading CUDA event time: {:?}", e.0))?;
            self.add(w[1].0, f64::from(ms));
        }
        Ok(())
    }

    fn add(&mut self, label: &'static str, ms: f64) {
        if let Some(r) = self.rows.iter_mut().find(|r| r.0 == label) {
            r.1 += ms;
            r.2 += 1;
        } else {
            self.rows.push((label, ms, 1));
        }
    }
}

/// A captured decode step. CUDA graph handles may move between threads as long as no two
/// threads use one at once; the owning `Decoder` is only ever used through `&mut`/one thread.
struct StepGraph(CudaGraph);

// SAFETY: see above — exclusive ownership, no concurrent use of the graph handles.
unsafe impl Send for StepGraph {}

/// Events recorded between kernel groups while profiling.
struct Marks {
    events: Vec<(&'static str, CudaEvent)>,
}

/// Device buffers and weights of the decode step.
pub struct Decoder {
    cfg: ModelConfig,
    w: DeviceWeights,
    opts: DecodeOptions,
    inv_freq: CudaSlice<f32>,
    mscale: f32,
    /// K and V caches as raw bytes ([layers][slots][max_pos][Hkv][D] of `opts.kv_dtype`).
    k_cache: CudaSlice<u8>,
    v_cache: CudaSlice<u8>,
    slots: usize,
    max_pos: usize,
    max_batch: usize,
    /// Row buffers of the decode step (`max_batch` rows).
    rows: RowBufs,
    logits: CudaSlice<f32>,
    am_v: CudaSlice<f32>,
    am_i: CudaSlice<i32>,
    next: CudaSlice<u32>,
    sc_m: CudaSlice<f32>,
    sc_l: CudaSlice<f32>,
    sc_acc: CudaSlice<f32>,
    max_splits: usize,
    /// Captured steps, two per batch size n: `2n` short contexts, `2n + 1` long ones.
    graphs: Vec<Option<StepGraph>>,
    /// Kernel groups a step leaves out ([`Decoder::set_ablated`]: `engine profile --ablate`
    /// only; its results are then wrong, its time is what the step costs without them).
    ablated: Vec<StepGroup>,
    pre: Option<PrefillBufs>,
    /// Rows of one prefill pass ([`PREFILL_MAX_ROWS`] unless [`Decoder::reserve_prefill`] set
    /// it).
    prefill_rows: usize,
    /// The decode MoE runs on tensor cores (`opts.gemv`, bf16 activations, a shape the
    /// kernels take).
    moe_tc: bool,
    /// The decode MoE runs `moe_gate_up_f16` / `moe_down_f16` (`MXTUNE_GEMV=tc-moe-f16`).
    moe_f16: bool,
    /// `MXTUNE_MOE16_KS`: their K split fixed for A/B runs.
    moe_f16_split: Option<ops::MoeF16Split>,
    /// Units per warp of the SIMT decode MoE fixed by `$MXTUNE_MOE_UNITS` (None: picked per
    /// batch size, [`ops::MoeUnits::for_batch`]).
    moe_units: Option<(usize, usize)>,
    /// The decode MoE kernels' loop (`$MXTUNE_MOE_LOOP`, [`ops::MoeLoop`]).
    moe_loop: ops::MoeLoop,
    /// Tokens per distinct expert from which gate_up runs grouped (`$MXTUNE_MOE_GRP_FROM`,
    /// [`ops::moe_grp_from_env`]).
    moe_grp_from: f64,
    /// How the SIMT decode MoE codes its activations: the activation format, with the dot of
    /// `$MXTUNE_MOE_DOT` for bf16 ([`ops::MoeDot`]; always fp32 under the SIMT dense GEMV,
    /// the exact configuration).
    moe_codes: ops::MoeCodes,
    /// Decode-attention kernel choice (defaults, or `MXTUNE_ATTN*` overrides).
    attn: ops::AttnTuning,
    /// Which router a prefill pass runs (`MXTUNE_PREFILL_ROUTER`).
    prefill_router: ops::PrefillRouter,
    /// Few-row prefill passes split their dense GEMMs' K and their attention's keys
    /// (`MXTUNE_PREFILL_SPLIT`).
    prefill_split: bool,
    /// The prefill's bf16 dense GEMMs run `gemm_bf16_cp` (`MXTUNE_PREFILL_GEMM`).
    prefill_gemm_cp: bool,
    /// The grouped MoE's tile kernels (`MXTUNE_PREFILL_MOE`).
    grouped: ops::GroupedKernels,
    /// Whether batch 1 routes through `gemv_router_t1` ([`ops::ROUTER_T1_ENV`]).
    router_t1: bool,
    /// What the decode MoE waits on ([`ops::MOE_READY_ENV`]).
    moe_ready: ops::MoeReady,
    /// Whether the decode gate_up normalises the residual itself ([`ops::MOE_SELF_NORM_ENV`]).
    moe_self_norm: bool,
    /// Whether the decode down combines through its mailbox ([`ops::MOE_MAIL_ENV`]).
    moe_mail: bool,
}

/// The MoE's sizes and SwiGLU constants from the config.
fn moe_shape(c: &ModelConfig) -> MoeShape {
    MoeShape {
        hidden: c.hidden_size,
        inter: c.intermediate_size,
        k: c.num_experts_per_tok,
        limit: c.swiglu_limit as f32,
        alpha: 1.702,
    }
}

impl Decoder {
    /// Whether the decode MoE runs on tensor cores.
    pub fn moe_on_tensor_cores(&self) -> bool {
        self.moe_tc || self.moe_f16
    }

    /// Whether the decode MoE's tensor-core operands are fp16 (else bf16).
    pub fn moe_f16(&self) -> bool {
        self.moe_f16
    }

    /// How the SIMT decode MoE codes its activations.
    pub fn moe_codes(&self) -> ops::MoeCodes {
        self.moe_codes
    }

    /// The layout the experts are held in on the device.
    pub fn expert_layout(&self) -> ops::ExpertLayout {
        self.w.expert_layout
    }

    /// Allocate the KV cache (`slots` sequences of `max_pos` positions) and activations for
    /// batches up to `max_batch`. Dense layers that `opts.fp4_layers` puts in MXFP4 are
    /// quantized on the device first (their bf16 copies freed before the cache is allocated).
    pub fn new(
        g: &Gpu,
        cfg: &ModelConfig,
        mut w: DeviceWeights,
        opts: DecodeOptions,
        slots: usize,
        max_pos: usize,
        max_batch: usize,
    ) -> Result<Self> {
        super::weights::check_config(cfg)?;
        w.quantize_dense(g, cfg, opts.fp4_layers)?;
        ensure!(
            slots > 0 && max_pos > 0 && max_batch > 0,
            "empty KV cache or batch"
        );
        ensure!(
            opts.kv_dtype != KvDtype::Fp8 || fp8_capable(g.arch()),
            "an fp8 KV cache needs sm_89 or later (the E4M3 conversions); this GPU is {}",
            g.arch()
        );
        let (hq, hkv, d, v) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.vocab_size,
        );
        let rope = crate::engine::cpu::ops::Rope::new(cfg);
        let (inv, mscale) = (rope.inv_freq, rope.attention_scaling);
        let cache = cfg.num_hidden_layers * slots * max_pos * hkv * d;
        let b = max_batch;
        let max_splits = attn_splits(max_pos, ATTN_MIN_SPLIT, ATTN_MAX_SPLITS);
        let chunks = v.div_ceil(ops::ARGMAX_CHUNK);
        let moe_tc = opts.gemv == DecodeGemv::TensorCoreMoe
            && opts.activation == ActFormat::Bf16
            && ops::moe_tc_fits(g, moe_shape(cfg));
        let moe_f16 = opts.gemv == DecodeGemv::TensorCoreMoeF16
            && opts.activation == ActFormat::Bf16
            && ops::moe_f16_fits(g, moe_shape(cfg));
        let moe_f16_split = ops::MoeF16Split::from_env()?;
        let moe_units = ops::MoeUnits::from_env()?;
        let moe_loop = ops::MoeLoop::from_env()?;
        let moe_grp_from = ops::moe_grp_from_env()?;
        let moe_dot = match opts.gemv {
            DecodeGemv::Simt => ops::MoeDot::F32,
            _ => ops::MoeDot::from_env()?,
        };
        let moe_codes = ops::MoeCodes::of(opts.activation, moe_dot);
        // The experts in the layout the decode MoE reads (the tensor-core ones: standard).
        let layout = if moe_tc || moe_f16 {
            ops::ExpertLayout::Standard
        } else {
            ops::ExpertLayout::for_codes(moe_codes)
        };
        w.set_expert_layout(g, layout)?;
        let attn = ops::AttnTuning::from_env()?;
        let prefill_router = ops::PrefillRouter::from_env()?;
        let prefill_split = ops::prefill_split_from_env()?;
        let prefill_gemm_cp = ops::prefill_gemm_cp_from_env()?;
        let grouped = ops::GroupedKernels::from_env()?;
        let router_t1 = ops::router_t1_enabled()?;
        let moe_ready = ops::MoeReady::from_env()?;
        let moe_self_norm = ops::moe_self_norm_enabled()?;
        let moe_mail = ops::moe_mail_enabled()?;
        Ok(Self {
            cfg: cfg.clone(),
            w,
            opts,
            inv_freq: g.upload(&inv)?,
            mscale,
            k_cache: g.alloc(cache * opts.kv_dtype.size())?,
            v_cache: g.alloc(cache * opts.kv_dtype.size())?,
            slots,
            max_pos,
            max_batch,
            rows: RowBufs::new(g, cfg, b, moe_mail)?,
            logits: g.alloc(b * v)?,
            am_v: g.alloc(b * chunks)?,
            am_i: g.alloc(b * chunks)?,
            next: g.alloc(b)?,
            sc_m: g.alloc(b * hq * max_splits)?,
            sc_l: g.alloc(b * hq * max_splits)?,
            sc_acc: g.alloc(b * hq * max_splits * d)?,
            max_splits,
            graphs: (0..2 * (max_batch + 1)).map(|_| None).collect(),
            ablated: Vec::new(),
            pre: None,
            prefill_rows: PREFILL_MAX_ROWS,
            moe_tc,
            moe_f16,
            moe_f16_split,
            moe_units,
            moe_loop,
            moe_grp_from,
            moe_codes,
            prefill_router,
            prefill_split,
            prefill_gemm_cp,
            grouped,
            router_t1,
            moe_ready,
            moe_self_norm,
            moe_mail,
            attn,
        })
    }

    /// The model shape.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The decode options in effect.
    pub fn options(&self) -> DecodeOptions {
        self.opts
    }

    /// Rows one prefill pass holds.
    pub fn prefill_rows(&self) -> usize {
        self.prefill_rows
    }

    /// Run prefill batches of up to `rows` rows in one pass (a server passes its step's
    /// token budget, so the prompts of a step meet in one grouped MoE: fuller expert tiles,
    /// each expert's weights read once a layer instead of once a chunk), and allocate the
    /// pass's buffers now, so that a device too small for them says so before the first
    /// prompt. At most [`PREFILL_ROWS_LIMIT`].
    pub fn reserve_prefill(&mut self, g: &Gpu, rows: usize) -> Result<()> {
        ensure!(
            (1..=PREFILL_ROWS_LIMIT).contains(&rows),
            "prefill pass of {rows} rows: expected 1 to {PREFILL_ROWS_LIMIT}"
        );
        // The old buffers go first, so the device never holds both.
        self.pre = None;
        self.pre = Some(PrefillBufs::new(
            g,
            &self.cfg,
            rows,
            self.max_batch,
            (self.opts.tile, self.prefill_split),
        )?);
        self.prefill_rows = rows;
        Ok(())
    }

    /// Sequences the KV cache holds.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Positions per sequence.
    pub fn max_positions(&self) -> usize {
        self.max_pos
    }

    /// Copy KV positions `from..to` of slot `src` into slot `dst`, every layer, K and V (the
    /// cache is [layer][slot][position][KV head][dim]): the `n` choices of a prompt share
    /// its prefill.
    pub fn copy_kv(&self, g: &Gpu, src: usize, dst: usize, from: usize, to: usize) -> Result<()> {
        anyhow::ensure!(
            src < self.slots && dst < self.slots && src != dst && from <= to && to <= self.max_pos,
            "copy_kv: slots {src} -> {dst}, positions {from}..{to} outside {} slots of {} \
             positions",
            self.slots,
            self.max_pos
        );
        let c = &self.cfg;
        let row = c.num_key_value_heads * c.head_dim * self.opts.kv_dtype.size();
        let slot_bytes = self.max_pos * row;
        let layer_bytes = self.slots * slot_bytes;
        for cache in [&self.k_cache, &self.v_cache] {
            let base = g.ptr(cache);
            for li in 0..c.num_hidden_layers {
                let at = |slot: usize| (li * layer_bytes + slot * slot_bytes + from * row) as u64;
                g.copy_dtod(base + at(dst), base + at(src), (to - from) * row)?;
            }
        }
        Ok(())
    }

    /// Bytes the dense projections and the lm_head occupy on the device (bf16 or MXFP4, as
    /// `--mxfp4-layers` left them).
    pub fn dense_bytes(&self) -> usize {
        self.w.dense_bytes()
    }

    /// Largest batch of one step.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// Fill the whole KV cache with random values (profiling at depth without a prefill).
    pub fn fill_kv(&mut self, g: &Gpu, seed: u64) -> Result<()> {
        if self.opts.kv_dtype == KvDtype::Fp8 {
            // E4M3 bytes 0x00..=0x3f: 0 to 1.875, no NaN (0x7f/0xff).
            let n = self.k_cache.len();
            ops::fill_u8(g, g.ptr(&self.k_cache), n, seed, 0, 0x3f)?;
            ops::fill_u8(g, g.ptr(&self.v_cache), n, seed ^ 1, 0, 0x3f)?;
            return g.sync();
        }
        // As bf16 halves: an fp32 cache then holds values near the same bf16 numbers.
        let n = self.k_cache.len() / 2;
        ops::fill_bf16(g, g.ptr(&self.k_cache), n, seed, 1.0, 0.0)?;
        ops::fill_bf16(g, g.ptr(&self.v_cache), n, seed ^ 1, 1.0, 0.0)?;
        g.sync()
    }

    /// Copy the step's inputs (token, position, KV slot per row) to the device.
    pub fn set_inputs(
        &mut self,
        g: &Gpu,
        tokens: &[u32],
        pos: &[u32],
        slots: &[u32],
    ) -> Result<()> {
        let n = tokens.len();
        ensure!(
            n > 0 && n <= self.max_batch && pos.len() == n && slots.len() == n,
            "decode batch of {n} rows (max {})",
            self.max_batch
        );
        let offs = self.check_rows(tokens, pos, slots)?;
        self.rows.upload(g, tokens, pos, &offs)
    }

    /// Check rows' positions, slots and token ids; their KV offsets in elements.
    fn check_rows(&self, tokens: &[u32], pos: &[u32], slots: &[u32]) -> Result<Vec<u64>> {
        for (&p, &s) in pos.iter().zip(slots) {
            ensure!(
                (p as usize) < self.max_pos,
                "position {p} beyond the KV cache ({})",
                self.max_pos
            );
            ensure!(
                (s as usize) < self.slots,
                "KV slot {s} out of range ({})",
                self.slots
            );
        }
        for &t in tokens {
            ensure!(
                (t as usize) < self.cfg.vocab_size,
                "token id {t} ≥ vocab {}",
                self.cfg.vocab_size
            );
        }
        let stride = (self.max_pos * self.cfg.num_key_value_heads * self.cfg.head_dim) as u64;
        Ok(slots.iter().map(|&s| u64::from(s) * stride).collect())
    }

    /// Shapes and constants every layer's kernels take.
    fn pass_shape(&self) -> PassShape {
        let c = &self.cfg;
        PassShape {
            attn: AttnShape {
                hq: c.num_attention_heads,
                hkv: c.num_key_value_heads,
                d: c.head_dim,
            },
            moe: moe_shape(c),
            kv: self.opts.kv_dtype,
            eps: c.rms_norm_eps as f32,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        }
    }

    /// Layer `li`'s cache pointers, window, sink and expert weights.
    fn layer_ptrs(&self, g: &Gpu, li: usize, lw: &Layer) -> LayerPtrs {
        let c = &self.cfg;
        let stride = (self.slots
            * self.max_pos
            * c.num_key_value_heads
            * c.head_dim
            * self.opts.kv_dtype.size()) as u64;
        LayerPtrs {
            k_cache: g.ptr(&self.k_cache) + li as u64 * stride,
            v_cache: g.ptr(&self.v_cache) + li as u64 * stride,
            window: if c.layer_is_sliding[li] {
                c.sliding_window
            } else {
                0
            },
            sinks: self.opts.sinks.then(|| g.ptr(&lw.sinks)),
            moe: MoeWeights {
                gu_blocks: g.ptr(&lw.gu_blocks),
                gu_scales: g.ptr(&lw.gu_scales),
                gu_bias: g.ptr(&lw.gu_bias),
                dn_blocks: g.ptr(&lw.dn_blocks),
                dn_scales: g.ptr(&lw.dn_scales),
                dn_bias: g.ptr(&lw.dn_bias),
                layout: self.w.expert_layout,
            },
        }
    }

    /// RoPE on q and k of `n` rows of `r.qkv`, K/V into the cache (the same on both paths).
    #[allow(clippy::too_many_arguments)]
    fn rope_kv(
        &self,
        g: &Gpu,
        sh: &PassShape,
        l: &LayerPtrs,
        r: &RowBufs,
        n: usize,
        heads_per_block: usize,
        deferred: Option<ops::QkvDeferred>,
    ) -> Result<()> {
        ops::rope_kv(
            g,
            sh.attn,
            g.ptr(&r.qkv),
            g.ptr(&r.q),
            l.k_cache,
            l.v_cache,
            sh.kv,
            g.ptr(&self.inv_freq),
            g.ptr(&r.pos),
            g.ptr(&r.kv_off),
            n,
            self.mscale,
            heads_per_block,
            deferred,
        )
    }

    /// Where the fused router of layer `li` writes each row's experts and weights.
    /// `ready`: the decode MoE's announcements, or none.
    fn topk(&self, g: &Gpu, r: &RowBufs, li: usize, ready: Option<ops::MoeWords>) -> ops::TopK {
        ops::TopK {
            idx: r.idx_ptr(g, li),
            w: g.ptr(&r.r_w),
            k: self.cfg.num_experts_per_tok,
            counter: g.ptr(&r.topk_ctr),
            ready,
        }
    }

    /// Queue one step for the first `n` rows. `full_keys` bounds the key count of full
    /// attention layers (the split count); `marks` records profiling events.
    fn enqueue(
        &self,
        g: &Gpu,
        n: usize,
        full_keys: usize,
        mut marks: Option<&mut Marks>,
    ) -> Result<()> {
        let c = &self.cfg;
        let r = &self.rows;
        let sh = self.pass_shape();
        let AttnShape { hq, hkv, d } = sh.attn;
        let hid = c.hidden_size;
        let p = |s: &CudaSlice<f32>| g.ptr(s);
        let mut mark = |label: &'static str| mark_event(g, marks.as_deref_mut(), label);
        mark("start")?;
        ops::embed(g, g.ptr(&self.w.embed), g.ptr(&r.tokens), p(&r.x), hid, n)?;
        mark(StepGroup::Embed.label(false))?;
        let scratch = AttnScratch {
            m: p(&self.sc_m),
            l: p(&self.sc_l),
            acc: p(&self.sc_acc),
            entries: self.max_batch * hq * self.max_splits,
        };
        // The MoE's units per warp depend on the batch only: once per step.
        let mut units = ops::MoeUnits::for_batch(g.sms(), sh.moe, n, self.moe_units, self.moe_loop)
            .grouping(c.num_local_experts, sh.moe.k, n, self.moe_grp_from);
        if self.moe_units.is_none() {
            units = units.whole_waves(g.sms(), sh.moe, n);
        }
        let split = self.moe_f16_split.unwrap_or_else(|| {
            ops::MoeF16Split::for_batch(g.sms(), sh.moe, c.num_local_experts, n)
        });
        // The router announces each pair's expert to gate_up, and down clears it: only when
        // all three run (an ablated router would leave gate_up waiting) on the per-pair kernels,
        // and where the router lets gate_up launch before its grid ends (below
        // `ops::ROUTER_LATE_FROM` rows; docs/perf.md run 232: batch 1 −2.9 %, batch 8 +0.5 %).
        let ready = (self.moe_ready != ops::MoeReady::Off
            && n < ops::ROUTER_LATE_FROM
            && !self.moe_f16
            && !self.moe_tc
            && [StepGroup::Router, StepGroup::MoeGateUp, StepGroup::MoeDown]
                .iter()
                .all(|&s| self.runs(s))
            && ops::moe_ready_fits(self.moe_codes, sh.moe, units, n))
        .then(|| ops::MoeWords {
            ready: g.ptr(&r.moe_ready),
            done: g.ptr(&r.moe_done),
        });
        // down waits on its pair's gate_up count rather than on gate_up's grid.
        let await_units = match (ready, self.moe_ready) {
            (Some(_), ops::MoeReady::On) => units.gate_up,
            _ => 0,
        };
        // down combines its slots through its mailbox below ops::MOE_MAIL_BELOW rows.
        let mail = (self.moe_mail && n < ops::MOE_MAIL_BELOW).then(|| g.ptr(&r.moe_mail));
        // With the announcements gate_up normalises the residual itself, before its wait on
        // the router (ops::moe_gate_up), and the router writes no normalised copy.
        let self_norm = self.moe_self_norm && ready.is_some();
        for (li, lw) in self.w.layers.iter().enumerate() {
            let l = self.layer_ptrs(g, li, lw);
            // Nothing in the step reads the attention norm's output (the router writes the
            // MoE's input): not written, a block's last loads and stores fewer.
            let attn_norm = Norm {
                w: g.ptr(&lw.attn_norm),
                eps: sh.eps,
                out: 0,
            };
            let qkv_w = lw.qkv_w.dev(g);
            // With the qkv's K split's finish left to RoPE (ops::TCG_DEFER_ENV), what RoPE
            // adds; only where both run.
            let mut deferred = None;
            if self.runs(StepGroup::Qkv) {
                let rows = (hq + 2 * hkv) * d;
                if self.runs(StepGroup::RopeKv) {
                    deferred = ops::dense_gemv_qkv_deferred(
                        g,
                        self.opts.gemv,
                        qkv_w,
                        g.ptr(&lw.qkv_b),
                        p(&r.x),
                        p(&r.qkv),
                        rows,
                        hid,
                        n,
                        attn_norm,
                        false,
                    )?;
                }
                if deferred.is_none() {
                    ops::dense_gemv(
                        g,
                        self.opts.gemv,
                        qkv_w,
                        Some(g.ptr(&lw.qkv_b)),
                        p(&r.x),
                        p(&r.qkv),
                        rows,
                        hid,
                        n,
                        false,
                        Some(attn_norm),
                    )?;
                }
            }
            mark(StepGroup::Qkv.label(qkv_w.is_mxfp4()))?;
            if self.runs(StepGroup::RopeKv) {
                self.rope_kv(g, &sh, &l, r, n, 1, deferred)?;
            }
            mark(StepGroup::RopeKv.label(false))?;
            let keys = if l.window > 0 {
                l.window.min(full_keys)
            } else {
                full_keys
            };
            let kernel = self.attn.kernel(g, sh.attn, sh.kv, keys)?;
            let min_split = self.attn.min_split(kernel);
            let nsplit = self
                .attn
                .splits(kernel, sh.attn, g.sms(), keys, self.max_splits);
            if self.runs(StepGroup::Attention) {
                ops::attention(
                    g,
                    sh.attn,
                    p(&r.q),
                    l.k_cache,
                    l.v_cache,
                    sh.kv,
                    g.ptr(&r.pos),
                    g.ptr(&r.kv_off),
                    l.sinks,
                    p(&r.attn),
                    &scratch,
                    n,
                    l.window,
                    kernel,
                    nsplit,
                    min_split,
                    sh.scale,
                    self.attn.finish_single,
                    self.attn
                        .tc_variant(sh.kv, sh.attn, g.sms(), keys, nsplit, self.max_batch),
                )?;
            }
            mark(StepGroup::Attention.label(false))?;
            let o_w = lw.o_w.dev(g);
            if self.runs(StepGroup::O) {
                ops::dense_gemv(
                    g,
                    self.opts.gemv,
                    o_w,
                    Some(g.ptr(&lw.o_b)),
                    p(&r.attn),
                    p(&r.x),
                    hid,
                    hq * d,
                    n,
                    true,
                    None,
                )?;
            }
            mark(StepGroup::O.label(o_w.is_mxfp4()))?;
            let mlp_norm = Norm {
                w: g.ptr(&lw.mlp_norm),
                eps: sh.eps,
                out: if self_norm { 0 } else { p(&r.h) },
            };
            if self.runs(StepGroup::Router) {
                ops::router(
                    g,
                    g.ptr(&lw.router_w),
                    Some(g.ptr(&lw.router_b)),
                    p(&r.x),
                    p(&r.r_logits),
                    c.num_local_experts,
                    hid,
                    n,
                    Some(mlp_norm),
                    self.topk(g, r, li, ready),
                    self.router_t1,
                )?;
            }
            mark(StepGroup::Router.label(false))?;
            let (idx, act) = (r.idx_ptr(g, li), p(&r.act));
            let codes = self.moe_codes;
            let experts = c.num_local_experts;
            if self.runs(StepGroup::MoeGateUp) {
                if self.moe_f16 {
                    let h = p(&r.h);
                    ops::moe_gate_up_f16(
                        g,
                        &l.moe,
                        sh.moe,
                        experts,
                        h,
                        idx,
                        act,
                        n,
                        split.gate_up,
                    )?;
                } else if self.moe_tc {
                    ops::moe_gate_up_tc(g, &l.moe, sh.moe, experts, p(&r.h), idx, act, n)?;
                } else {
                    let (x, norm) = if self_norm {
                        let n = ops::InputNorm {
                            w: mlp_norm.w,
                            eps: mlp_norm.eps,
                        };
                        (p(&r.x), Some(n))
                    } else {
                        (p(&r.h), None)
                    };
                    ops::moe_gate_up(
                        g,
                        &l.moe,
                        sh.moe,
                        codes,
                        x,
                        idx,
                        act,
                        n,
                        units.gate_up,
                        units.gate_up_loop(),
                        ready,
                        norm,
                    )?;
                }
            }
            mark(StepGroup::MoeGateUp.label(false))?;
            let (wts, part, x) = (p(&r.r_w), p(&r.part), p(&r.x));
            if self.runs(StepGroup::MoeDown) {
                if self.moe_f16 {
                    ops::moe_down_f16(
                        g,
                        &l.moe,
                        sh.moe,
                        experts,
                        idx,
                        wts,
                        act,
                        part,
                        x,
                        n,
                        true,
                        split.down,
                        g.ptr(&r.moe_ctr),
                    )?;
                } else if self.moe_tc {
                    ops::moe_down_tc(g, &l.moe, sh.moe, experts, idx, wts, act, part, x, n, true)?;
                } else {
                    ops::moe_down(
                        g,
                        &l.moe,
                        sh.moe,
                        codes,
                        idx,
                        wts,
                        act,
                        part,
                        x,
                        n,
                        true,
                        units.down,
                        units.lp,
                        g.ptr(&r.moe_ctr),
                        ready,
                        await_units,
                        mail,
                    )?;
                }
            }
            mark(StepGroup::MoeDown.label(false))?;
        }
        if self.runs(StepGroup::Head) {
            self.head(g, n)?;
        }
        mark(StepGroup::Head.label(self.w.lm_head.is_mxfp4()))?;
        Ok(())
    }

    /// Final norm, lm_head and argmax over the first `n` rows of `x` into `logits`/`next`.
    fn head(&self, g: &Gpu, n: usize) -> Result<()> {
        let c = &self.cfg;
        let p = |s: &CudaSlice<f32>| g.ptr(s);
        let final_norm = Norm {
            w: g.ptr(&self.w.final_norm),
            eps: c.rms_norm_eps as f32,
            out: p(&self.rows.h),
        };
        ops::dense_gemv(
            g,
            self.opts.gemv,
            self.w.lm_head.dev(g),
            None,
            p(&self.rows.x),
            p(&self.logits),
            c.vocab_size,
            c.hidden_size,
            n,
            false,
            Some(final_norm),
        )?;
        ops::argmax(
            g,
            p(&self.logits),
            p(&self.am_v),
            g.ptr(&self.am_i),
            g.ptr(&self.next),
            c.vocab_size,
            n,
        )
    }

    /// Prefill: run `tokens` (row i at position `pos[i]` of KV slot `slots[i]`; a sequence's
    /// rows in position order) through every layer with the batched kernels, writing their
    /// K/V into the cache; then the head for the rows listed in `outputs` (ascending row
    /// indices, at most `max_batch`), whose logits and greedy ids land in rows
    /// 0..outputs.len() as after a decode step. Batches above [`Decoder::prefill_rows`] run
    /// in chunks, in order, so later rows see the K/V of earlier ones.
    pub fn prefill(
        &mut self,
        g: &Gpu,
        tokens: &[u32],
        pos: &[u32],
        slots: &[u32],
        outputs: &[u32],
    ) -> Result<()> {
        self.prefill_inner(g, tokens, pos, slots, outputs, None)
    }

    /// [`Decoder::prefill`] recording per-kernel-group GPU time into `prof` (synchronises).
    pub fn prefill_profiled(
        &mut self,
        g: &Gpu,
        tokens: &[u32],
        pos: &[u32],
        slots: &[u32],
        outputs: &[u32],
        prof: &mut Profile,
    ) -> Result<()> {
        self.prefill_inner(g, tokens, pos, slots, outputs, Some(prof))
    }

    fn prefill_inner(
        &mut self,
        g: &Gpu,
        tokens: &[u32],
        pos: &[u32],
        slots: &[u32],
        outputs: &[u32],
        mut prof: Option<&mut Profile>,
    ) -> Result<()> {
        let n = tokens.len();
        ensure!(
            n > 0 && pos.len() == n && slots.len() == n,
            "prefill of {n} rows with {} positions and {} slots",
            pos.len(),
            slots.len()
        );
        ensure!(
            !outputs.is_empty()
                && outputs.len() <= self.max_batch
                && outputs.windows(2).all(|w| w[0] < w[1])
                && outputs.iter().all(|&o| (o as usize) < n),
            "prefill outputs {outputs:?}: need 1..={} ascending rows below {n}",
            self.max_batch
        );
        let offs = self.check_rows(tokens, pos, slots)?;
        let cap = n.min(self.prefill_rows);
        // Taken out while the chunks run (the layers read `self` beside it); an error drops
        // the buffers, and the next prompt allocates them again.
        let mut b = match self.pre.take() {
            Some(b) if b.cap >= cap => b,
            _ => PrefillBufs::new(
                g,
                &self.cfg,
                cap,
                self.max_batch,
                (self.opts.tile, self.prefill_split),
            )?,
        };
        let hid = self.cfg.hidden_size;
        let mut done = 0usize;
        for start in (0..n).step_by(cap) {
            let end = (start + cap).min(n);
            b.rows
                .upload(g, &tokens[start..end], &pos[start..end], &offs[start..end])?;
            let tiles = ops::prefill_attn_tiles(&pos[start..end], &offs[start..end]);
            let mut dt = b.attn_tiles.slice_mut(0..tiles.len());
            g.stream()
                .memcpy_htod(&tiles, &mut dt)
                .map_err(|e| anyhow::anyhow!("copying attention tiles: {:?}", e.0))?;
            let mut marks = Marks { events: Vec::new() };
            let profiling = prof.is_some();
            // Keys the chunk's rows see: up to the furthest position, one past it.
            let keys = pos[start..end].iter().max().map_or(0, |&p| p as usize + 1);
            self.enqueue_prefill(
                g,
                &b,
                (end - start, keys),
                tiles.len() / 2,
                profiling.then_some(&mut marks),
            )?;
            if let Some(p) = prof.as_deref_mut() {
                g.sync()?;
                p.add_marks(&marks)?;
            }
            let outs: Vec<u32> = outputs
                .iter()
                .filter(|&&o| (start..end).contains(&(o as usize)))
                .map(|&o| o - start as u32)
                .collect();
            if !outs.is_empty() {
                let mut dst = b.out_rows.slice_mut(0..outs.len());
                g.stream()
                    .memcpy_htod(&outs, &mut dst)
                    .map_err(|e| anyhow::anyhow!("copying output rows: {:?}", e.0))?;
                ops::rows_gather(
                    g,
                    g.ptr(&b.rows.x),
                    g.ptr(&b.out_rows),
                    g.ptr(&self.rows.x) + (done * hid * 4) as u64,
                    hid,
                    outs.len(),
                )?;
                done += outs.len();
            }
        }
        self.pre = Some(b);
        self.head(g, outputs.len())
    }

    /// Queue the layers of one prefill chunk of `n` rows seeing up to `keys` keys (inputs
    /// already in `b`).
    fn enqueue_prefill(
        &self,
        g: &Gpu,
        b: &PrefillBufs,
        (n, keys): (usize, usize),
        attn_tiles: usize,
        mut marks: Option<&mut Marks>,
    ) -> Result<()> {
        let mut mark = |label: &'static str| mark_event(g, marks.as_deref_mut(), label);
        let c = &self.cfg;
        let r = &b.rows;
        let sh = self.pass_shape();
        let AttnShape { hq, hkv, d } = sh.attn;
        let hid = c.hidden_size;
        let p = |s: &CudaSlice<f32>| g.ptr(s);
        let groups = ops::MoeGroups {
            perm: g.ptr(&b.perm),
            tiles: g.ptr(&b.tiles),
            ntiles: g.ptr(&b.ntiles),
            kernels: self.grouped,
        };
        let tc_attn = ops::prefill_attn_tc(sh.attn, sh.kv)?;
        // The bf16 copy of a dense GEMM's activations (n rows of at most max(H, Hq·D)): the
        // MoE's `part` scratch (n·k·H fp32), which holds nothing between the layers' MoE
        // calls; a shape where it is too small keeps the fp32-input GEMM.
        let fits = 2 * c.num_experts_per_tok * hid >= hid.max(hq * d);
        let gemm_scratch = (self.prefill_gemm_cp && fits).then(|| p(&r.part));
        let split = b.split.as_ref().map(|s| ops::SplitScratch {
            ptr: p(s),
            floats: s.len(),
        });
        mark("start")?;
        ops::embed(g, g.ptr(&self.w.embed), g.ptr(&r.tokens), p(&r.x), hid, n)?;
        mark("embed_gather")?;
        for (li, lw) in self.w.layers.iter().enumerate() {
            let l = self.layer_ptrs(g, li, lw);
            ops::rmsnorm(
                g,
                p(&r.x),
                None,
                g.ptr(&lw.attn_norm),
                p(&r.h),
                hid,
                n,
                sh.eps,
            )?;
            mark("rmsnorm")?;
            let qkv_w = lw.qkv_w.dev(g);
            ops::dense_gemm(
                g,
                qkv_w,
                Some(g.ptr(&lw.qkv_b)),
                p(&r.h),
                p(&r.qkv),
                n,
                (hq + 2 * hkv) * d,
                hid,
                false,
                gemm_scratch,
                split,
            )?;
            mark(if qkv_w.is_mxfp4() {
                "gemm_mxfp4 qkv"
            } else {
                "gemm qkv"
            })?;
            self.rope_kv(g, &sh, &l, r, n, ops::ROPE_PREFILL_HEADS, None)?;
            mark("rope_kv_write")?;
            if tc_attn {
                // A sliding layer's rows see at most their window (and the tile's spread).
                let seen = if l.window > 0 {
                    keys.min(l.window + ops::PFT_ROWS)
                } else {
                    keys
                };
                let splits = ops::attn_splits(sh.attn, g.sms(), n, attn_tiles, seen, split);
                ops::attention_rows_tc(
                    g,
                    sh.attn,
                    p(&r.q),
                    l.k_cache,
                    l.v_cache,
                    g.ptr(&r.pos),
                    g.ptr(&r.kv_off),
                    l.sinks,
                    p(&r.attn),
                    (g.ptr(&b.attn_tiles), attn_tiles, n),
                    l.window,
                    sh.scale,
                    (split, splits),
                )?;
            } else {
                ops::attention_rows(
                    g,
                    sh.attn,
                    p(&r.q),
                    l.k_cache,
                    l.v_cache,
                    sh.kv,
                    g.ptr(&r.pos),
                    g.ptr(&r.kv_off),
                    l.sinks,
                    p(&r.attn),
                    n,
                    l.window,
                    sh.scale,
                )?;
            }
            mark("attention (prefill rows)")?;
            let o_w = lw.o_w.dev(g);
            ops::dense_gemm(
                g,
                o_w,
                Some(g.ptr(&lw.o_b)),
                p(&r.attn),
                p(&r.x),
                n,
                hid,
                hq * d,
                true,
                gemm_scratch,
                split,
            )?;
            mark(if o_w.is_mxfp4() {
                "gemm_mxfp4 o (+residual)"
            } else {
                "gemm o (+residual)"
            })?;
            ops::rmsnorm(
                g,
                p(&r.x),
                None,
                g.ptr(&lw.mlp_norm),
                p(&r.h),
                hid,
                n,
                sh.eps,
            )?;
            mark("rmsnorm")?;
            // The router stays in fp32 (bf16 activations could flip near-tied expert choices
            // against the reference): a tiled fp32 GEMM over the chunk's rows with the top-k
            // fused, or (`MXTUNE_PREFILL_ROUTER=gemv`) the decode router's GEMV.
            if self.prefill_router.rows_kernel(n) {
                ops::router_rows(
                    g,
                    g.ptr(&lw.router_w),
                    Some(g.ptr(&lw.router_b)),
                    p(&r.h),
                    p(&r.r_logits),
                    c.num_local_experts,
                    hid,
                    n,
                    self.topk(g, r, li, None),
                )?;
                mark("router rows+topk (fp32)")?;
            } else {
                ops::router(
                    g,
                    g.ptr(&lw.router_w),
                    Some(g.ptr(&lw.router_b)),
                    p(&r.h),
                    p(&r.r_logits),
                    c.num_local_experts,
                    hid,
                    n,
                    None,
                    self.topk(g, r, li, None),
                    self.router_t1,
                )?;
                mark("gemv router+topk (fp32)")?;
            }
            ops::moe_grouped(
                g,
                &l.moe,
                sh.moe,
                self.opts.tile,
                c.num_local_experts,
                p(&r.h),
                r.idx_ptr(g, li),
                p(&r.r_w),
                &groups,
                p(&r.act),
                p(&r.part),
                p(&r.x),
                n,
                true,
            )?;
            mark("moe grouped (+residual)")?;
        }
        Ok(())
    }

    /// Run one step for the `n` rows set by [`Decoder::set_inputs`], attention sized for keys
    /// up to `full_keys`. With `graph` the step is captured once per batch size and context
    /// class ([`Decoder::graph_slot`]; [`Decoder::capture_all`] takes them all up front) and
    /// replayed.
    pub fn run(&mut self, g: &Gpu, n: usize, full_keys: usize, graph: bool) -> Result<()> {
        if !graph {
            return self.enqueue(g, n, full_keys, None);
        }
        let (slot, keys) = self.graph_slot(n, full_keys);
        self.capture(g, slot, n, keys)?;
        match &self.graphs[slot] {
            Some(graph) => graph
                .0
                .launch()
                .map_err(|e| anyhow::anyhow!("replaying the decode graph: {:?}", e.0)),
            None => anyhow::bail!("graph capture of the decode step produced no graph"),
        }
    }

    /// Leave the kernel groups `groups` out of every step from now on (empty: none), and drop
    /// the captured graphs so the next steps capture without them. For `engine profile
    /// --ablate` alone: a step without a group computes wrong values, but its time is what
    /// the step costs without that group's kernels. (`--timeline` calls it with none, to have
    /// the next step captured again.)
    pub fn set_ablated(&mut self, groups: &[StepGroup]) {
        self.ablated = groups.to_vec();
        self.graphs.iter_mut().for_each(|g| *g = None);
    }

    /// Whether a step launches the kernels of `group` (not ablated).
    fn runs(&self, group: StepGroup) -> bool {
        !self.ablated.contains(&group)
    }

    /// The graph slot of a step of `n` rows with keys up to `full_keys`, and the keys its
    /// graph is captured for: `2n` for short contexts (up to `ops::ATTN_GQA_FROM_KEYS` keys,
    /// the per-head attention kernel), `2n + 1` for long ones (up to the whole cache).
    fn graph_slot(&self, n: usize, full_keys: usize) -> (usize, usize) {
        let short = self.max_pos.min(ops::ATTN_GQA_FROM_KEYS);
        if full_keys > short {
            (2 * n + 1, self.max_pos)
        } else {
            (2 * n, short)
        }
    }

    /// Capture the step of `n` rows for `keys` into graph slot `slot`, unless it is there.
    fn capture(&mut self, g: &Gpu, slot: usize, n: usize, keys: usize) -> Result<()> {
        if self.graphs[slot].is_some() {
            return Ok(());
        }
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        g.stream()
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| anyhow::anyhow!("starting graph capture: {:?}", e.0))?;
        let queued = self.enqueue(g, n, keys, None);
        let captured = g
            .stream()
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(|e| anyhow::anyhow!("ending graph capture: {:?}", e.0));
        queued?;
        self.graphs[slot] = captured?.map(StepGraph);
        Ok(())
    }

    /// Capture every step a server can replay — each batch size up to the decoder's
    /// `max_batch`, short and (where the cache holds more than a short context) long —
    /// before the first request, as vLLM does at start-up: the first step of each size then
    /// pays no capture, and the driver's host memory for graphs is taken once instead of
    /// growing as traffic reaches new batch sizes (docs/perf.md, run 130). Returns how many
    /// graphs it captured.
    pub fn capture_all(&mut self, g: &Gpu) -> Result<usize> {
        let long = self.max_pos > ops::ATTN_GQA_FROM_KEYS;
        let mut captured = 0;
        for n in 1..=self.max_batch {
            for full_keys in [1, self.max_pos].into_iter().take(1 + usize::from(long)) {
                let (slot, keys) = self.graph_slot(n, full_keys);
                if self.graphs[slot].is_none() {
                    self.capture(g, slot, n, keys)?;
                    captured += usize::from(self.graphs[slot].is_some());
                }
            }
        }
        Ok(captured)
    }

    /// Run one step recording per-kernel-group GPU time into `prof`.
    pub fn run_profiled(
        &self,
        g: &Gpu,
        n: usize,
        full_keys: usize,
        prof: &mut Profile,
    ) -> Result<()> {
        let mut marks = Marks { events: Vec::new() };
        self.enqueue(g, n, full_keys, Some(&mut marks))?;
        g.sync()?;
        prof.add_marks(&marks)
    }

    /// Feed the step's sampled ids back as the next step's input (autoregressive decode
    /// without a host round trip).
    pub fn feed_back(&mut self, g: &Gpu, n: usize) -> Result<()> {
        let src = self.next.slice(0..n);
        let mut dst = self.rows.tokens.slice_mut(0..n);
        g.stream()
            .memcpy_dtod(&src, &mut dst)
            .map_err(|e| anyhow::anyhow!("copying sampled ids: {:?}", e.0))
    }

    /// Logits of row `row` of the last step.
    pub fn logits(&self, g: &Gpu, row: usize) -> Result<Vec<f32>> {
        let v = self.cfg.vocab_size;
        ensure!(row < self.max_batch, "row {row} beyond the batch");
        g.stream()
            .clone_dtoh(&self.logits.slice(row * v..(row + 1) * v))
            .map_err(|e| anyhow::anyhow!("copying logits: {:?}", e.0))
    }

    /// The experts the router picked for the first `n` rows of the last step run by
    /// [`Decoder::run`] or [`Decoder::run_profiled`] (not a prefill, which routes in its own
    /// buffers): per layer, the [n, k] indices row by row.
    pub fn routed_experts(&self, g: &Gpu, n: usize) -> Result<Vec<Vec<u32>>> {
        ensure!(
            n <= self.max_batch,
            "{n} rows beyond the batch ({})",
            self.max_batch
        );
        let all = g
            .stream()
            .clone_dtoh(&self.rows.r_idx)
            .map_err(|e| anyhow::anyhow!("copying routed expert indices: {:?}", e.0))?;
        let (k, experts) = (self.cfg.num_experts_per_tok, self.cfg.num_local_experts);
        all.chunks(self.rows.idx_stride)
            .enumerate()
            .map(|(li, layer)| {
                layer[..n * k]
                    .iter()
                    .map(|&e| {
                        u32::try_from(e)
                            .ok()
                            .filter(|&e| (e as usize) < experts)
                            .ok_or_else(|| {
                                anyhow::anyhow!(
                                    "layer {li}: the router wrote expert index {e}, not one of \
                                     the {experts} experts"
                                )
                            })
                    })
                    .collect()
            })
            .collect()
    }

    /// Greedy token ids of the first `n` rows of the last step.
    pub fn sampled(&self, g: &Gpu, n: usize) -> Result<Vec<u32>> {
        g.stream()
            .clone_dtoh(&self.next.slice(0..n))
            .map_err(|e| anyhow::anyhow!("copying sampled ids: {:?}", e.0))
    }
}

/// Whether a GPU architecture (`sm_90`, `sm_121`, `sm_90a`, …) has the E4M3 conversions an fp8
/// KV cache needs (sm_89 and later).
pub fn fp8_capable(arch: &str) -> bool {
    arch.strip_prefix("sm_")
        .map(|v| v.trim_end_matches(|c: char| c.is_ascii_alphabetic()))
        .and_then(|v| v.parse::<u32>().ok())
        .is_some_and(|n| n >= 89)
}

/// Record a profiling event labelled with the kernel group that just ended.
fn mark_event(g: &Gpu, marks: Option<&mut Marks>, label: &'static str) -> Result<()> {
    if let Some(m) = marks {
        let ev = g
            .context()
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| anyhow::anyhow!("creating a CUDA event: {:?}", e.0))?;
        ev.record(g.stream())
            .map_err(|e| anyhow::anyhow!("recording a CUDA event: {:?}", e.0))?;
        m.events.push((label, ev));
    }
    Ok(())
}

impl Decoder {
    /// Device address of the logits ([max_batch, vocab] fp32, rows of the last step), for
    /// kernels that read them in place (on-device sampling).
    pub fn logits_ptr(&self, g: &Gpu) -> u64 {
        g.ptr(&self.logits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_splits_follow_the_context_within_the_scratch() {
        // One split for a short row, one per `min_split` keys after that…
        assert_eq!(attn_splits(1, 32, ATTN_MAX_SPLITS), 1);
        assert_eq!(attn_splits(32, 32, ATTN_MAX_SPLITS), 1);
        assert_eq!(attn_splits(33, 32, ATTN_MAX_SPLITS), 2);
        assert_eq!(attn_splits(201, 32, ATTN_MAX_SPLITS), 7);
        assert_eq!(attn_splits(201, 8, ATTN_MAX_SPLITS), 26);
        // …up to the scratch's capacity (a graph sized for the whole cache).
        assert_eq!(attn_splits(8192, 32, ATTN_MAX_SPLITS), ATTN_MAX_SPLITS);
        assert_eq!(attn_splits(131072, 8, ATTN_MAX_SPLITS), ATTN_MAX_SPLITS);
        assert_eq!(attn_splits(8192, 32, 3), 3);
        assert_eq!(attn_splits(0, 0, 0), 1);
    }

    #[test]
    fn moe_tiles_have_rows_and_names() {
        assert_eq!(MoeTile::T64x128.rows(), 64);
        assert_eq!(MoeTile::T128x128.rows(), 128);
        assert_eq!(MoeTile::T128x128.name(), "128x128");
        assert_eq!(DecodeOptions::default().tile, MoeTile::Auto);
        // The tile list bound shrinks with the taller tile but always covers one per expert.
        assert_eq!(ops::moe_max_tiles(300, 4, MoeTile::T64x128), 5 + 4);
        assert_eq!(ops::moe_max_tiles(300, 4, MoeTile::T128x128), 3 + 4);
        assert_eq!(ops::moe_max_tiles(300, 4, MoeTile::Auto), 10 + 4);
        assert_eq!(MoeTile::T32x128.rows(), 32);
    }

    #[test]
    fn fp8_needs_sm89_or_later() {
        for a in ["sm_89", "sm_90", "sm_90a", "sm_100a", "sm_121", "sm_121a"] {
            assert!(fp8_capable(a), "{a}");
        }
        for a in ["sm_80", "sm_86", "sm_75", "gfx90a", "sm_", ""] {
            assert!(!fp8_capable(a), "{a}");
        }
    }
}
