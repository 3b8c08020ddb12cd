//! Typed launch wrappers, one per kernel: they check the shape rules each kernel relies on
//! and compute its grid, so the forward pass never builds an argument list by hand.
// The wrappers mirror the kernels' parameter lists one to one.
#![allow(clippy::too_many_arguments)]

use anyhow::{Result, ensure};

use super::device::{Arg, Gpu};
use super::gates::{ActFormat, DecodeGemv, KvDtype, MoeTile};

/// Optional device pointer → kernel argument (null when absent).
fn opt(p: Option<u64>) -> Arg {
    Arg::Ptr(p.unwrap_or(0))
}

fn i(v: usize) -> Result<Arg> {
    Ok(Arg::I32(i32::try_from(v).map_err(|_| {
        anyhow::anyhow!("dimension {v} does not fit the kernels' 32-bit sizes")
    })?))
}

fn u(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| anyhow::anyhow!("grid size {v} too large"))
}

/// Rows of a GEMV handled by one block (kernel constant `GEMV_ROWS_PER_BLOCK`).
const GEMV_ROWS: usize = 8;
/// Tokens sharing one weight pass (kernel constant `GEMV_MAX_TOKENS`).
const GEMV_TOKENS: usize = 4;
/// Tokens one pass of the tensor-core decode GEMV takes (kernel constant `TCG_TOKENS`); its
/// two entry points per weight format take up to 8 (one n8 tile) or up to 16.
const TCG_TOKENS: usize = 16;
/// Rows of a tensor-core GEMV block (one m16 tile).
const TCG_ROWS: usize = 16;
/// Threads of a tensor-core GEMV block (kernel constant `TCG_WARPS` × 32).
const TCG_THREADS: u32 = 256;
/// Rows of a tensor-core decode MoE block (kernel constant `TCM_ROWS`: a 16-row tile per warp).
const TCM_ROWS: usize = 128;
/// bf16 padding after each staged token row (kernel constant `TCG_XPAD`).
const TCG_XPAD: usize = 8;
/// Static shared memory of the tensor-core GEMV (the cross-warp sums and 1/rms per token).
const TCG_STATIC_SMEM: usize = 8 * 16 * TCG_TOKENS * 4 + TCG_TOKENS * 4;
/// Blocks of 32 a lane and row of the MXFP4 tensor-core GEMV takes a chunk (kernel constant
/// `TCG_FP4_NB`).
const TCG_FP4_NB: usize = 2;
/// Row tiles a block of the wide 16-token tensor-core GEMV (`_t16_r64`) takes (its TT).
const TCG_WIDE_TILES: usize = 4;
/// Most blocks the wide kernel splits a unit's K over.
const TCG_WIDE_MAX_SPLIT: usize = 8;

/// Warps per attention split block (kernel constant `ATTN_WARPS`).
const ATTN_WARPS: u32 = 4;
/// Most query heads per KV head `attn_split_gqa` takes (kernel constant `ATTN_GQA_MAX`); more
/// run `attn_split`, one block per query head.
const ATTN_GQA_MAX: usize = 8;
/// Warps per `attn_split_gqa` block (kernel constant `ATTN_GQA_WARPS`).
const ATTN_GQA_WARPS: u32 = 4;
/// Threads of `attn_combine` (kernel constant `ATTN_COMBINE_THREADS`).
const ATTN_COMBINE_THREADS: u32 = 256;
/// Most decode-attention splits per (row, head) the combine takes (kernel constant
/// `ATTN_MAX_SPLITS`); also the split count of a graph captured for a long cache.
pub const ATTN_MAX_SPLITS: usize = 64;

/// out[t] = table[tokens[t]] (fp32), `tokens` device `u32`.
pub fn embed(g: &Gpu, table: u64, tokens: u64, out: u64, hidden: usize, t: usize) -> Result<()> {
    let blocks = u(hidden.div_ceil(256))?;
    g.launch(
        "embed_gather",
        (blocks, u(t)?, 1),
        (256, 1, 1),
        0,
        &[Arg::Ptr(table), Arg::Ptr(tokens), Arg::Ptr(out), i(hidden)?],
    )
}

/// y = rmsnorm(x (+= delta)) * w over `t` rows of `n`.
pub fn rmsnorm(
    g: &Gpu,
    x: u64,
    delta: Option<u64>,
    w: u64,
    y: u64,
    n: usize,
    t: usize,
    eps: f32,
) -> Result<()> {
    g.launch(
        "rmsnorm_residual",
        (u(t)?, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::Ptr(x),
            opt(delta),
            Arg::Ptr(w),
            Arg::Ptr(y),
            i(n)?,
            Arg::F32(eps),
        ],
    )
}

/// Below this many rows a GEMV gives each row a whole block (`gemv_bf16_wide`), so that
/// small projections (the router) still occupy every multiprocessor.
pub const GEMV_WIDE_ROWS: usize = 2048;

/// RMSNorm applied to a GEMV's input on the fly: `out = rmsnorm(x) · w` is also written.
#[derive(Debug, Clone, Copy)]
pub struct Norm {
    /// Norm weight (bf16, `cols`).
    pub w: u64,
    /// ε.
    pub eps: f32,
    /// Where the normalised input is written ([t, cols] fp32); 0: not written.
    pub out: u64,
}

/// An RMSNorm a kernel applies to its input itself (no normalised copy): weights and ε.
#[derive(Debug, Clone, Copy)]
pub struct InputNorm {
    /// Norm weight (bf16, the input's width).
    pub w: u64,
    /// ε.
    pub eps: f32,
}

/// y[t] (+)= W x[t] + b, W bf16 [rows, cols]; with `norm` the input is rmsnorm(x), folded into
/// the GEMV (and written to `norm.out`).
pub fn gemv(
    g: &Gpu,
    w: u64,
    bias: Option<u64>,
    x: u64,
    y: u64,
    rows: usize,
    cols: usize,
    t: usize,
    accumulate: bool,
    norm: Option<Norm>,
) -> Result<()> {
    gemv_launch(
        g, w, bias, x, y, rows, cols, t, accumulate, norm, None, false,
    )
}

/// Dynamic shared memory of one tensor-core GEMV block: its staged token rows (bf16, padded)
/// and the staging's per-segment squares and per-token sums.
pub fn tc_gemv_smem(cols: usize, t: usize) -> usize {
    tc_gemv_smem_width(cols, cols, t)
}

/// [`tc_gemv_smem`] with rows staged `width` columns wide (the wide kernel's K split stages
/// only its share of the columns).
fn tc_gemv_smem_width(cols: usize, width: usize, t: usize) -> usize {
    let nt = t.min(TCG_TOKENS);
    let segs = cols.div_ceil(4).div_ceil(32);
    nt * (width + TCG_XPAD) * 2 + (nt * segs + nt) * 4
}

/// Columns of one K chunk of the tensor-core GEMV (4 lanes' spans): 64 bf16, or
/// 4 · 32 · `TCG_FP4_NB` MXFP4.
fn tc_chunk_cols(format: &str) -> usize {
    if format == "bf16" {
        64
    } else {
        4 * 32 * TCG_FP4_NB
    }
}

/// Columns one block of `plan` stages for a row of `cols` (`chunk` columns a K chunk): all of
/// them, but for the wide kernel's K split, its share of the chunks ([`tc_split_width`]).
fn tc_plan_width(plan: &TcgPlan, cols: usize, chunk: usize) -> usize {
    if plan.tiles_per_block == TCG_WIDE_TILES {
        tc_split_width(cols, chunk, plan.ksplit)
    } else {
        cols
    }
}

/// One block's share of a row of `cols` split `ks` ways in chunks of `chunk` columns (the wide
/// kernel's `kw`): all of it for one.
fn tc_split_width(cols: usize, chunk: usize, ks: usize) -> usize {
    (cols.div_ceil(chunk).div_ceil(ks.max(1)) * chunk).min(cols)
}

/// Whether the tensor-core GEMV takes weights `w` of `rows` × `cols` at `t` tokens: each
/// lane's span ([`DenseW::tc_span`]) whole, the staged tokens within the device's shared
/// memory, and an MXFP4 matrix's blocks indexable in 32 bits (its kernels' clamped loads,
/// `TCG_LOAD_CLAMP_FP4` in gemv_tc.cu; a larger one runs on the SIMT GEMV).
pub(crate) fn tc_gemv_fits(g: &Gpu, w: DenseW, rows: usize, cols: usize, t: usize) -> bool {
    let indexable = match w {
        DenseW::Bf16(_) => true,
        DenseW::Mxfp4 { .. } => rows.saturating_mul(cols / 32) <= u32::MAX as usize,
    };
    indexable
        && cols.is_multiple_of(w.tc_span())
        && tc_gemv_smem(cols, t.min(TCG_TOKENS)) + TCG_STATIC_SMEM <= g.max_shared()
}

/// Environment knob for tuning runs: the most tokens the tensor-core GEMV takes per pass over
/// the weights, 8 (the default) or 16. With 8, a batch of 9–16 runs the 8-token kernel as two
/// token groups (a grid of two blocks per row tile): each weight is read twice, the second
/// time mostly from L2, but a block stages half the activations (47 KB instead of 94 KB at
/// K = 2880), fits 3 blocks per SM instead of 2 and the grid fills the chip in fewer waves
/// (run 61 on an H100, batch 16: qkv 2.33 -> 1.63 ms, o 1.53 -> 0.99, lm_head 1.36 -> 1.10, the
/// step 22.22 -> 21.25 ms). Either gives bit-identical results: each token's dot products are
/// the same mma sequence whatever the pass.
pub const TCG_PASS_ENV: &str = "MXTUNE_TCG_PASS";

/// Most tokens one pass of the tensor-core GEMV takes ([`TCG_PASS_ENV`]; 8 unless set to 16).
fn tc_gemv_pass() -> Result<usize> {
    static PASS: std::sync::OnceLock<Result<usize, String>> = std::sync::OnceLock::new();
    env_once(&PASS, || match std::env::var(TCG_PASS_ENV).as_deref() {
        Err(_) | Ok("") | Ok("8") => Ok(8),
        Ok("16") => Ok(TCG_TOKENS),
        Ok(v) => anyhow::bail!("{TCG_PASS_ENV}={v}: expected 8 or 16"),
    })
}

/// Environment knob for A/B runs: `MXTUNE_TCG_PERSIST=0` gives every row tile of the
/// tensor-core GEMV its own block, as before the persistent grid ([`tc_gemv_plan`]).
pub const TCG_PERSIST_ENV: &str = "MXTUNE_TCG_PERSIST";

/// Whether a long matrix runs on a grid of the resident slots ([`TCG_PERSIST_ENV`]; on
/// unless set to 0).
fn tc_gemv_persist() -> Result<bool> {
    static ON: std::sync::OnceLock<Result<bool, String>> = std::sync::OnceLock::new();
    env_switch(&ON, TCG_PERSIST_ENV)
}

/// An environment setting read once into `cell` by `read`: every later call gives the same
/// value, or the same error (which `read` words, naming the variable).
fn env_once<T: Clone>(
    cell: &'static std::sync::OnceLock<Result<T, String>>,
    read: impl FnOnce() -> Result<T>,
) -> Result<T> {
    cell.get_or_init(|| read().map_err(|e| e.to_string()))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// An on/off tuning switch: environment variable `name` set to 1 (or unset, or empty: on) or
/// 0, read once into `cell`; any other value is an error naming the variable.
fn env_switch(
    cell: &'static std::sync::OnceLock<Result<bool, String>>,
    name: &str,
) -> Result<bool> {
    env_once(cell, || match std::env::var(name).as_deref() {
        Err(_) | Ok("") | Ok("1") => Ok(true),
        Ok("0") => Ok(false),
        Ok(v) => anyhow::bail!("{name}={v}: expected 0 or 1"),
    })
}

/// Fewest tokens at which a short plain matrix splits K ([`tc_gemv_plan`]): at one token the
/// pair's combine cost more than the balance gained (H100, o: 0.55 -> 0.59 ms a step at batch
/// 1; 0.65 -> 0.63 at 4, 0.85 -> 0.82 at 8: docs/perf.md run 127).
const TCG_SPLIT_FROM: usize = 4;

/// The same for a bf16 matrix whose unsplit grid fits the resident blocks of the entry without
/// a norm ([`tc_gemv_entry`]), which then runs it: H200, o at 4–8 tokens unsplit on it against
/// split on the shared entry (docs/perf.md runs 397–398): 120b batch 4 / 5 / 7 / 8 −0.2 /
/// −0.5 / −0.1 / −0.7 %, 20b batch 8 −0.3 %, batch 6 +0.1 %. MXFP4 keeps 4 (all-MXFP4 batch 8
/// +0.3 % unsplit), and so does a grid the entry does not fit (unsplit on the shared entry
/// lost: batch 8 +0.8 %).
const TCG_SPLIT_FROM_BF16: usize = 9;

/// A matrix of at least this many waves of the resident slots runs on a grid of the slots.
const TCG_PERSIST_WAVES: usize = 4;

/// How one tensor-core GEMV launch covers its matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcgPlan {
    /// Tokens one pass over the weights takes: 8 or [`TCG_TOKENS`] (the kernel).
    pub per_pass: usize,
    /// Blocks per pass and K split; fewer than the row tiles when each block streams several.
    pub grid_x: usize,
    /// Blocks sharing each row tile's K (1 or 2: the grid's z).
    pub ksplit: usize,
    /// Row tiles of 16 each block takes at once, one staging of its tokens serving them all
    /// (1 or 2: the `_t8` and `_t8_r32` kernels).
    pub tiles_per_block: usize,
}

/// Row tiles of a streamed matrix's unit ([`TcgStream::Units`]): the `_r128` kernels, one
/// warp a tile over all of K.
pub const TCG_STREAM_TILES: usize = 8;

/// Fewest units of [`TCG_STREAM_TILES`] tiles a block of a streamed matrix must get, on
/// average, for it to run on them: fewer leave the last round of units on part of the grid.
const TCG_STREAM_ROUNDS: usize = 3;

/// How a long matrix runs on a grid of the resident slots ([`TCG_STREAM_ENV`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcgStream {
    /// Units of one row tile, the tile's K shared by the block's warps (`_t8`, `_t16`); bf16
    /// weights at one token keep a block per tile.
    Tiles,
    /// A matrix of at least [`TCG_STREAM_ROUNDS`] units of [`TCG_STREAM_TILES`] tiles a slot
    /// of the 8-token kernel runs on such units (`_t8_r128`, `_t16_r128`) at every token
    /// count, streamed on the slots, so a row's sums are the same bits at every batch; a
    /// shorter one as `Tiles`.
    Units,
}

/// Environment knob for A/B runs: `MXTUNE_TCG_STREAM=units|tiles` ([`TcgStream`]; unset or
/// empty: `units`).
pub const TCG_STREAM_ENV: &str = "MXTUNE_TCG_STREAM";

/// [`TCG_STREAM_ENV`], read once; a bad value is an error naming it.
fn tc_gemv_stream() -> Result<TcgStream> {
    static S: std::sync::OnceLock<Result<TcgStream, String>> = std::sync::OnceLock::new();
    env_once(&S, || {
        let choices = [("units", TcgStream::Units), ("tiles", TcgStream::Tiles)];
        env_choice(TCG_STREAM_ENV, &choices)
    })
}

/// Environment knob for A/B runs: `MXTUNE_TCG_TILES=1|2` fixes the row tiles a block of the
/// 8-token tensor-core GEMV takes at once where it may take several ([`tc_gemv_plan`]); 4
/// puts every matrix that is not streamed on the wide plan at 9–16 tokens
/// ([`tc_gemv_wide_plan`], its split picked as usual), o's K-split passes included.
pub const TCG_TILES_ENV: &str = "MXTUNE_TCG_TILES";

/// [`TCG_TILES_ENV`]: `None` (unset or empty) for the planner's own choice.
fn tc_gemv_tiles_pref() -> Result<Option<usize>> {
    static PREF: std::sync::OnceLock<Result<Option<usize>, String>> = std::sync::OnceLock::new();
    env_once(&PREF, || match std::env::var(TCG_TILES_ENV).as_deref() {
        Err(_) | Ok("") => Ok(None),
        Ok("1") => Ok(Some(1)),
        Ok("2") => Ok(Some(2)),
        Ok("4") => Ok(Some(TCG_WIDE_TILES)),
        Ok(v) => anyhow::bail!("{TCG_TILES_ENV}={v}: expected 1, 2 or 4"),
    })
}

/// Environment knob for A/B runs: `MXTUNE_TCG_SPLIT=0` keeps K whole in every block of the
/// tensor-core GEMV ([`tc_gemv_plan`]'s split off).
pub const TCG_SPLIT_ENV: &str = "MXTUNE_TCG_SPLIT";

/// Whether a short plain matrix may split K over two blocks ([`TCG_SPLIT_ENV`]; on unless 0).
fn tc_gemv_split_on() -> Result<bool> {
    static ON: std::sync::OnceLock<Result<bool, String>> = std::sync::OnceLock::new();
    env_switch(&ON, TCG_SPLIT_ENV)
}

/// Environment knob for A/B runs: `MXTUNE_TCG_SPLIT_FROM=N` (1–64) splits a short plain
/// matrix's K from N tokens instead of [`TCG_SPLIT_FROM`] or [`TCG_SPLIT_FROM_BF16`].
pub const TCG_SPLIT_FROM_ENV: &str = "MXTUNE_TCG_SPLIT_FROM";

/// [`TCG_SPLIT_FROM_ENV`], else [`TCG_SPLIT_FROM_BF16`] where `plain_fits` says the matrix's
/// unsplit grid runs on the entry without a norm, else [`TCG_SPLIT_FROM`]; a bad value is an
/// error naming it.
fn tc_gemv_split_from(plain_fits: impl FnOnce() -> Result<bool>) -> Result<usize> {
    static N: std::sync::OnceLock<Result<Option<usize>, String>> = std::sync::OnceLock::new();
    match env_once(&N, || env_whole(TCG_SPLIT_FROM_ENV, 1..=64, "tokens"))? {
        Some(n) => Ok(n),
        None if plain_fits()? => Ok(TCG_SPLIT_FROM_BF16),
        None => Ok(TCG_SPLIT_FROM),
    }
}

/// The plan for `tiles` row tiles of 16 and `t` tokens of weights of `bytes32` bytes per 32
/// (64 bf16, 17 MXFP4). `slots` is how many blocks of the 8-token and of the 16-token kernel
/// the whole device holds at once; `pass` the most tokens a pass takes unless the matrix is
/// streamed ([`TCG_PASS_ENV`]: 8 or 16).
///
/// Each block stages its tokens' activations (t × cols × 4 bytes of fp32) before it streams
/// one tile's weights (16 × cols × bytes32 / 32 bytes): a block per tile reads as many
/// activation bytes as bf16 weight bytes at 8 tokens. A long matrix (the lm_head: 12 568 tiles
/// of gpt-oss) of at least [`TCG_PERSIST_WAVES`] waves of the slots whose blocks would stage
/// at least a quarter as many bytes as they stream (bf16 from 2 tokens, MXFP4 from 1)
/// therefore runs on a grid of the slots, each block staging once and streaming tile after
/// tile, and takes up to 16 tokens in one pass, so its weights are read from DRAM once a step.
/// (bf16 at one token, where the staging is an eighth of the weights, measured 2 % slower
/// streamed: docs/perf.md run 123.) The short ones (qkv, o, the router: at most ~2 waves)
/// keep a block per unit and 8 tokens per pass (run 61: two 8-token passes beat one 16-token
/// pass there, 3 blocks per SM against 2). With `persist` off every matrix keeps a block per
/// unit.
///
/// A unit is one row tile in one pass, two in two or more (`tiles_pref` overrides: 1 or 2):
/// a block of two tiles stages its 8 tokens once for 32 rows, so at batch 9–16 qkv's blocks
/// stage half the activation bytes and fit the chip in one wave (H100, docs/perf.md run 140:
/// 120b batch 16 +4.3 %, 12 +3.0 %, 9 +1.0 %; in one pass two tiles lost, run 139).
///
/// A matrix of a block per unit whose blocks fill at most half the slots (the o projection of
/// gpt-oss: 180 tiles against 396 slots of an H100 up to 8 tokens, so 48 SMs hold two blocks
/// and 84 one: the step waits on the SMs with two; 90 units in each of two passes) splits
/// each unit's K over two blocks when `split` allows it (no norm folded in, at least one chunk
/// per warp in each half, the scratch large enough: `split_from` is then `Some`) and it has
/// at least `split_from` tokens ([`TCG_SPLIT_FROM`], or [`TCG_SPLIT_FROM_BF16`] for a bf16 one
/// the entry without a norm takes unsplit, unless [`TCG_SPLIT_FROM_ENV`] says):
/// twice the blocks, each half the weights and half the staging, and the second of a pair
/// adds the two partial sums in a fixed order.
///
/// `stream` ([`TcgStream`]): with `Units`, a matrix of at least [`TCG_STREAM_ROUNDS`] units
/// of [`TCG_STREAM_TILES`] tiles a slot of the 8-token kernel is streamed at every token
/// count (bf16 at one token too) on such units (`tiles_per_block` 8; `tiles_pref` 1 or 8
/// fixes the unit where the matrix is streamed).
pub fn tc_gemv_plan(
    tiles: usize,
    t: usize,
    bytes32: usize,
    pass: usize,
    persist: bool,
    stream: TcgStream,
    slots: [usize; 2],
    split_from: Option<usize>,
    tiles_pref: Option<usize>,
) -> TcgPlan {
    let slots = |per_pass: usize| slots[usize::from(per_pass != 8)].max(1);
    // Units of TCG_STREAM_TILES by the matrix alone (the 8-token slots), never by t: a row's
    // sums then take the same order at every batch.
    let units8 = persist
        && stream == TcgStream::Units
        && tiles.div_ceil(TCG_STREAM_TILES) >= TCG_STREAM_ROUNDS * slots(8);
    let persist = persist && (32 * t >= bytes32 || units8);
    let per_pass = if t <= 8 {
        8
    } else if pass == TCG_TOKENS || (persist && tiles >= TCG_PERSIST_WAVES * slots(TCG_TOKENS)) {
        TCG_TOKENS
    } else {
        8
    };
    let passes = t.div_ceil(per_pass).max(1);
    let grid_x = if persist && tiles * passes >= TCG_PERSIST_WAVES * slots(per_pass) {
        (slots(per_pass) / passes).clamp(1, tiles)
    } else {
        tiles
    };
    let tiles_per_block = if per_pass == 8 && grid_x == tiles {
        tiles_pref.unwrap_or(if passes >= 2 { 2 } else { 1 })
    } else if grid_x < tiles {
        // Streamed: units of TCG_STREAM_TILES tiles by the rule above (`tiles_pref` 1 or
        // TCG_STREAM_TILES fixes it).
        match tiles_pref {
            Some(TCG_STREAM_TILES) => TCG_STREAM_TILES,
            Some(_) => 1,
            None if units8 => TCG_STREAM_TILES,
            None => 1,
        }
    } else {
        1
    };
    let units = tiles.div_ceil(tiles_per_block);
    let ksplit = if split_from.is_some_and(|n| t >= n)
        && grid_x == tiles
        && 2 * units * passes <= slots(per_pass)
    {
        2
    } else {
        1
    };
    TcgPlan {
        per_pass,
        grid_x: if grid_x == tiles { units } else { grid_x },
        ksplit,
        tiles_per_block,
    }
}

/// Environment knob for A/B runs: `MXTUNE_TCG_WIDE=0` keeps 9–16 tokens on two passes of the
/// 8-token kernel ([`tc_gemv_wide_plan`] off); `MXTUNE_TCG_WIDE=N` (1–8) runs the wide kernel
/// with that K split for every matrix it fits in one wave (also those whose two passes split
/// K); unset, empty or `auto`: the planner's choice.
pub const TCG_WIDE_ENV: &str = "MXTUNE_TCG_WIDE";

/// [`TCG_WIDE_ENV`]: `Some(None)` auto, `Some(Some(n))` the split fixed, `None` off.
fn tc_gemv_wide_pref() -> Result<Option<Option<usize>>> {
    static PREF: std::sync::OnceLock<Result<Option<Option<usize>>, String>> =
        std::sync::OnceLock::new();
    env_once(&PREF, || {
        if std::env::var(TCG_WIDE_ENV).as_deref() == Ok("auto") {
            return Ok(Some(None));
        }
        let what =
            format!("blocks a unit's K is split over, 1 to {TCG_WIDE_MAX_SPLIT} (0: off), or auto");
        Ok(
            match env_whole(TCG_WIDE_ENV, 0..=TCG_WIDE_MAX_SPLIT, &what)? {
                None => Some(None),
                Some(0) => None,
                Some(n) => Some(Some(n)),
            },
        )
    })
}

/// The wide plan of a tensor-core GEMV at 9–16 tokens: one pass of all of them through
/// `_t16_r64`, whose blocks take four row tiles (64 rows: one staging of the 16 tokens serves
/// them) and split each unit's K over `ksplit` blocks, each staging and streaming only its
/// share of the chunks; the last of a unit's blocks adds their partial sums (and, with a
/// norm, their squares) in order. Two passes of the 8-token kernel read every weight twice
/// and each of their blocks stages its 8 tokens over all of K before its first sums (H200,
/// gpt-oss-120b batch 16: qkv 23 µs a layer, 23 % of the bandwidth; o 18 µs). The split: the
/// largest up to [`TCG_WIDE_MAX_SPLIT`] whose `units · ksplit` blocks fit one wave of the
/// resident slots (`slots(ks)`: blocks the device holds with that split's staging), whose
/// last block has chunks (`nchunks` a row), and whose partial sums fit the scratch (`rows`
/// × `t` × ks floats); no split where the norm's output is written (`norm_out`: a block sees
/// only its columns' squares). `fixed` tries that split alone. None where no split fits a
/// wave (the caller keeps the two-pass plan): gpt-oss qkv (320 tiles) on 132 SMs of 2 blocks
/// takes 80 units × 3, o (180 tiles) 45 × 5.
pub fn tc_gemv_wide_plan(
    tiles: usize,
    nchunks: usize,
    rows: usize,
    t: usize,
    norm_out: bool,
    fixed: Option<usize>,
    slots: impl Fn(usize) -> Result<usize>,
) -> Result<Option<TcgPlan>> {
    if !(9..=TCG_TOKENS).contains(&t) || tiles == 0 {
        return Ok(None);
    }
    let units = tiles.div_ceil(TCG_WIDE_TILES);
    if units > super::device::SPLIT_CNT_LEN {
        return Ok(None);
    }
    let candidates: Vec<usize> = match fixed {
        Some(n) => vec![n],
        None => (1..=TCG_WIDE_MAX_SPLIT).rev().collect(),
    };
    for ks in candidates {
        let fits = ks == 1
            || (!norm_out
                && (ks - 1) * nchunks.div_ceil(ks) < nchunks
                && ks * t * (rows + 1) <= super::device::SPLIT_PART_LEN);
        if fits && units * ks <= slots(ks)? {
            return Ok(Some(TcgPlan {
                per_pass: TCG_TOKENS,
                grid_x: units,
                ksplit: ks,
                tiles_per_block: TCG_WIDE_TILES,
            }));
        }
    }
    Ok(None)
}

/// [`dense_gemv`] on tensor cores (`gemv_tc.cu`): the activations (times the norm weight)
/// rounded to bf16, bf16 weights or MXFP4 blocks dequantized to bf16 in registers (exact),
/// each weight read once per 8 tokens (16 with `MXTUNE_TCG_PASS=16`, [`TCG_PASS_ENV`]).
/// `tiles` fixes the row tiles a block takes where the plan lets a block take several
/// (`None`: [`TCG_TILES_ENV`], else the planner's choice; the selftest checks each variant
/// with `Some`; [`tc_gemv_launch_plan`] with the same arguments is the plan it runs). `cols`
/// a multiple of 16 (bf16) or 32 (MXFP4).
pub(crate) fn dense_gemv_tc(
    g: &Gpu,
    w: DenseW,
    bias: Option<u64>,
    x: u64,
    y: u64,
    rows: usize,
    cols: usize,
    t: usize,
    accumulate: bool,
    norm: Option<Norm>,
    tiles: Option<usize>,
) -> Result<()> {
    let (format, weights) = match w {
        DenseW::Bf16(p) => ("bf16", vec![Arg::Ptr(p)]),
        DenseW::Mxfp4 { blocks, scales } => ("fp4", vec![Arg::Ptr(blocks), Arg::Ptr(scales)]),
    };
    ensure!(
        tc_gemv_fits(g, w, rows, cols, t),
        "tensor-core {format} GEMV {rows}x{cols}: the width not a multiple of {}, its staged \
         tokens beyond the device's shared memory, or an MXFP4 matrix of 2^32 blocks or more",
        w.tc_span()
    );
    let plan = tc_gemv_launch_plan(g, format, rows, cols, t, norm, tiles)?;
    let entry = tc_gemv_entry(g, format, &plan, cols, t, norm)?;
    tc_gemv_launch(
        g, format, entry, &plan, weights, bias, x, y, rows, cols, t, accumulate, norm,
    )
}

/// Launch tensor-core GEMV `entry` (a `gemv_tc_*` entry point of `format`, "bf16" or "fp4":
/// they share one argument list) with `plan`, `weights` its weight arguments (bf16: the
/// matrix; MXFP4: blocks, scales).
#[allow(clippy::too_many_arguments)]
fn tc_gemv_launch(
    g: &Gpu,
    format: &str,
    entry: &str,
    plan: &TcgPlan,
    weights: Vec<Arg>,
    bias: Option<u64>,
    x: u64,
    y: u64,
    rows: usize,
    cols: usize,
    t: usize,
    accumulate: bool,
    norm: Option<Norm>,
) -> Result<()> {
    let width = tc_plan_width(plan, cols, tc_chunk_cols(format));
    ensure!(
        width == cols || norm.is_none_or(|n| n.out == 0),
        "a K-split tensor-core GEMV cannot write the normalised input"
    );
    let (part, cnt) = g.split_scratch();
    let mut args = weights;
    args.extend([
        opt(bias),
        Arg::Ptr(x),
        Arg::Ptr(y),
        i(rows)?,
        i(cols)?,
        i(t)?,
        Arg::I32(accumulate as i32),
        opt(norm.map(|n| n.w)),
        Arg::F32(norm.map_or(0.0, |n| n.eps)),
        opt(norm.map(|n| n.out)),
        Arg::Ptr(part),
        Arg::Ptr(cnt),
    ]);
    g.launch(
        entry,
        (
            u(plan.grid_x)?,
            u(t.div_ceil(plan.per_pass))?,
            u(plan.ksplit)?,
        ),
        (TCG_THREADS, 1, 1),
        u(tc_gemv_smem_width(cols, width, t.min(plan.per_pass)))?,
        &args,
    )
}

/// Environment switch of the 8-token bf16 GEMV's entry without a norm
/// (`gemv_tc_bf16_t8_plain`: the norm compiled out, registers for two blocks an SM):
/// `on` (the default: [`tc_gemv_entry`] takes it where it fits) or `off` (the shared entry,
/// which tests for the norm at run time; the same sums, for A/B timing).
pub const TCG_PLAIN_ENV: &str = "MXTUNE_TCG_PLAIN";

fn tc_gemv_plain_on() -> Result<bool> {
    static V: std::sync::OnceLock<Result<bool, String>> = std::sync::OnceLock::new();
    env_once(&V, || {
        env_choice(TCG_PLAIN_ENV, &[("on", true), ("off", false)])
    })
}

/// The 8-token bf16 entry without a norm ([`tc_gemv_entry`]).
const TCG_PLAIN_ENTRY: &str = "gemv_tc_bf16_t8_plain";

/// The entry a tensor-core GEMV launch of `plan` runs: [`tc_gemv_kernel`]'s, or for a bf16
/// GEMV of up to 8 tokens without a norm and without a K split (the o projection up to 8
/// tokens) whose grid fits the resident blocks of `gemv_tc_bf16_t8_plain` (two an SM: it
/// does not spill where the shared entry, capped for three, does) that one
/// ([`TCG_PLAIN_ENV`]). H200, docs/perf.md run 395: 120b batch 1 / 2 / 3 −0.1 / −0.7 /
/// −0.4 %, depth 4096 −0.7 %, 20b batch 1 −0.4 %; at batch 4, where o's K split makes 360
/// blocks, +3.2 % (hence the fit).
pub fn tc_gemv_entry(
    g: &Gpu,
    format: &str,
    plan: &TcgPlan,
    cols: usize,
    t: usize,
    norm: Option<Norm>,
) -> Result<&'static str> {
    let kernel = tc_gemv_kernel(format, plan.per_pass, plan.tiles_per_block);
    if kernel != "gemv_tc_bf16_t8" || norm.is_some() || plan.ksplit > 1 {
        return Ok(kernel);
    }
    let blocks = plan.grid_x * t.div_ceil(plan.per_pass);
    Ok(match tc_plain_slots(g, cols, t.min(plan.per_pass))? {
        Some(n) if blocks <= n => TCG_PLAIN_ENTRY,
        _ => kernel,
    })
}

/// Blocks of [`TCG_PLAIN_ENTRY`] resident on the device at once for `cols` columns and `t`
/// staged tokens, or None where [`TCG_PLAIN_ENV`] switches the entry off.
fn tc_plain_slots(g: &Gpu, cols: usize, t: usize) -> Result<Option<usize>> {
    if !tc_gemv_plain_on()? {
        return Ok(None);
    }
    let smem = tc_gemv_smem(cols, t);
    Ok(Some(
        g.resident_blocks(TCG_PLAIN_ENTRY, TCG_THREADS, smem)? * g.sms(),
    ))
}

/// The tensor-core GEMV entry point of `format` ("bf16" or "fp4") taking `per_pass` tokens and
/// `tiles` row tiles a block (more than one: 8 tokens a pass only).
fn tc_gemv_kernel(format: &str, per_pass: usize, tiles: usize) -> &'static str {
    match (format == "bf16", per_pass == 8, tiles) {
        (true, true, 2) => "gemv_tc_bf16_t8_r32",
        (true, true, TCG_STREAM_TILES) => "gemv_tc_bf16_t8_r128",
        (true, true, _) => "gemv_tc_bf16_t8",
        (true, false, TCG_WIDE_TILES) => "gemv_tc_bf16_t16_r64",
        (true, false, TCG_STREAM_TILES) => "gemv_tc_bf16_t16_r128",
        (true, false, _) => "gemv_tc_bf16_t16",
        (false, true, 2) => "gemv_tc_fp4_t8_r32",
        (false, true, TCG_STREAM_TILES) => "gemv_tc_fp4_t8_r128",
        (false, true, _) => "gemv_tc_fp4_t8",
        (false, false, TCG_WIDE_TILES) => "gemv_tc_fp4_t16_r64",
        (false, false, TCG_STREAM_TILES) => "gemv_tc_fp4_t16_r128",
        (false, false, _) => "gemv_tc_fp4_t16",
    }
}

/// The [`TcgPlan`] a tensor-core GEMV of `format` ("bf16" or "fp4") weights, `rows` × `cols`,
/// runs with for `t` tokens on this device (its kernels' resident blocks per SM, as the
/// driver counts them, times the SMs) with `norm` folded in; `tiles` fixes the row tiles a
/// block (`None`: [`TCG_TILES_ENV`], else the planner's choice; 4: the wide plan at 9–16
/// tokens, [`tc_gemv_wide_plan`], where it fits). At 9–16 tokens the wide plan replaces
/// [`tc_gemv_plan`]'s two passes of 8 unless [`TCG_WIDE_ENV`] is 0, 1 or 2 row tiles are
/// asked for, 16-token passes are asked for ([`TCG_PASS_ENV`]), the matrix is streamed, or
/// the two passes split K themselves (unless [`TCG_WIDE_ENV`] fixes the wide kernel's split).
pub fn tc_gemv_launch_plan(
    g: &Gpu,
    format: &str,
    rows: usize,
    cols: usize,
    t: usize,
    norm: Option<Norm>,
    tiles: Option<usize>,
) -> Result<TcgPlan> {
    let tiles_pref = match tiles {
        Some(n) => Some(n),
        None => tc_gemv_tiles_pref()?,
    };
    let slots = |per_pass: usize| -> Result<usize> {
        let kernel = tc_gemv_kernel(format, per_pass, 1);
        let smem = tc_gemv_smem(cols, t.min(per_pass));
        Ok(g.resident_blocks(kernel, TCG_THREADS, smem)? * g.sms())
    };
    // The 8-token kernels' K split: plain GEMVs only (their blocks do not combine a norm's
    // squares), each half at least one chunk per warp, and room in the scratch.
    let chunk = tc_chunk_cols(format);
    let tiles = rows.div_ceil(TCG_ROWS);
    let split = tc_gemv_split_on()?
        && norm.is_none()
        && cols.div_ceil(chunk) >= 2 * TCG_THREADS as usize / 32
        && 2 * t * rows <= super::device::SPLIT_PART_LEN
        && tiles * t.div_ceil(8) <= super::device::SPLIT_CNT_LEN;
    let pass = tc_gemv_pass()?;
    let plan = tc_gemv_plan(
        tiles,
        t,
        if format == "bf16" { 64 } else { 17 },
        pass,
        tc_gemv_persist()?,
        tc_gemv_stream()?,
        [slots(8)?, slots(TCG_TOKENS)?],
        if split {
            // bf16 from 9 tokens where the unsplit grid fits the entry without a norm.
            let plain_fits = || -> Result<bool> {
                Ok(format == "bf16"
                    && tc_plain_slots(g, cols, t.min(8))?.is_some_and(|n| tiles <= n))
            };
            Some(tc_gemv_split_from(plain_fits)?)
        } else {
            None
        },
        tiles_pref.filter(|&n| n != TCG_WIDE_TILES),
    );
    let wide = match tiles_pref {
        Some(TCG_WIDE_TILES) => Some(tc_gemv_wide_pref()?.flatten()),
        Some(_) => None,
        None if pass == 8 => tc_gemv_wide_pref()?,
        None => None,
    };
    // Where the two passes already split K (o: 360 blocks of 3 an SM) they keep it: the wide
    // kernel's 2 blocks an SM lost there (docs/perf.md run 270: o 18.1 -> 19.3 µs a layer at
    // batch 16, qkv 23.1 -> 20.1).
    let streamed = plan.grid_x * plan.tiles_per_block < tiles;
    let forced = tiles_pref == Some(TCG_WIDE_TILES);
    if let Some(fixed) = wide.filter(|fixed| {
        plan.per_pass == 8 && !streamed && (plan.ksplit == 1 || forced || fixed.is_some())
    }) {
        let kernel = tc_gemv_kernel(format, TCG_TOKENS, TCG_WIDE_TILES);
        let slots = |ks: usize| -> Result<usize> {
            let smem = tc_gemv_smem_width(cols, tc_split_width(cols, chunk, ks), t);
            Ok(g.resident_blocks(kernel, TCG_THREADS, smem)? * g.sms())
        };
        let norm_out = norm.is_some_and(|n| n.out != 0);
        let nchunks = cols.div_ceil(chunk);
        if let Some(p) = tc_gemv_wide_plan(tiles, nchunks, rows, t, norm_out, fixed, slots)? {
            return Ok(p);
        }
    }
    Ok(plan)
}

/// Routing fused into the router GEMV: the top-k experts of each token and their softmax
/// weights, picked by the last block to finish the token's logits.
#[derive(Debug, Clone, Copy)]
pub struct TopK {
    /// Expert indices [t, k] (i32).
    pub idx: u64,
    /// Their softmax weights [t, k] (fp32).
    pub w: u64,
    /// Experts per token.
    pub k: usize,
    /// Zeroed u32s, left zeroed ([`topk_counters`]): a mailbox of two per expert for each
    /// token, in which each block posts its logits with a flag and each token's routing warp
    /// (block 0's of its group) takes them as they come (no count); the groups' counters, one
    /// per group of 4 tokens, where the kernels count instead (`ROUTER_POLL_N` 0).
    pub counter: u64,
    /// The decode MoE's expert announcements ([`moe_ready_fits`], [`MoeWords`]). Every router
    /// launch given them must be followed by [`moe_gate_up`] and [`moe_down`] of the same
    /// words, or the next gate_up reads stale experts.
    pub ready: Option<MoeWords>,
}

/// The decode MoE's words, zeroed u32s one per (token, slot) pair, in two buffers of at least
/// t k each: `ready`, which the routing warp sets to expert + 1 as it picks each slot, for
/// [`moe_gate_up`]'s blocks to wait on before their wait, and [`moe_down`] clears past its
/// wait; `done`, the pair's gate_up count, which the router zeroes with its announcement and
/// each gate_up block adds to once its outputs are written, for [`moe_down`] to stage on.
/// Apart, because a count stays non-zero after its layer and, where the batch changes between
/// steps, one batch's announcement word must not be another's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeWords {
    pub ready: u64,
    pub done: u64,
}

/// Counters a [`TopK`] needs for up to `t` tokens of `experts` experts: the groups' counters,
/// or the tokens' mailboxes, whichever is longer (they share the words, both zero at rest).
pub fn topk_counters(t: usize, experts: usize) -> usize {
    t.div_ceil(GEMV_TOKENS).max(2 * t.max(1) * experts)
}

/// The top-k both routers take: 1 ≤ k ≤ 32 and no more than the experts.
fn check_topk(k: usize, experts: usize) -> Result<()> {
    ensure!(
        (1..=32).contains(&k) && k <= experts,
        "top-k {k} of {experts} experts unsupported (1 ≤ k ≤ 32)"
    );
    Ok(())
}

/// The router: logits[t] = W x[t] + b (optionally over rmsnorm(x)) and, in the same launch,
/// each token's top-k experts (ties: lower index) with the softmax over those k. With
/// `one_row_entry` ([`router_t1_enabled`]) one row with the norm runs `gemv_router_t1`, the
/// same sums from a third of the code; the selftest runs both and compares their bits.
#[allow(clippy::too_many_arguments)]
pub fn router(
    g: &Gpu,
    w: u64,
    bias: Option<u64>,
    x: u64,
    logits: u64,
    experts: usize,
    cols: usize,
    t: usize,
    norm: Option<Norm>,
    topk: TopK,
    one_row_entry: bool,
) -> Result<()> {
    ensure!(
        experts < GEMV_WIDE_ROWS,
        "{experts} experts: the fused router takes fewer than {GEMV_WIDE_ROWS}"
    );
    check_topk(topk.k, experts)?;
    gemv_launch(
        g,
        w,
        bias,
        x,
        logits,
        experts,
        cols,
        t,
        false,
        norm,
        Some(topk),
        one_row_entry,
    )
}

/// Environment switch of the prefill router: `rows` (the default: always [`router_rows`]),
/// `gemv` (always the decode router over every prompt row) or `auto`
/// ([`PrefillRouter::rows_kernel`]: the GEMV for passes of few rows, quicker there but not
/// the same sums, so a prompt's routing then depends on what else shares its pass).
pub const PREFILL_ROUTER_ENV: &str = "MXTUNE_PREFILL_ROUTER";

/// Which router a prefill pass runs ([`PREFILL_ROUTER_ENV`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillRouter {
    /// Always [`router_rows`]: a row's logits the same bits in any pass.
    Rows,
    /// [`router_rows`] for passes of many rows, the decode router's GEMV for few.
    Auto,
    /// Always [`router`].
    Gemv,
}

/// Fewest rows a prefill pass routes through [`router_rows`] under [`PrefillRouter::Auto`]:
/// its blocks take 16 rows each and walk the whole hidden size, so a pass of fewer rows
/// leaves most SMs idle and the decode GEMV (4 rows a block row, every expert row a block)
/// is the quicker (docs/perf.md, runs 154–155, 120b: 38 rows 3.73 → 0.88 ms; 512 rows 3.75
/// against 5.41; the crossing near 350).
pub const ROUTER_ROWS_FROM: usize = 352;

impl PrefillRouter {
    /// From [`PREFILL_ROUTER_ENV`]; a bad value is an error naming it.
    pub fn from_env() -> Result<Self> {
        env_choice(
            PREFILL_ROUTER_ENV,
            &[
                ("rows", Self::Rows),
                ("auto", Self::Auto),
                ("gemv", Self::Gemv),
            ],
        )
    }

    /// Whether a pass of `t` rows runs [`router_rows`].
    pub fn rows_kernel(self, t: usize) -> bool {
        match self {
            Self::Auto => t >= ROUTER_ROWS_FROM,
            Self::Rows => true,
            Self::Gemv => false,
        }
    }
}

/// The value of tuning switch `name` (an environment variable) among `choices` (word, value):
/// unset or empty gives the first choice (the default); any other word is an error naming the
/// variable and the words it takes.
fn env_choice<T: Copy>(name: &str, choices: &[(&str, T)]) -> Result<T> {
    choice(name, &std::env::var(name).unwrap_or_default(), choices)
}

/// A whole number in `range` from the environment variable `name` (None: unset or empty); any
/// other value is an error naming the variable and what it takes (`what`).
fn env_whole(
    name: &str,
    range: std::ops::RangeInclusive<usize>,
    what: &str,
) -> Result<Option<usize>> {
    match std::env::var(name).as_deref() {
        Err(_) | Ok("") => Ok(None),
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if range.contains(&n) => Ok(Some(n)),
            _ => anyhow::bail!("{name}={v}: expected a whole number of {what}"),
        },
    }
}

/// [`env_choice`] of the value `v`.
fn choice<T: Copy>(name: &str, v: &str, choices: &[(&str, T)]) -> Result<T> {
    let word = if v.is_empty() { choices[0].0 } else { v };
    match choices.iter().find(|(w, _)| *w == word) {
        Some(&(_, value)) => Ok(value),
        None => {
            let words: Vec<&str> = choices.iter().map(|(w, _)| *w).collect();
            anyhow::bail!("{name}={v}: expected {}", words.join(", "))
        }
    }
}

/// Environment variable choosing the prefill's dense GEMM over bf16 weights: `cp` (the
/// default: the activations rounded to bf16 once by `rows_bf16`, then `gemm_bf16_cp`, both
/// operands by `cp.async`) or `regs` (`gemm_bf16_tc`: fp32 activations through registers,
/// rounded in the loop; for A/B timing).
pub const PREFILL_GEMM_ENV: &str = "MXTUNE_PREFILL_GEMM";

/// Whether the prefill's bf16 GEMMs run `gemm_bf16_cp` ([`PREFILL_GEMM_ENV`]); a bad value is
/// an error naming it.
pub fn prefill_gemm_cp_from_env() -> Result<bool> {
    env_choice(PREFILL_GEMM_ENV, &[("cp", true), ("regs", false)])
}

/// The router of a prefill chunk of `t` tokens (kernel `router_rows`): logits[t] = W x[t] + b
/// with fp32 activations, 16 tokens a block reading the weights once, and each token's top-k
/// with the softmax over those k, in one launch. `topk.counter` is not used.
pub fn router_rows(
    g: &Gpu,
    w: u64,
    bias: Option<u64>,
    x: u64,
    logits: u64,
    experts: usize,
    cols: usize,
    t: usize,
    topk: TopK,
) -> Result<()> {
    check_topk(topk.k, experts)?;
    ensure!(
        cols.is_multiple_of(8),
        "hidden size {cols}: the prefill router reads rows in groups of 8 (a multiple of 8 needed)"
    );
    // The routing scratch: one copy of a token's logits per warp.
    let smem = 8 * experts * 4;
    ensure!(
        smem <= g.max_shared(),
        "{experts} experts: the prefill router's routing scratch ({smem} bytes) exceeds the \
         device's shared memory ({} bytes)",
        g.max_shared()
    );
    g.launch(
        "router_rows",
        (u(t.div_ceil(16))?, 1, 1),
        (256, 1, 1),
        u(smem)?,
        &[
            Arg::Ptr(w),
            opt(bias),
            Arg::Ptr(x),
            Arg::Ptr(logits),
            i(experts)?,
            i(cols)?,
            i(t)?,
            Arg::Ptr(topk.idx),
            Arg::Ptr(topk.w),
            i(topk.k)?,
        ],
    )
}

/// Most rows one block of `gemv_bf16_wide_rows` takes (kernel constant `GEMV_WIDE_R`).
const GEMV_WIDE_R: usize = 4;

/// Environment knob for A/B runs: rows per block of the wide GEMV (the router), 1
/// (`gemv_bf16_wide`) to [`GEMV_WIDE_R`] (`gemv_bf16_wide_rows`), instead of
/// [`wide_rows_per_block`]'s choice.
pub const WIDE_ROWS_ENV: &str = "MXTUNE_ROUTER_ROWS";

/// [`WIDE_ROWS_ENV`]'s value: None unset (or `auto`).
fn wide_rows_env() -> Result<Option<usize>> {
    static ROWS: std::sync::OnceLock<Result<Option<usize>, String>> = std::sync::OnceLock::new();
    env_once(&ROWS, || match std::env::var(WIDE_ROWS_ENV).as_deref() {
        Err(_) | Ok("") | Ok("auto") => Ok(None),
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if (1..=GEMV_WIDE_R).contains(&n) => Ok(Some(n)),
            _ => anyhow::bail!(
                "{WIDE_ROWS_ENV}={v}: expected auto or a row count from 1 to {GEMV_WIDE_R}"
            ),
        },
    })
}

/// Rows per block of the wide GEMV for `rows` rows and `t` tokens on `sms` SMs (1:
/// `gemv_bf16_wide`, more: `gemv_bf16_wide_rows`). A block reads its tokens' activations
/// (fp32, 4 tokens a block row) once for all its rows, so more rows a block divide those
/// reads: at 16 tokens a block of one router row reads 30 times as many activation bytes as
/// weight bytes. More rows a block also mean fewer blocks, each a longer chain: the fewest
/// rows a block whose grid fits two blocks an SM. H200, gpt-oss-120b (docs/perf.md run 262,
/// against the previous rule, which added rows while the grid kept half a block an SM:
/// 3 or 4 rows from batch 5): batch 6 / 8 one row −2.2 / −2.2 %, batch 10 / 12 / 14 / 16 two
/// rows −1.8 / −1.5 / −1.8 / −1.6 %, all-MXFP4 batch 8 / 16 −2.0 / −1.3 %; gpt-oss-20b's 32
/// experts keep one row.
pub fn wide_rows_per_block(rows: usize, t: usize, sms: usize, forced: Option<usize>) -> usize {
    if let Some(n) = forced {
        return n.clamp(1, GEMV_WIDE_R);
    }
    let blocks = rows * t.div_ceil(GEMV_TOKENS);
    blocks.div_ceil(2 * sms.max(1)).clamp(1, GEMV_WIDE_R)
}

/// Rows per block a wide GEMV launch (the SIMT GEMV of fewer than
/// [`GEMV_WIDE_ROWS`] rows: the router) takes on this device ([`wide_rows_per_block`], or
/// [`WIDE_ROWS_ENV`]).
pub fn wide_rows(g: &Gpu, rows: usize, t: usize) -> Result<usize> {
    Ok(wide_rows_per_block(rows, t, g.sms(), wide_rows_env()?))
}

/// Fewest rows from which the decode router lets the MoE's gate_up launch only when the
/// router's grid ends, instead of at its start (programmatic dependent launch): gate_up has
/// nothing to do before its wait, and launched early its blocks are placed around the
/// router's. H200, same call (docs/perf.md run 186): 120b batch 8 / 12 / 16 −2.1 / −0.8 /
/// −2.2 %, 20b batch 8 / 16 −3.1 / −2.5 %, but batch 2–7 +0.2 to +0.9 %.
pub const ROUTER_LATE_FROM: usize = 8;

/// Environment switch of the decode gate_up's own norm ([`moe_gate_up`]'s `norm`, with the
/// router's announcements): `on` (the default: gate_up normalises the residual itself and
/// stages it before its wait on the router, which writes no normalised copy) or `off` (gate_up
/// stages the router's normalised copy after that wait; for A/B timing).
pub const MOE_SELF_NORM_ENV: &str = "MXTUNE_MOE_SELF_NORM";

/// Whether the decode gate_up normalises its input itself ([`MOE_SELF_NORM_ENV`]); a bad
/// value is an error naming it.
pub fn moe_self_norm_enabled() -> Result<bool> {
    env_choice(MOE_SELF_NORM_ENV, &[("on", true), ("off", false)])
}

/// Environment switch of the decode down's combine ([`moe_down`]'s `mail`): `on` (the
/// default: below [`MOE_MAIL_BELOW`] rows each slot block posts its rows into a mailbox of
/// flagged words and the last slot's block of a row range sums them, no count) or `off` (the
/// slot blocks' count and the last one's reload of the rows at every batch; the same sums,
/// for A/B timing).
pub const MOE_MAIL_ENV: &str = "MXTUNE_MOE_MAIL";

/// Whether the decode down combines through its mailbox ([`MOE_MAIL_ENV`]); a bad value is an
/// error naming it.
pub fn moe_mail_enabled() -> Result<bool> {
    env_choice(MOE_MAIL_ENV, &[("on", true), ("off", false)])
}

/// Rows below which the decode step's down combines through its mailbox ([`MOE_MAIL_ENV`]).
/// H200, docs/perf.md run 384 (on against off, twice): 120b batch 1 / 2 / 4 −0.3 / −0.3 /
/// −0.2 %, all-MXFP4 batch 1 −0.5 %, depth 4096 −0.5 %, 20b batch 1 −0.3 %; batch 8 and 16
/// unchanged for 120b, 20b batch 16 +0.5 %.
pub const MOE_MAIL_BELOW: usize = 8;

/// u32s of the decode down's mailbox for up to `t` rows ([`moe_down`]'s `mail`): a 64-bit word
/// per (row, slot, output row), zero at rest (the combining block clears what it read).
pub fn moe_mail_words(s: MoeShape, t: usize) -> usize {
    2 * t * s.k * s.hidden
}

/// Environment switch of the one-row router entry (`gemv_router_t1`): `on` (the default) or
/// `off` (the general `gemv_bf16_wide` at every batch; the same sums, for A/B timing).
pub const ROUTER_T1_ENV: &str = "MXTUNE_ROUTER_T1";

/// Whether batch 1 routes through `gemv_router_t1` ([`ROUTER_T1_ENV`]); a bad value is an
/// error naming it.
pub fn router_t1_enabled() -> Result<bool> {
    env_choice(ROUTER_T1_ENV, &[("on", true), ("off", false)])
}

fn gemv_launch(
    g: &Gpu,
    w: u64,
    bias: Option<u64>,
    x: u64,
    y: u64,
    rows: usize,
    cols: usize,
    t: usize,
    accumulate: bool,
    norm: Option<Norm>,
    topk: Option<TopK>,
    one_row_entry: bool,
) -> Result<()> {
    let wide = rows < GEMV_WIDE_ROWS;
    let rpb = if wide { wide_rows(g, rows, t)? } else { 1 };
    // The router of ROUTER_LATE_FROM rows or more lets gate_up launch at its grid's end.
    let late = topk.is_some() && t >= ROUTER_LATE_FROM;
    // The router of one row: an entry compiled for exactly that (a third of the code).
    let t1 = topk.is_some()
        && norm.is_some()
        && t == 1
        && rpb == 1
        && cols.is_multiple_of(8)
        && one_row_entry;
    let (kernel, blocks) = match (wide, norm.is_some()) {
        (true, _) if t1 => ("gemv_router_t1", rows),
        (true, _) if rpb > 1 && late => ("gemv_bf16_wide_rows_late", rows.div_ceil(rpb)),
        (true, _) if rpb > 1 => ("gemv_bf16_wide_rows", rows.div_ceil(rpb)),
        (true, _) if late => ("gemv_bf16_wide_late", rows),
        (true, _) => ("gemv_bf16_wide", rows),
        (false, true) => ("gemv_bf16_norm", rows.div_ceil(GEMV_ROWS)),
        (false, false) => ("gemv_bf16", rows.div_ceil(GEMV_ROWS)),
    };
    // The routing block copies each token's logits into shared memory (a warp per token).
    let smem = if topk.is_some() {
        GEMV_TOKENS * rows * 4
    } else {
        0
    };
    let mut args = vec![
        Arg::Ptr(w),
        opt(bias),
        Arg::Ptr(x),
        Arg::Ptr(y),
        i(rows)?,
        i(cols)?,
        i(t)?,
        Arg::I32(accumulate as i32),
    ];
    if wide || norm.is_some() {
        args.extend([
            opt(norm.map(|n| n.w)),
            Arg::F32(norm.map_or(0.0, |n| n.eps)),
            opt(norm.map(|n| n.out)),
        ]);
    }
    if wide {
        args.extend([
            opt(topk.map(|k| k.idx)),
            opt(topk.map(|k| k.w)),
            i(topk.map_or(0, |k| k.k))?,
            opt(topk.map(|k| k.counter)),
            i(rpb)?,
            opt(topk.and_then(|k| k.ready).map(|r| r.ready)),
            opt(topk.and_then(|k| k.ready).map(|r| r.done)),
        ]);
    }
    g.launch(
        kernel,
        (u(blocks)?, u(t.div_ceil(GEMV_TOKENS))?, 1),
        (256, 1, 1),
        u(smem)?,
        &args,
    )
}

/// Attention geometry shared by the RoPE/KV-write and attention kernels.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Query heads.
    pub hq: usize,
    /// KV heads.
    pub hkv: usize,
    /// Head dimension.
    pub d: usize,
}

impl AttnShape {
    fn check(&self) -> Result<()> {
        ensure!(
            self.d.is_multiple_of(32) && self.d <= 128 && self.d >= 32,
            "head_dim {} unsupported by the CUDA kernels (a multiple of 32 up to 128)",
            self.d
        );
        ensure!(
            self.hkv > 0 && self.hq.is_multiple_of(self.hkv),
            "query heads {} not a multiple of KV heads {}",
            self.hq,
            self.hkv
        );
        Ok(())
    }
}

/// Rotate q/k of `t` tokens (positions `pos`, cache offsets `kv_off` in elements, device
/// arrays) and write k/v into the cache of element type `kv` (bf16, fp32 or fp8 E4M3).
/// Heads a block of `rope_kv` takes in a prefill chunk (decode takes 1: a step's few rows
/// spread over more blocks that way).
pub const ROPE_PREFILL_HEADS: usize = 8;

/// RoPE on q and k (after the projection's bias), k and v written into the cache of element
/// kind `kv`; `heads_per_block` heads a block (1 for decode, [`ROPE_PREFILL_HEADS`] for a
/// prefill chunk).
pub fn rope_kv(
    g: &Gpu,
    s: AttnShape,
    qkv: u64,
    q_out: u64,
    k_cache: u64,
    v_cache: u64,
    kv: KvDtype,
    inv_freq: u64,
    pos: u64,
    kv_off: u64,
    t: usize,
    mscale: f32,
    heads_per_block: usize,
    deferred: Option<QkvDeferred>,
) -> Result<()> {
    s.check()?;
    let (part, nz, bias, cols, eps) = match deferred {
        Some(q) => {
            ensure!(
                (1..=ROPE_MAX_SPLIT).contains(&q.nz),
                "rope_kv: a deferred qkv of {} K splits (at most {ROPE_MAX_SPLIT})",
                q.nz
            );
            (q.part, q.nz, q.bias, q.cols, q.eps)
        }
        None => (0, 0, 0, 0, 0.0),
    };
    // Up to 1024 threads a block.
    let hb = heads_per_block.clamp(1, (2048 / s.d).max(1));
    g.launch(
        "rope_kv_write",
        (u((s.hq + 2 * s.hkv).div_ceil(hb))?, u(t)?, 1),
        (u(s.d / 2)?, u(hb)?, 1),
        0,
        &[
            Arg::Ptr(qkv),
            Arg::Ptr(q_out),
            Arg::Ptr(k_cache),
            Arg::Ptr(v_cache),
            Arg::I32(kv.kernel_kind()),
            Arg::Ptr(inv_freq),
            Arg::Ptr(pos),
            Arg::Ptr(kv_off),
            i(s.hq)?,
            i(s.hkv)?,
            i(s.d)?,
            Arg::F32(mscale),
            Arg::Ptr(part),
            i(nz)?,
            Arg::Ptr(bias),
            i(cols)?,
            Arg::F32(eps),
            i(t)?,
        ],
    )
}

/// The most K splits whose partial sums `rope_kv_write` adds (its `ROPE_MAX_SPLIT`).
const ROPE_MAX_SPLIT: usize = 4;

/// A qkv projection whose K split's finish [`dense_gemv_qkv_deferred`] left to
/// [`rope_kv`]: its partial sums and squares (the split scratch), splits, bias, width and ε.
#[derive(Debug, Clone, Copy)]
pub struct QkvDeferred {
    /// The split scratch: `nz` × tokens × rows partial sums, then `nz` × tokens squares.
    pub part: u64,
    /// K splits.
    pub nz: usize,
    /// Bias (bf16, one a row; 0: none).
    pub bias: u64,
    /// Input width (the norm's mean).
    pub cols: usize,
    /// The norm's ε.
    pub eps: f32,
}

/// Environment switch of [`dense_gemv_qkv_deferred`]: `on` (the default) or `off` (qkv
/// finishes its K split itself, the last block of each unit adding the splits: the same bits,
/// for A/B). H200 (docs/perf.md run 409): 120b batch 9 / 12 / 16 −1.2 to −2.0 %, 20b batch
/// 16 −1.9 / −2.0 %; qkv at 16 tokens 19.0 → 14.2 µs a layer, RoPE unchanged (4.1 µs).
pub const TCG_DEFER_ENV: &str = "MXTUNE_TCG_DEFER";

fn tc_defer_on() -> Result<bool> {
    static V: std::sync::OnceLock<Result<bool, String>> = std::sync::OnceLock::new();
    env_once(&V, || {
        env_choice(TCG_DEFER_ENV, &[("on", true), ("off", false)])
    })
}

/// The qkv projection on the wide kernel with its K split's finish left to [`rope_kv`]
/// (`gemv_tc_{bf16,fp4}_t16_r64_defer`: each block writes its partial sums and squares and
/// returns; no count, no last block, whose atomics and reloads were ~5 µs of qkv's 19 at 16
/// tokens): where [`TCG_DEFER_ENV`] is on (or `force`), on tensor cores, the planner's plan
/// the wide one in one pass with 2 to 4 K splits, and the norm's input not written. Returns
/// what [`rope_kv`] needs, or None with nothing launched (the caller then runs
/// [`dense_gemv`]). `y` is not written.
#[allow(clippy::too_many_arguments)]
pub fn dense_gemv_qkv_deferred(
    g: &Gpu,
    path: DecodeGemv,
    w: DenseW,
    bias: u64,
    x: u64,
    y: u64,
    rows: usize,
    cols: usize,
    t: usize,
    norm: Norm,
    force: bool,
) -> Result<Option<QkvDeferred>> {
    let (format, entry, weights) = match w {
        DenseW::Bf16(p) => ("bf16", "gemv_tc_bf16_t16_r64_defer", vec![Arg::Ptr(p)]),
        DenseW::Mxfp4 { blocks, scales } => (
            "fp4",
            "gemv_tc_fp4_t16_r64_defer",
            vec![Arg::Ptr(blocks), Arg::Ptr(scales)],
        ),
    };
    if !(force || tc_defer_on()?)
        || !path.dense_on_tensor_cores()
        || norm.out != 0
        || !tc_gemv_fits(g, w, rows, cols, t)
    {
        return Ok(None);
    }
    let plan = tc_gemv_launch_plan(g, format, rows, cols, t, Some(norm), None)?;
    if plan.tiles_per_block != TCG_WIDE_TILES
        || !(2..=ROPE_MAX_SPLIT).contains(&plan.ksplit)
        || t > plan.per_pass
    {
        return Ok(None);
    }
    tc_gemv_launch(
        g,
        format,
        entry,
        &plan,
        weights,
        Some(bias),
        x,
        y,
        rows,
        cols,
        t,
        false,
        Some(norm),
    )?;
    Ok(Some(QkvDeferred {
        part: g.split_scratch().0,
        nz: plan.ksplit,
        bias,
        cols,
        eps: norm.eps,
    }))
}

/// Scratch of split-K attention: per (token, head, split) max, sum and partial output.
pub struct AttnScratch {
    /// Running maxima.
    pub m: u64,
    /// Running sums.
    pub l: u64,
    /// Unnormalised outputs (`d` per entry).
    pub acc: u64,
    /// Capacity in (token, head, split) entries.
    pub entries: usize,
}

/// Contexts longer than this many keys run decode attention on `attn_split_gqa` (where the
/// shape allows it); shorter ones (gpt-oss's 128-key sliding windows) on `attn_split`, which
/// has G times more blocks and a shorter chain per key. At batch 1 the per-head kernel was
/// faster up to ~600 keys (runs 28–29), but it reads each KV row once per query head and
/// launches (rows × query heads × splits) blocks: at batch 16 and 769 keys it took 4.2 ms of
/// a 26 ms step where the GQA kernel with 128-key splits took 1.15 ms (run 50; docs/perf.md).
/// The choice depends on the context length only, so a sequence's arithmetic does not change
/// with the batch it runs in.
pub const ATTN_GQA_FROM_KEYS: usize = 256;

/// The decode-attention kernel of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKernel {
    /// `attn_split`: one block per (query head, split).
    PerHead,
    /// `attn_split_gqa`: one block per (KV head, split) for all the query heads sharing it.
    Gqa,
    /// `attn_split_gqa_tc` (`attn_split_gqa_tc_fp8` for an fp8 cache): the same blocks on
    /// tensor cores (bf16 or fp8 cache, head dims 32 or 64, up to 16 query heads per KV head),
    /// each warp's next tile of K and V rows copied into shared memory (cp.async) while it
    /// works on the current one. Needs [`gqa_tc_smem`] bytes of dynamic shared memory.
    GqaTc,
}

/// Most query heads per KV head `attn_split_gqa_tc` takes (the 16 rows of its MMA tile).
const ATTN_TC_MAX_G: usize = 16;

/// Warps of an `attn_split_gqa_tc` block of the `_w8` entries (fp8 cache only; kernel constant
/// `ATC_WIDE_WARPS`).
const ATC_WIDE_WARPS: u32 = 8;

/// The compiled `attn_split_gqa_tc` entry a launch takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcVariant {
    /// The entry compiled for the head dim where it has one (64): [`AttnTuning::fixed_dim`].
    pub fixed_dim: bool,
    /// Eight warps a block in place of four (fp8 cache only; the `_w8` entries): a split's
    /// tiles shared by twice the warps, two blocks an SM.
    pub wide: bool,
}

impl TcVariant {
    /// Warps a block of this variant.
    pub fn warps(self) -> u32 {
        if self.wide {
            ATC_WIDE_WARPS
        } else {
            ATTN_GQA_WARPS
        }
    }
}

/// Dynamic shared memory of an `attn_split_gqa_tc` block of `warps` warps: per warp two buffers
/// of 32 K and 32 V rows, each row padded by 16 bytes (kernel constant `ATC_KT`); for an fp8
/// cache of 32 V rows only (its keys go to registers, its values are widened as their
/// fragments are loaded).
pub fn gqa_tc_smem(s: AttnShape, kv: KvDtype, warps: u32) -> usize {
    let row_sets = if kv == KvDtype::Fp8 { 1 } else { 2 };
    warps as usize * 2 * row_sets * 32 * (s.d * kv.size() + 16)
}

/// Whether `attn_split_gqa_tc` can run shape `s` on a cache of `kv` on this device: a bf16 or
/// fp8 cache, head dims 32 or 64, at most 16 query heads per KV head, and its stage within the
/// shared memory a block may have.
pub fn gqa_tc_fits(g: &Gpu, s: AttnShape, kv: KvDtype) -> Result<bool> {
    // Any entry may be launched for the shape (`fixed_dim`, `wide` for an fp8 cache): each
    // within its limit.
    if !(matches!(kv, KvDtype::Bf16 | KvDtype::Fp8)
        && (s.d == 32 || s.d == 64)
        && s.hq / s.hkv <= ATTN_TC_MAX_G)
    {
        return Ok(false);
    }
    for fixed_dim in [true, false] {
        for wide in [false, kv == KvDtype::Fp8] {
            let v = TcVariant { fixed_dim, wide };
            if gqa_tc_smem(s, kv, v.warps()) > g.dynamic_shared_limit(gqa_tc_entry(kv, s, v))? {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// The `attn_split_gqa_tc` entry for cache kind `kv`, shape `s` and variant `v`: with
/// `fixed_dim` and head dim 64, the entry compiled for that head dim (`_d64`: its tile loop's
/// counts and strides constants, about half the instructions a tile of the entry that takes
/// the head dim at run time; docs/perf.md session 36), and `_g8` where also at most 8 query
/// heads share a KV head (the MMA tile's padding rows left out of the softmax); else the one
/// that takes any supported head dim. All give the same bits. `wide` on an fp8 cache: the
/// eight-warp entry (`_w8`: other sums, the keys walked by other warps). [`gqa_tc_fits`] asks
/// each one's shared-memory limit.
fn gqa_tc_entry(kv: KvDtype, s: AttnShape, v: TcVariant) -> &'static str {
    let fixed = v.fixed_dim && s.d == 64;
    let g8 = fixed && s.hq / s.hkv.max(1) <= 8;
    match (kv == KvDtype::Fp8, fixed, g8, v.wide) {
        (true, true, true, true) => "attn_split_gqa_tc_fp8_d64_w8_g8",
        (true, true, false, true) => "attn_split_gqa_tc_fp8_d64_w8",
        (true, false, _, true) => "attn_split_gqa_tc_fp8_w8",
        (true, true, true, false) => "attn_split_gqa_tc_fp8_d64_g8",
        (true, true, false, false) => "attn_split_gqa_tc_fp8_d64",
        (true, false, _, false) => "attn_split_gqa_tc_fp8",
        (false, true, true, _) => "attn_split_gqa_tc_d64_g8",
        (false, true, false, _) => "attn_split_gqa_tc_d64",
        (false, false, _, _) => "attn_split_gqa_tc",
    }
}

impl AttnKernel {
    /// The kernel for rows of up to `keys` keys of shape `s`.
    pub fn for_keys(s: AttnShape, keys: usize) -> Self {
        if keys > ATTN_GQA_FROM_KEYS && s.hq / s.hkv <= ATTN_GQA_MAX {
            AttnKernel::Gqa
        } else {
            AttnKernel::PerHead
        }
    }

    /// Fewest keys per split. The GQA kernel's warps each take 32 keys (a lane per key), so
    /// a split of 128 keys keeps all four busy and writes a quarter of the partials of a
    /// 32-key split: at batch 16 and depth 768 the attention went from 3.78 ms (8-key splits)
    /// and 2.10 ms (32) to 1.15 ms (128); at batch 1 it costs 0.04 ms a step more than 8-key
    /// splits (run 50).
    pub fn min_split(self) -> usize {
        match self {
            AttnKernel::PerHead => 32,
            AttnKernel::Gqa | AttnKernel::GqaTc => ATTN_GQA_WARPS as usize * 32,
        }
    }
}

/// Environment variable that fixes the decode-attention kernel: `auto` (the default: the GQA
/// kernel on tensor cores wherever it fits, else by context length, [`AttnKernel::for_keys`]),
/// `per-head`, `gqa` (on CUDA cores) or `gqa-tc` (on tensor cores, where the shape and cache
/// allow it, else `gqa`).
pub const ATTN_KERNEL_ENV: &str = "MXTUNE_ATTN";

/// The words [`ATTN_KERNEL_ENV`] takes and the kernel each forces.
const ATTN_KERNEL_CHOICES: &[(&str, Option<AttnKernel>)] = &[
    ("auto", None),
    ("per-head", Some(AttnKernel::PerHead)),
    ("gqa", Some(AttnKernel::Gqa)),
    ("gqa-tc", Some(AttnKernel::GqaTc)),
];

/// Environment variable that sets the fewest keys per split of the GQA attention kernel
/// (default [`AttnKernel::min_split`] of `Gqa`).
pub const ATTN_GQA_MIN_SPLIT_ENV: &str = "MXTUNE_ATTN_GQA_MIN_SPLIT";

/// Fewest keys a split of an fp8 cache's tensor-core launch has for the eight-warp entry by
/// default ([`AttnTuning::tc_variant`], which also asks that a launch of the engine's most
/// rows stay within the split cap's blocks). On the H200 (docs/perf.md runs 326, 329-330) it
/// took batch 1 at depth 32768 2.275 -> 2.251 ms (a full layer's split kernel 15.24 -> 13.96
/// us: one row's 264 blocks of four warps fill half an SM's warp slots); but where more rows
/// share a launch every batch from 2 lost (+0.9 % at depth 32768 batch 2 and 4, +2.1 / +2.6 %
/// at depth 16384 batch 4 / 8: their grids fill the SMs with four-warp blocks already), and
/// the entry cannot follow the rows of a step without a row's sums changing with the rows
/// beside it (other warps walk its keys). From two tiles a warp: 256 lost at depth 4096.
pub const ATTN_WIDE_FROM: usize = 2 * ATC_WIDE_WARPS as usize * 32;

/// Environment variable that sets [`AttnTuning::wide_from`] (0: never).
pub const ATTN_WIDE_FROM_ENV: &str = "MXTUNE_ATTN_WIDE_FROM";

/// Blocks per SM a decode row's attention splits may fill by default ([`AttnTuning::split_cap`]):
/// on the H200 at depth 32768 the tensor-core GQA kernel's 64 splits a KV head (512 blocks of
/// 74 KB, 1.3 waves of 3 an SM) took 2.720 ms a 120b step, 32 (two blocks an SM) 2.552
/// (docs/perf.md, run 247).
pub const ATTN_SPLIT_BLOCKS_PER_SM: usize = 2;

/// Environment variable that sets [`AttnTuning::split_blocks_per_sm`] (0: no bound, the
/// splits by context length alone).
pub const ATTN_SPLIT_BLOCKS_ENV: &str = "MXTUNE_ATTN_SPLIT_BLOCKS";

/// Environment variable that turns off the split kernels' own finish of a single split
/// (`off`: every launch ends in `attn_combine`, as before; default `on`, [`attention`]).
pub const ATTN_FINISH_ENV: &str = "MXTUNE_ATTN_FINISH";

/// Environment variable that turns off the tensor-core GQA kernel's entries compiled for one
/// head dim (`off`: the entry taking the head dim at run time, as before session 36; default
/// `on`, [`AttnTuning::fixed_dim`]).
pub const ATTN_FIXED_DIM_ENV: &str = "MXTUNE_ATTN_FIXED_DIM";

/// The decode step's choice of attention kernel and split size: the defaults, or what
/// [`ATTN_KERNEL_ENV`] and [`ATTN_GQA_MIN_SPLIT_ENV`] set (tuning switches for `engine
/// profile`; the split boundaries depend on the context length only, never on the batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnTuning {
    /// A kernel for every context, or None to choose by context length.
    pub force: Option<AttnKernel>,
    /// Fewest keys per split of the GQA kernel.
    pub gqa_min_split: usize,
    /// A launch of one split finishes its heads in the split kernel, no `attn_combine`.
    pub finish_single: bool,
    /// Blocks per SM one row's splits may fill (its heads times its splits), 0 for no bound
    /// ([`ATTN_SPLIT_BLOCKS_ENV`]).
    pub split_blocks_per_sm: usize,
    /// The tensor-core GQA kernel's entry compiled for the head dim where there is one (64)
    /// ([`ATTN_FIXED_DIM_ENV`]).
    pub fixed_dim: bool,
    /// Fewest keys a split of an fp8 cache's tensor-core launch has for the eight-warp entry
    /// ([`TcVariant::wide`]; 0: never; [`ATTN_WIDE_FROM_ENV`]).
    pub wide_from: usize,
}

impl Default for AttnTuning {
    fn default() -> Self {
        Self {
            force: None,
            gqa_min_split: AttnKernel::Gqa.min_split(),
            finish_single: true,
            split_blocks_per_sm: ATTN_SPLIT_BLOCKS_PER_SM,
            fixed_dim: true,
            wide_from: ATTN_WIDE_FROM,
        }
    }
}

impl AttnTuning {
    /// The defaults with the environment's overrides; a bad value is an error naming it.
    pub fn from_env() -> Result<Self> {
        let mut t = Self {
            force: env_choice(ATTN_KERNEL_ENV, ATTN_KERNEL_CHOICES)?,
            finish_single: env_choice(ATTN_FINISH_ENV, &[("on", true), ("off", false)])?,
            fixed_dim: env_choice(ATTN_FIXED_DIM_ENV, &[("on", true), ("off", false)])?,
            ..Self::default()
        };
        if let Some(n) = env_whole(
            ATTN_SPLIT_BLOCKS_ENV,
            0..=64,
            "blocks per SM from 0 (no bound) to 64",
        )? {
            t.split_blocks_per_sm = n;
        }
        if let Some(n) = env_whole(ATTN_GQA_MIN_SPLIT_ENV, 1..=65536, "keys from 1 to 65536")? {
            t.gqa_min_split = n;
        }
        if let Some(n) = env_whole(
            ATTN_WIDE_FROM_ENV,
            0..=1 << 20,
            "keys a split from 0 (never) to 1048576",
        )? {
            t.wide_from = n;
        }
        Ok(t)
    }

    /// The tensor-core entry of a launch of shape `s` on a cache of `kv` whose longest row has
    /// `keys` keys in `nsplit` splits, on `sms` SMs, for an engine of at most `max_rows` rows a
    /// step: the eight-warp one for an fp8 cache's splits of at least [`Self::wide_from`] keys
    /// where a launch of `max_rows` rows holds no more blocks than the split cap's
    /// ([`Self::split_blocks_per_sm`] an SM; with it 0, never): there four-warp blocks would
    /// leave half an SM's warp slots idle. A function of the context and the engine's
    /// capacity, never of the rows a step holds, so a row's sums do not change with its
    /// batch-mates.
    pub fn tc_variant(
        &self,
        kv: KvDtype,
        s: AttnShape,
        sms: usize,
        keys: usize,
        nsplit: usize,
        max_rows: usize,
    ) -> TcVariant {
        let nsplit = nsplit.max(1);
        TcVariant {
            fixed_dim: self.fixed_dim,
            wide: kv == KvDtype::Fp8
                && self.wide_from > 0
                && keys.div_ceil(nsplit) >= self.wide_from
                && max_rows * s.hkv * nsplit <= self.split_blocks_per_sm * sms,
        }
    }

    /// The kernel for rows of up to `keys` keys of shape `s` on a cache of `kv` (a forced GQA
    /// kernel only where the shape allows it; the tensor-core one only where it fits, else
    /// the plain GQA kernel).
    pub fn kernel(&self, g: &Gpu, s: AttnShape, kv: KvDtype, keys: usize) -> Result<AttnKernel> {
        Ok(match self.force {
            Some(AttnKernel::GqaTc) if gqa_tc_fits(g, s, kv)? => AttnKernel::GqaTc,
            Some(AttnKernel::Gqa | AttnKernel::GqaTc) if s.hq / s.hkv <= ATTN_GQA_MAX => {
                AttnKernel::Gqa
            }
            Some(_) => AttnKernel::PerHead,
            // The GQA kernel on tensor cores for every layer wherever it takes the shape and
            // cache, short windows included (docs/perf.md session 16: against the CUDA-core
            // GQA kernel, 120b batch 1 at depth 32768 239.6 -> 284.0 tok/s; against the
            // per-head kernel on the short layers, batch 1 at depth 0 338.2 -> 352.4).
            None if gqa_tc_fits(g, s, kv)? => AttnKernel::GqaTc,
            None => AttnKernel::for_keys(s, keys),
        })
    }

    /// Most splits a row of shape `s` takes with `kernel` on `sms` SMs: for the tensor-core
    /// GQA kernel (the one measured: 74 KB blocks, 3 an SM) its blocks, one per KV head and
    /// split, at most [`Self::split_blocks_per_sm`] an SM; None (no bound) for the others (small
    /// blocks, many an SM) or with the knob at 0. The bound depends on the device and the model
    /// only, never on the batch, so a row's split boundaries (and its sums) do not change with
    /// the rows beside it.
    pub fn split_cap(&self, kernel: AttnKernel, s: AttnShape, sms: usize) -> Option<usize> {
        (self.split_blocks_per_sm > 0 && kernel == AttnKernel::GqaTc)
            .then(|| (self.split_blocks_per_sm * sms / s.hkv.max(1)).max(1))
    }

    /// Splits of a decode launch whose longest row has `keys` keys, on a scratch of
    /// `max_splits`. With a bound on the blocks ([`Self::split_cap`]): one split per
    /// `4 √keys` keys (at least [`Self::min_split`]; 8 at 1024 keys, 16 at 4096, 45 at 32768)
    /// up to the cap; without one, one per `min_split` keys (the rule before run 249: 32
    /// splits at 4096 keys, 64 from 8192). Like the cap, a function of the context and the
    /// device only.
    pub fn splits(
        &self,
        kernel: AttnKernel,
        s: AttnShape,
        sms: usize,
        keys: usize,
        max_splits: usize,
    ) -> usize {
        let by_len = keys.div_ceil(self.min_split(kernel).max(1));
        let n = match self.split_cap(kernel, s, sms) {
            None => by_len,
            Some(cap) => by_len.min(((keys as f64).sqrt() / 4.0) as usize).min(cap),
        };
        n.clamp(1, max_splits.max(1))
    }

    /// Fewest keys per split of `kernel`.
    pub fn min_split(&self, kernel: AttnKernel) -> usize {
        match kernel {
            AttnKernel::PerHead => AttnKernel::PerHead.min_split(),
            AttnKernel::Gqa | AttnKernel::GqaTc => self.gqa_min_split,
        }
    }
}

/// Decode attention for `t` query tokens over a cache of element type `kv`: each row's keys
/// are shared evenly among `nsplit` splits (blocks), at least `min_split` keys each, so any
/// `nsplit ≥ 1` covers any context and a short one still spreads over several blocks; `kernel`
/// picks the per-head or the GQA split kernel (same partials). `sinks = None` turns the sink
/// off. One split with `finish` set: the split kernel writes `out` itself (the sink counted
/// as `attn_combine` counts it, the same bits) and no combine is launched — a kernel fewer
/// and its launch gap (docs/perf.md, session 25). `tc`: the tensor-core kernel's entry
/// ([`AttnTuning::tc_variant`]).
pub fn attention(
    g: &Gpu,
    s: AttnShape,
    q: u64,
    k_cache: u64,
    v_cache: u64,
    kv: KvDtype,
    pos: u64,
    kv_off: u64,
    sinks: Option<u64>,
    out: u64,
    scratch: &AttnScratch,
    t: usize,
    window: usize,
    kernel: AttnKernel,
    nsplit: usize,
    min_split: usize,
    scale: f32,
    finish: bool,
    tc: TcVariant,
) -> Result<()> {
    s.check()?;
    let finish = finish && nsplit == 1;
    ensure!(
        (1..=ATTN_MAX_SPLITS).contains(&nsplit),
        "{nsplit} attention splits: the combine takes 1 to {ATTN_MAX_SPLITS}"
    );
    ensure!(
        t * s.hq * nsplit <= scratch.entries,
        "attention scratch holds {} entries, {} needed",
        scratch.entries,
        t * s.hq * nsplit
    );
    // The GQA kernels read each key once for the query heads sharing it.
    let (name, heads, warps, smem) = match kernel {
        AttnKernel::Gqa => {
            ensure!(
                s.hq / s.hkv <= ATTN_GQA_MAX,
                "attn_split_gqa takes at most {ATTN_GQA_MAX} query heads per KV head, not {}",
                s.hq / s.hkv
            );
            ("attn_split_gqa", s.hkv, ATTN_GQA_WARPS, 0)
        }
        AttnKernel::GqaTc => {
            ensure!(
                !tc.wide || kv == KvDtype::Fp8,
                "the eight-warp attn_split_gqa_tc entries take an fp8 cache, not {}",
                kv.name()
            );
            ensure!(
                gqa_tc_fits(g, s, kv)?,
                "attn_split_gqa_tc takes a bf16 or fp8 cache, head dims 32 or 64 and at most \
                 {ATTN_TC_MAX_G} query heads per KV head within the device's shared memory \
                 (here: {} cache, head dim {}, {} heads per KV head): use MXTUNE_ATTN=gqa",
                kv.name(),
                s.d,
                s.hq / s.hkv
            );
            (
                gqa_tc_entry(kv, s, tc),
                s.hkv,
                tc.warps(),
                gqa_tc_smem(s, kv, tc.warps()),
            )
        }
        AttnKernel::PerHead => ("attn_split", s.hq, ATTN_WARPS, 0),
    };
    g.launch(
        name,
        (u(heads)?, u(nsplit)?, u(t)?),
        (warps * 32, 1, 1),
        u(smem)?,
        &[
            Arg::Ptr(q),
            Arg::Ptr(k_cache),
            Arg::Ptr(v_cache),
            Arg::I32(kv.kernel_kind()),
            Arg::Ptr(pos),
            Arg::Ptr(kv_off),
            Arg::Ptr(scratch.m),
            Arg::Ptr(scratch.l),
            Arg::Ptr(scratch.acc),
            i(s.hq)?,
            i(s.hkv)?,
            i(s.d)?,
            i(window)?,
            i(min_split.max(1))?,
            Arg::F32(scale),
            opt(sinks.filter(|_| finish)),
            Arg::Ptr(if finish { out } else { 0 }),
        ],
    )?;
    if finish {
        return Ok(());
    }
    g.launch(
        "attn_combine",
        (u(s.hq)?, u(t)?, 1),
        (ATTN_COMBINE_THREADS, 1, 1),
        0,
        &[
            Arg::Ptr(scratch.m),
            Arg::Ptr(scratch.l),
            Arg::Ptr(scratch.acc),
            opt(sinks),
            Arg::Ptr(out),
            i(s.hq)?,
            i(s.d)?,
            i(nsplit)?,
        ],
    )
}

/// Attention for `t` prefill rows (one query token each, its own position and KV slot): one
/// block per (KV head, row) with a warp per query head of the group, keys staged in shared
/// memory once for the whole group (widened to fp32 from the cache's element type `kv`).
/// `sinks = None` turns the sink off.
pub fn attention_rows(
    g: &Gpu,
    s: AttnShape,
    q: u64,
    k_cache: u64,
    v_cache: u64,
    kv: KvDtype,
    pos: u64,
    kv_off: u64,
    sinks: Option<u64>,
    out: u64,
    t: usize,
    window: usize,
    scale: f32,
) -> Result<()> {
    s.check()?;
    let group = s.hq / s.hkv;
    ensure!(
        group <= 32,
        "{} query heads per KV head: the prefill attention takes at most 32",
        group
    );
    let tile = prefill_attn_tile()?;
    let smem = (tile * (s.d + 1) + tile * s.d + group * s.d) * 4;
    g.launch(
        "attn_prefill",
        (u(s.hkv)?, u(t)?, 1),
        (u(group * 32)?, 1, 1),
        u(smem)?,
        &[
            Arg::Ptr(q),
            Arg::Ptr(k_cache),
            Arg::Ptr(v_cache),
            Arg::I32(kv.kernel_kind()),
            Arg::Ptr(pos),
            Arg::Ptr(kv_off),
            opt(sinks),
            Arg::Ptr(out),
            i(s.hq)?,
            i(s.hkv)?,
            i(s.d)?,
            i(window)?,
            Arg::F32(scale),
            i(tile)?,
        ],
    )
}

/// Rows of one `attn_prefill_tc` tile (the mma's m dimension), query heads per KV head it takes
/// (its warps), head dims it takes, and keys it stages at a time (kernel constants `PFT_*`).
pub const PFT_ROWS: usize = 16;
const PFT_MAX_G: usize = 8;
const PFT_MAX_D: usize = 128;
const PFT_KT: usize = 64;
const PFT_PAD: usize = 8;

/// Environment switch of the prefill attention: `tc` (the default where the shape and cache
/// allow it: [`attention_rows_tc`]) or `simt` (always [`attention_rows`]), for A/B timing.
pub const PF_ATTN_ENV: &str = "MXTUNE_ATTN_PREFILL";

/// Whether the prefill attention runs on tensor cores ([`attention_rows_tc`]) for this shape
/// and cache: a bf16 cache (fp32 is the exact diagnostic path, fp8 keeps the CUDA-core
/// kernel), at most 8 query heads per KV head, head dims a multiple of 16 up to 128, and not
/// turned off by [`PF_ATTN_ENV`].
pub fn prefill_attn_tc(s: AttnShape, kv: KvDtype) -> Result<bool> {
    let on = match std::env::var(PF_ATTN_ENV).as_deref() {
        Err(_) | Ok("") | Ok("tc") => true,
        Ok("simt") => false,
        Ok(v) => anyhow::bail!("{PF_ATTN_ENV}={v}: expected tc or simt"),
    };
    Ok(on
        && kv == KvDtype::Bf16
        && s.hkv > 0
        && s.hq.is_multiple_of(s.hkv)
        && s.hq / s.hkv <= PFT_MAX_G
        && s.d.is_multiple_of(16)
        && s.d <= PFT_MAX_D)
}

/// The tiles of [`attention_rows_tc`] for prefill rows at positions `pos` and KV offsets
/// `offs`: runs of up to 16 consecutive rows of one sequence (same offset, consecutive
/// positions), as (first row, rows) pairs flattened.
pub fn prefill_attn_tiles(pos: &[u32], offs: &[u64]) -> Vec<u32> {
    let mut tiles = Vec::new();
    let mut start = 0usize;
    for i in 1..=pos.len() {
        let split = i == pos.len()
            || i - start == PFT_ROWS
            || offs[i] != offs[start]
            || pos[i] != pos[i - 1].wrapping_add(1);
        if split {
            tiles.extend([start as u32, (i - start) as u32]);
            start = i;
        }
    }
    tiles
}

/// Floats of partial results one split of [`attention_rows_tc`] writes for `n` rows: each row
/// and query head's output, running max and sum.
pub fn attn_split_floats(s: AttnShape, n: usize) -> usize {
    n * s.hq * (s.d + 2)
}

/// [`attention_rows_tc`]'s ways to split the keys of `n` rows in `ntiles` tiles whose rows
/// see up to `keys` keys each, with `split`'s scratch ([`split_count`]); 1 without one.
pub fn attn_splits(
    s: AttnShape,
    sms: usize,
    n: usize,
    ntiles: usize,
    keys: usize,
    split: Option<SplitScratch>,
) -> usize {
    split.map_or(1, |sp| {
        split_count(
            s.hkv * ntiles,
            keys.div_ceil(PFT_KT),
            sms,
            attn_split_floats(s, n),
            sp.floats,
        )
    })
}

/// [`attention_rows`] on tensor cores (`attn_prefill_tc`): `tiles` (device, `ntiles` pairs
/// from [`prefill_attn_tiles`]) cut the `n` rows into runs of one sequence; bf16 queries,
/// keys, probabilities and values, fp32 accumulation. Only for shapes [`prefill_attn_tc`]
/// accepts. `splits` > 1 ([`attn_splits`]) cuts each tile's keys into that many shares,
/// their partial results in `split`'s scratch, merged by `attn_split_combine`.
pub fn attention_rows_tc(
    g: &Gpu,
    s: AttnShape,
    q: u64,
    k_cache: u64,
    v_cache: u64,
    pos: u64,
    kv_off: u64,
    sinks: Option<u64>,
    out: u64,
    (tiles, ntiles, n): (u64, usize, usize),
    window: usize,
    scale: f32,
    (split, splits): (Option<SplitScratch>, usize),
) -> Result<()> {
    s.check()?;
    ensure!(
        s.hq.is_multiple_of(s.hkv) && s.hq / s.hkv <= PFT_MAX_G,
        "{} query heads per KV head: the tensor-core prefill attention takes at most {PFT_MAX_G}",
        s.hq / s.hkv
    );
    ensure!(
        s.d.is_multiple_of(16) && s.d <= PFT_MAX_D,
        "head dim {}: the tensor-core prefill attention takes multiples of 16 up to {PFT_MAX_D}",
        s.d
    );
    let smem = (PFT_KT * (s.d + PFT_PAD) + s.d * (PFT_KT + PFT_PAD)) * 2;
    // Head dims up to 64 (gpt-oss) take the entry point compiled for them: half the
    // registers, two blocks per SM.
    let kernel = if s.d <= 64 {
        "attn_prefill_tc_d64"
    } else {
        "attn_prefill_tc"
    };
    let part = match split {
        Some(sp) if splits > 1 => {
            ensure!(
                splits * attn_split_floats(s, n) <= sp.floats,
                "{splits} attention splits of {n} rows exceed the split scratch ({} floats)",
                sp.floats
            );
            sp.ptr
        }
        _ => {
            ensure!(
                splits == 1,
                "{splits} attention splits without a split scratch"
            );
            0
        }
    };
    g.launch(
        kernel,
        (u(s.hkv)?, u(ntiles)?, u(splits)?),
        (u(s.hq / s.hkv * 32)?, 1, 1),
        u(smem)?,
        &[
            Arg::Ptr(q),
            Arg::Ptr(k_cache),
            Arg::Ptr(v_cache),
            Arg::Ptr(pos),
            Arg::Ptr(kv_off),
            opt(sinks),
            Arg::Ptr(out),
            Arg::Ptr(tiles),
            i(s.hq)?,
            i(s.hkv)?,
            i(s.d)?,
            i(window)?,
            Arg::F32(scale),
            Arg::Ptr(part),
            i(n)?,
        ],
    )?;
    if splits == 1 {
        return Ok(());
    }
    g.launch(
        "attn_split_combine",
        (u((n * s.hq * s.d).div_ceil(256))?, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::Ptr(part),
            Arg::Ptr(out),
            i(n)?,
            i(s.hq)?,
            i(s.d)?,
            i(splits)?,
        ],
    )
}

/// Keys per shared-memory tile of the prefill attention: 32 × keys per lane (1 to the
/// kernel's `PF_MAX_KPL`, 4).
pub const PF_TILE_DEFAULT: usize = 32;

/// Environment variable that sets the prefill attention's keys per tile: 32, 64, 96 or 128.
pub const PF_TILE_ENV: &str = "MXTUNE_ATTN_PREFILL_TILE";

/// The prefill attention's keys per tile: [`PF_TILE_ENV`] or [`PF_TILE_DEFAULT`].
pub fn prefill_attn_tile() -> Result<usize> {
    match std::env::var(PF_TILE_ENV).as_deref() {
        Err(_) | Ok("") => Ok(PF_TILE_DEFAULT),
        Ok(v) => match v.parse::<usize>() {
            Ok(n @ (32 | 64 | 96 | 128)) => Ok(n),
            _ => anyhow::bail!("{PF_TILE_ENV}={v}: expected 32, 64, 96 or 128 keys"),
        },
    }
}

/// MXFP4 expert weights of one layer, on the device in checkpoint layout.
#[derive(Debug, Clone, Copy)]
pub struct MoeWeights {
    /// gate_up blocks [E, 2I, H/32, 16].
    pub gu_blocks: u64,
    /// gate_up scales [E, 2I, H/32].
    pub gu_scales: u64,
    /// gate_up bias bf16 [E, 2I].
    pub gu_bias: u64,
    /// down blocks [E, H, I/32, 16].
    pub dn_blocks: u64,
    /// down scales [E, H, I/32].
    pub dn_scales: u64,
    /// down bias bf16 [E, H].
    pub dn_bias: u64,
    /// How the blocks' 32-bit words are laid out (both matrices).
    pub layout: ExpertLayout,
}

/// The layout of the experts' MXFP4 blocks on the device.
/// * `Standard`: as in the checkpoint (element i of a 32-bit word in bits 4i..4i+3).
/// * `F16`: each 32-bit word rearranged once at load ([`F16_WORDS`]) so that the
///   decode MoE's fp16 dot decodes it into its four fp16 pairs (the values times 2^-14) in 8
///   integer operations instead of 13 (`fp4l_to_f16x2` in common.cuh; docs/engine.md). The
///   layout of the model whenever its decode MoE runs the fp16 dot ([`MoeCodes::F16`]): those
///   kernels read only this layout, every other decode MoE kernel only `Standard`; the
///   prefill's grouped MoE reads both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertLayout {
    Standard,
    F16,
}

impl ExpertLayout {
    /// The layout the decode MoE kernels of `codes` read.
    pub fn for_codes(codes: MoeCodes) -> Self {
        if codes == MoeCodes::F16 {
            Self::F16
        } else {
            Self::Standard
        }
    }

    /// An error unless the weights are in the layout `kernels` read.
    fn expect(self, want: Self, kernels: &str) -> Result<()> {
        ensure!(
            self == want,
            "{kernels} read the experts in the {want:?} layout, but these weights are in the \
             {self:?} layout (the model picks the layout from its decode MoE at load)"
        );
        Ok(())
    }
}

/// A layout of MXFP4 blocks' 32-bit words on the device in which a word decodes to its four
/// 16-bit pairs (element 2j in the low half of pair j, 2j + 1 in the high one) in 8 integer
/// operations: E2M1's bits s e1 e0 m sit at `sign_bit` and the three bits from `low_bit` up
/// of each half ([`WordLayout::mask`]), so each pair is exact (the value times a power of two, e = 0
/// landing on the format's subnormals, as it is E2M1's own). Pair 0 is the stored word under
/// the mask, pairs 1-3 the XOR of two of its rotations ([`WordLayout::decode`], the kernels'
/// `fp4l_to_f16x2` and `fp4b_to_bf16x2`); the load-time transform ([`word_layout`], the kernel
/// `mxfp4_word_layout`) is the inverse of that map over GF(2), built by
/// [`WordLayout::masks`] from the same definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WordLayout {
    /// Name in errors and checks.
    pub name: &'static str,
    /// Bit of each half holding the sign.
    pub sign_bit: u32,
    /// Lowest bit of each half holding e1 e0 m.
    pub low_bit: u32,
    /// Rotations whose XOR (with the mask) gives pairs 1-3.
    pub rotations: [(u32, u32); 3],
}

/// The experts' fp16 layout ([`ExpertLayout::F16`]): fp16 pairs of the values times 2^-14.
pub const F16_WORDS: WordLayout = WordLayout {
    name: "fp16",
    sign_bit: 15,
    low_bit: 9,
    rotations: [(4, 7), (4, 11), (4, 14)],
};

/// The dense MXFP4 matrices' bf16 layout ([`DenseW::Mxfp4`]): bf16 pairs of the values times
/// 2^-126, which the kernels multiply by a block's scale 2^(s - 127) as the bf16 2^(s - 1), so
/// scales up to [`DENSE_MAX_SCALE`].
pub const BF16_WORDS: WordLayout = WordLayout {
    name: "bf16",
    sign_bit: 15,
    low_bit: 6,
    rotations: [(2, 6), (2, 8), (2, 12)],
};

/// The largest scale byte a dense MXFP4 matrix may hold (2^1: weights up to 12 in magnitude):
/// bf16 holds the multiplier 2^(s - 1) of [`BF16_WORDS`] up to 2^127.
pub const DENSE_MAX_SCALE: u8 = 128;

impl WordLayout {
    /// Bits of a pair that hold an element (kernel constants `F16L_MASK`, `BF16L_MASK`).
    pub fn mask(&self) -> u32 {
        let half = (1u32 << self.sign_bit) | (7u32 << self.low_bit);
        half | half << 16
    }

    /// The four pairs a stored word decodes to (the kernels' decode).
    pub fn decode(&self, w: u32) -> [u32; 4] {
        let mask = self.mask();
        let mut p = [w & mask; 4];
        for (j, &(a, b)) in self.rotations.iter().enumerate() {
            p[j + 1] = (w.rotate_left(a) ^ w.rotate_left(b)) & mask;
        }
        p
    }

    /// The pairs of a standard-layout word: element 2j in the low half of pair j, 2j + 1 in
    /// the high half, each E2M1 s e1 e0 m at `sign_bit` and `low_bit + 2 … low_bit`.
    pub fn pairs_of_standard(&self, w: u32) -> [u32; 4] {
        let half = |nib: u32| ((nib >> 3) << self.sign_bit) | ((nib & 7) << self.low_bit);
        std::array::from_fn(|j| {
            let lo = (w >> (8 * j)) & 15;
            let hi = (w >> (8 * j + 4)) & 15;
            half(lo) | (half(hi) << 16)
        })
    }

    /// The transform to this layout as 32 masks over a standard word: stored bit k is the
    /// parity of `masks[k] & w` (the kernel `mxfp4_word_layout`). It inverts, over GF(2), the
    /// map from stored bits to the pairs' element bits that [`Self::decode`] computes, read off
    /// that function itself; an error if the map were singular.
    pub fn masks(&self) -> Result<[u32; 32]> {
        let name = self.name;
        // Row r (one per element bit: pair j, half, bit of the mask) of the decode's matrix,
        // as stored bits (decode of each unit word), and the standard bit it must equal.
        let mask = self.mask();
        let mask_bits: Vec<u32> = (0..32).filter(|b| mask >> b & 1 == 1).collect();
        let units: [[u32; 4]; 32] = std::array::from_fn(|k| self.decode(1u32 << k));
        let std_of = |j: usize, b: u32| -> u32 {
            // The standard bit whose value pairs_of_standard puts at bit b of pair j.
            (0..32u32)
                .find(|&i| self.pairs_of_standard(1u32 << i)[j] >> b & 1 == 1)
                .unwrap_or(u32::MAX)
        };
        // Augmented rows [a | e]: a = stored bits feeding the element bit, e = its standard
        // bit.
        let mut rows: Vec<(u32, u32)> = Vec::with_capacity(32);
        for j in 0..4 {
            for &b in &mask_bits {
                let a = units
                    .iter()
                    .enumerate()
                    .fold(0u32, |acc, (k, u)| acc | ((u[j] >> b & 1) << k));
                let si = std_of(j, b);
                ensure!(
                    si < 32,
                    "{name} layout: no standard bit lands on pair {j} bit {b}"
                );
                rows.push((a, 1u32 << si));
            }
        }
        // Gauss-Jordan over GF(2): a · stored = e for every row, solved for stored bit k.
        for k in 0..32usize {
            let piv = (k..32)
                .find(|&r| rows[r].0 >> k & 1 == 1)
                .ok_or_else(|| anyhow::anyhow!("{name} layout: the decode's map is singular"))?;
            rows.swap(k, piv);
            let (pa, pe) = rows[k];
            for (r, row) in rows.iter_mut().enumerate() {
                if r != k && row.0 >> k & 1 == 1 {
                    row.0 ^= pa;
                    row.1 ^= pe;
                }
            }
        }
        Ok(std::array::from_fn(|k| rows[k].1))
    }
}

/// A standard-layout word in the layout of `masks` ([`WordLayout::masks`]; what
/// `mxfp4_word_layout` does on the device).
pub fn word_layout_encode(masks: &[u32; 32], w: u32) -> u32 {
    (0..32).fold(0u32, |o, k| o | (((masks[k] & w).count_ones() & 1) << k))
}

/// Rearrange MXFP4 blocks into `layout`, in place on the device: each region is (device
/// address, bytes), the bytes a multiple of 4. The masks are built and uploaded once for all
/// the regions.
pub fn word_layout(g: &Gpu, layout: &WordLayout, regions: &[(u64, usize)]) -> Result<()> {
    for &(_, bytes) in regions {
        ensure!(
            bytes.is_multiple_of(4),
            "MXFP4 blocks of {bytes} bytes: not whole 32-bit words"
        );
    }
    let masks = g.upload(&layout.masks()?)?;
    for &(blocks, bytes) in regions.iter().filter(|r| r.1 > 0) {
        let words = bytes / 4;
        let blocks_n = words.div_ceil(256).min(g.sms() * 8).max(1);
        g.launch(
            "mxfp4_word_layout",
            (u(blocks_n)?, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::Ptr(blocks),
                Arg::U64(words as u64),
                Arg::Ptr(g.ptr(&masks)),
            ],
        )?;
    }
    // `masks` is freed when this returns: wait for the kernels first.
    g.sync()
}

/// Sizes and SwiGLU constants of the MoE.
#[derive(Debug, Clone, Copy)]
pub struct MoeShape {
    /// Hidden size H.
    pub hidden: usize,
    /// Expert intermediate size I.
    pub inter: usize,
    /// Experts per token.
    pub k: usize,
    /// SwiGLU clamp limit.
    pub limit: f32,
    /// SwiGLU sigmoid α.
    pub alpha: f32,
}

/// Floats per staged group of 32 fp32 activations in the decode MoE and `gemv_mxfp4`
/// (kernel constant `STAGE_PAD`).
const STAGE_PAD: usize = 36;
/// Bytes per staged group of 32 8-bit activations (kernel constant `ACT8_PAD`); each group
/// also has a 4-byte scale.
const ACT8_PAD: usize = 48;

/// Bytes per staged group of 32 fp16 codes in the decode MoE's fp16 dot (kernel constant
/// `F16_PAD`); each group also has a 4-byte scale.
const F16_PAD: usize = 80;

/// How the SIMT decode MoE kernels (`moe_gemv.cu`) code the activations they stage, which is
/// also how they multiply: the activation format (`--activation`) and, for bf16, the dot
/// ([`MoeDot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeCodes {
    /// fp32 copies, the weights widened to fp32 (`ActF32`): the exact path.
    F32,
    /// fp16 of x / D per group of 32, D a power of two, dotted in fp16 pairs (`ActF16`).
    F16,
    /// int8 per group of 32, dp4a (`--activation q8`).
    Q8,
    /// E4M3 per group of 32 (`--activation fp8`).
    Fp8,
}

impl MoeCodes {
    /// The codes of activation format `fmt` with the bf16 format's dot `dot`.
    pub fn of(fmt: ActFormat, dot: MoeDot) -> Self {
        match (fmt, dot) {
            (ActFormat::Bf16, MoeDot::F32) => Self::F32,
            (ActFormat::Bf16, MoeDot::F16) => Self::F16,
            (ActFormat::Q8, _) => Self::Q8,
            (ActFormat::Fp8, _) => Self::Fp8,
        }
    }
}

impl From<ActFormat> for MoeCodes {
    /// The format's codes with the exact fp32 dot for bf16.
    fn from(fmt: ActFormat) -> Self {
        Self::of(fmt, MoeDot::F32)
    }
}

/// Environment variable choosing the bf16 decode MoE's dot ([`MoeDot`]) for A/B runs.
pub const MOE_DOT_ENV: &str = "MXTUNE_MOE_DOT";

/// The dot of the SIMT decode MoE with bf16 activations.
/// * `F16` (the default): the activations as fp16 codes of x / D per group of 32 (D a power
///   of two at or above the group's largest magnitude), the weights decoded to fp16 pairs and
///   multiplied two at a time, 16 products summed in fp16 and each 32-block's sum in fp32:
///   11 significant bits per activation where bf16 keeps 8, and about half the instructions
///   per weight of `F32` (docs/perf.md, session 14).
/// * `F32`: fp32 activations and weights widened to fp32, every sum in fp32; the exact path,
///   which the SIMT dense GEMV configuration (`MXTUNE_GEMV=simt`) always runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeDot {
    F32,
    F16,
}

impl MoeDot {
    /// From [`MOE_DOT_ENV`] (unset: `F16`); a bad value is an error naming it.
    pub fn from_env() -> Result<Self> {
        env_choice(MOE_DOT_ENV, &[("f16", Self::F16), ("f32", Self::F32)])
    }
}

/// Which decode MoE kernel (gate_up + SwiGLU, or down) runs for activation codes `codes` and
/// loop (`slots`: the `_slots` kernels), and its dynamic shared memory for `n` staged
/// activations. The fp16 dot's `_slots` kernels come in two entries, one per unit loop: `_full`
/// for rows of exactly [`MOE_SLOTS_NI`] items of 32 blocks (gpt-oss's 2880), the plain one for
/// any other width (a loop a kernel holds but jumps over costs its launches time:
/// docs/perf.md run 366).
fn moe_gemv_kernel(down: bool, codes: MoeCodes, n: usize, slots: bool) -> (&'static str, usize) {
    let full = slots && (n / 32).div_ceil(32) == MOE_SLOTS_NI;
    let name = match (down, codes, slots) {
        (false, MoeCodes::F16, true) if full => "moe_gate_up_swiglu_h2_slots_full",
        (true, MoeCodes::F16, true) if full => "moe_down_h2_slots_full",
        (false, MoeCodes::F32, false) => "moe_gate_up_swiglu",
        (false, MoeCodes::F16, false) => "moe_gate_up_swiglu_h2",
        (false, MoeCodes::Q8, false) => "moe_gate_up_swiglu_q8",
        (false, MoeCodes::Fp8, false) => "moe_gate_up_swiglu_fp8",
        (true, MoeCodes::F32, false) => "moe_down",
        (true, MoeCodes::F16, false) => "moe_down_h2",
        (true, MoeCodes::Q8, false) => "moe_down_q8",
        (true, MoeCodes::Fp8, false) => "moe_down_fp8",
        (false, MoeCodes::F32, true) => "moe_gate_up_swiglu_slots",
        (false, MoeCodes::F16, true) => "moe_gate_up_swiglu_h2_slots",
        (false, MoeCodes::Q8, true) => "moe_gate_up_swiglu_q8_slots",
        (false, MoeCodes::Fp8, true) => "moe_gate_up_swiglu_fp8_slots",
        (true, MoeCodes::F32, true) => "moe_down_slots",
        (true, MoeCodes::F16, true) => "moe_down_h2_slots",
        (true, MoeCodes::Q8, true) => "moe_down_q8_slots",
        (true, MoeCodes::Fp8, true) => "moe_down_fp8_slots",
    };
    let smem = match codes {
        MoeCodes::F32 => n / 32 * STAGE_PAD * 4,
        MoeCodes::F16 => n / 32 * (F16_PAD + 4),
        MoeCodes::Q8 | MoeCodes::Fp8 => n / 32 * (ACT8_PAD + 4),
    };
    (name, smem)
}

/// Most 32-block items of a row each lane of the `_slots` decode MoE kernels holds (kernel
/// constant `MOE_SLOTS_NI`): rows of up to 32 · 3 blocks of 32 (3072 inputs) take them.
const MOE_SLOTS_NI: usize = 3;

/// Expected tokens per distinct expert from which gate_up runs grouped ([`MoeUnits::grouping`]).
pub const MOE_GRP_FROM_SHARE: f64 = 2.0;

/// Environment knob for A/B runs: `MXTUNE_MOE_GRP_FROM=X` (a positive number) moves
/// [`MOE_GRP_FROM_SHARE`], the expected tokens per distinct expert from which gate_up runs
/// grouped under `MoeLoop::Auto`.
pub const MOE_GRP_FROM_ENV: &str = "MXTUNE_MOE_GRP_FROM";

/// [`MOE_GRP_FROM_ENV`]'s threshold, or [`MOE_GRP_FROM_SHARE`] where it is unset or empty; any
/// other value than a positive number is an error naming the variable.
pub fn moe_grp_from_env() -> Result<f64> {
    static R: std::sync::OnceLock<Result<f64, String>> = std::sync::OnceLock::new();
    env_once(&R, || {
        let v = std::env::var(MOE_GRP_FROM_ENV).unwrap_or_default();
        if v.trim().is_empty() {
            return Ok(MOE_GRP_FROM_SHARE);
        }
        match v.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
            _ => Err(anyhow::anyhow!(
                "{MOE_GRP_FROM_ENV}={v}: expected a positive number of tokens per expert \
                 (default {MOE_GRP_FROM_SHARE})"
            )),
        }
    })
}

/// Tokens a distinct expert gets on average when `t` rows each route to `k` of `experts`
/// experts uniformly: t k over the expected number of distinct experts, E (1 − (1 − k/E)^t).
pub fn moe_tokens_per_expert(experts: usize, k: usize, t: usize) -> f64 {
    if experts == 0 || k == 0 || t == 0 {
        return 0.0;
    }
    let p = (k as f64 / experts as f64).min(1.0);
    let distinct = experts as f64 * (1.0 - (1.0 - p).powi(t as i32));
    (t * k) as f64 / distinct
}

/// Tokens of one expert the grouped decode MoE kernels take at a time (kernel constant
/// `MOE_GRP_NT`): their activations staged together, each weight block decoded once for them.
pub const MOE_GRP_NT: usize = 3;

/// The grouped decode MoE kernel (`_grp`) for codes `codes` over rows of `width` inputs, when
/// loop `lp` asks for it and the kernel takes the shape: its name, the tokens it stages at a
/// time for `t` rows, the bytes between two stagings, and its dynamic shared memory.
fn moe_grp_kernel(
    down: bool,
    codes: MoeCodes,
    lp: MoeLoop,
    s: MoeShape,
    width: usize,
    t: usize,
) -> Option<(&'static str, usize, usize, usize)> {
    if lp != MoeLoop::Grouped
        || codes != MoeCodes::F16
        || s.k > TCG_MAX_K
        || !MoeLoop::Slots.slots(1, width)
    {
        return None;
    }
    let name = if down {
        "moe_down_h2_grp"
    } else {
        "moe_gate_up_swiglu_h2_grp"
    };
    let cap = MOE_GRP_NT.min(t);
    let stride = moe_gemv_kernel(down, codes, width, true)
        .1
        .next_multiple_of(16);
    Some((name, cap, stride, cap * stride))
}

/// Environment variable choosing the decode MoE's loop ([`MoeLoop`]) for A/B runs.
pub const MOE_LOOP_ENV: &str = "MXTUNE_MOE_LOOP";

/// The loop of the SIMT decode MoE kernels (`moe_gemv.cu`); both compute the same sums in the
/// same order, so the choice changes speed only.
/// * `Items`: each warp walks its units' 32-block items as one sequence, two in flight.
/// * `Slots`: the `_slots` kernels hold a unit's items in fixed registers, all in flight, the
///   next unit's items loaded as the current ones are consumed; compiled for 2 blocks per SM
///   (~115 registers). Only for rows of at most [`MOE_SLOTS_NI`] items (3072 inputs).
/// * `Grouped`: the `_grp` kernels (fp16 dot only; other codes run `Slots`): one block per
///   row range and distinct expert of up to 16 tokens, each 32-weight block decoded once for
///   all the tokens routed to that expert ([`MOE_GRP_NT`] at a time), where `Slots` decode it
///   once per (token, slot) pair. Same rows of registers as `Slots`, same sums per pair.
/// * `Auto` (the default): `Slots` where a warp has several units, `Items` for one unit a
///   warp (where 3 blocks per SM win: docs/perf.md, run 84). [`MoeUnits::for_batch`] gives
///   the slots several units at batch 1 too, so for gpt-oss every batch runs `Slots`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeLoop {
    Auto,
    Items,
    Slots,
    Grouped,
}

impl MoeLoop {
    /// From [`MOE_LOOP_ENV`] (unset: `Auto`); a bad value is an error naming it.
    pub fn from_env() -> Result<Self> {
        env_choice(
            MOE_LOOP_ENV,
            &[
                ("auto", Self::Auto),
                ("items", Self::Items),
                ("slots", Self::Slots),
                ("grouped", Self::Grouped),
            ],
        )
    }

    /// Name in the self-test's labels.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Items => "items",
            Self::Slots => "slots",
            Self::Grouped => "grouped",
        }
    }

    /// Whether a kernel with `units` per warp over rows of `width` inputs runs `_slots`.
    pub(crate) fn slots(self, units: usize, width: usize) -> bool {
        let fits = (width / 32).div_ceil(32) <= MOE_SLOTS_NI;
        match self {
            Self::Items => false,
            Self::Slots | Self::Grouped => fits,
            Self::Auto => fits && units > 1,
        }
    }
}

impl MoeShape {
    fn check(&self) -> Result<()> {
        ensure!(
            self.hidden.is_multiple_of(32) && self.inter.is_multiple_of(32),
            "MXFP4 needs hidden {} and intermediate {} to be multiples of 32",
            self.hidden,
            self.inter
        );
        // The `_slots` kernels share rows among warps with 32-bit products (moe_gemv.cu).
        ensure!(
            self.hidden < 1 << 16 && self.inter < 1 << 16,
            "the decode MoE takes hidden and intermediate sizes below 65536, not {} and {}",
            self.hidden,
            self.inter
        );
        Ok(())
    }
}

/// y[t] (+)= Σ_s w[t,s] · expert_{idx[t,s]}(x[t]); `act` is scratch [t, k, I] fp32, `part`
/// scratch [t, k, H] fp32; `codes` how the kernels code x and act; `ctr` [`moe_counters`]
/// zeroed u32s (left zeroed).
pub fn moe(
    g: &Gpu,
    w: &MoeWeights,
    s: MoeShape,
    codes: MoeCodes,
    x: u64,
    idx: u64,
    wts: u64,
    act: u64,
    part: u64,
    y: u64,
    t: usize,
    accumulate: bool,
    units: MoeUnits,
    ctr: u64,
) -> Result<()> {
    moe_gate_up(
        g,
        w,
        s,
        codes,
        x,
        idx,
        act,
        t,
        units.gate_up,
        units.gate_up_loop(),
        None,
        None,
    )?;
    moe_down(
        g, w, s, codes, idx, wts, act, part, y, t, accumulate, units.down, units.lp, ctr, None, 0,
        None,
    )
}

/// Environment variable fixing the decode MoE's units per warp ([`MoeUnits`]) for tuning
/// runs; unset, [`MoeUnits::for_batch`] picks them.
pub const MOE_UNITS_ENV: &str = "MXTUNE_MOE_UNITS";

/// Most units one warp of the decode MoE kernels takes (a lane holds one unit's bias).
pub const MOE_MAX_UNITS: usize = 32;

/// Fewest blocks per multiprocessor [`MoeUnits::for_batch`] leaves the decode MoE kernels
/// below [`MOE_WIDE_FROM_BATCH`] rows, and from it, in halves of a block (8 and 3.5).
const MOE_MIN_HALF_BLOCKS_PER_SM: [usize; 2] = [16, 7];

/// Batch size from which [`MoeUnits::for_batch`] gives warps more units (fewer blocks).
const MOE_WIDE_FROM_BATCH: usize = 4;

/// Blocks per SM the `_slots` decode MoE kernels are compiled for (kernel constant
/// `MOE_SLOTS_MINB`).
const MOE_SLOTS_BLOCKS_PER_SM: usize = 2;

/// Blocks of the `_slots` kernels the whole device holds at once (one wave).
fn slots_wave(sms: usize) -> usize {
    MOE_SLOTS_BLOCKS_PER_SM * sms.max(1)
}

/// Largest units per warp [`MoeUnits::for_batch`] picks, below [`MOE_WIDE_FROM_BATCH`] rows
/// and from it.
const MOE_AUTO_MAX_UNITS: [usize; 2] = [8, 16];

fn check_units(units: usize) -> Result<()> {
    ensure!(
        (1..=MOE_MAX_UNITS).contains(&units),
        "MoE units per warp {units} outside 1..={MOE_MAX_UNITS}"
    );
    Ok(())
}

/// Units per warp of the decode MoE kernels (`moe_gemv.cu`): a unit is a gate/linear row pair
/// of gate_up or two output rows of down, and one staging of a block's activations serves 8
/// warps × units of them. More units amortize the staging and keep each warp's loads
/// streaming; fewer give more blocks to spread over the chip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeUnits {
    pub gate_up: usize,
    pub down: usize,
    /// The kernels' loop ([`MoeLoop`]).
    pub lp: MoeLoop,
    /// gate_up runs the grouped loop though `lp` is `Auto` ([`MoeUnits::grouping`]).
    pub gate_up_grouped: bool,
}

impl MoeUnits {
    /// One unit per warp: the kernels' shape before units existed.
    pub const ONE: Self = Self {
        gate_up: 1,
        down: 1,
        lp: MoeLoop::Auto,
        gate_up_grouped: false,
    };

    /// Units `gate_up`/`down` with loop `lp` (no automatic grouping).
    pub const fn new(gate_up: usize, down: usize, lp: MoeLoop) -> Self {
        Self {
            gate_up,
            down,
            lp,
            gate_up_grouped: false,
        }
    }

    /// The loop gate_up runs: `Grouped` where [`MoeUnits::grouping`] chose it, else `lp`.
    pub fn gate_up_loop(self) -> MoeLoop {
        if self.gate_up_grouped {
            MoeLoop::Grouped
        } else {
            self.lp
        }
    }

    /// With `lp` `Auto`, gate_up takes the grouped loop where `t` rows routed to `k` of
    /// `experts` experts (uniformly) are expected to send at least [`MOE_GRP_FROM_SHARE`]
    /// tokens to each distinct expert they name: below that, decoding a weight block once
    /// for its tokens saves less than the grouping costs. Since the word decode's small
    /// rotations became left shifts (`FP4_ROT_SHL`), a cheaper decode that serves the per-pair
    /// `_slots` loop (which decodes a shared expert once for each of its pairs) more than the
    /// grouped one, the crossover sat at about 2.2 tokens an expert (docs/perf.md run 352,
    /// H200, whole steps, `MXTUNE_MOE_LOOP=slots` against `auto`'s grouped gate_up:
    /// gpt-oss-20b batch 8 / 10 / 12 / 14, 1.52 / 1.70 / 1.88 / 2.07 tokens, −4.0 / −4.7 /
    /// −2.2 / −2.2 % on `_slots`; batch 16, 2.27 tokens, +0.4 % (all-MXFP4 −0.5 %);
    /// gpt-oss-120b batch 12 / 16 grouped +9 %). Measured on gpt-oss-20b: gpt-oss-120b reaches
    /// those shares only from batch 29, which no run has timed since. It was 1.5 from session
    /// 35 (runs 268–270: 20b batch 8 / 12 / 16 then 0.5 / 2.3 / 5.8 % faster grouped). Since
    /// the units finish on their own lanes (`MOE_LANE_EPI`), which took more off the grouped
    /// gate_up (one SwiGLU a member and unit on lane 0 before) than off `_slots`, it is 2.0
    /// (run 414, H200, `MXTUNE_MOE_GRP_FROM` 2.2 / 1.1 / 100: gpt-oss-20b batch 14, 2.07
    /// tokens, grouped −0.9 / −1.2 %; batch 12, 1.88, +0.6 / +0.6 %; batch 8 +2.0 %; batch 16
    /// on `_slots` +3.6 %; gpt-oss-120b batch 12 / 16 grouped +5.4 / +2.2 %): gpt-oss-120b
    /// from batch 52, gpt-oss-20b from 14. The down kernel keeps the `_slots` loop: grouped
    /// it was never faster (session 17; again run 415: 20b batch 14 / 16 +6.5 / +8.7 %).
    /// `from` is that threshold: the decoder passes [`moe_grp_from_env`]'s.
    pub fn grouping(mut self, experts: usize, k: usize, t: usize, from: f64) -> Self {
        self.gate_up_grouped =
            self.lp == MoeLoop::Auto && moe_tokens_per_expert(experts, k, t) >= from;
        self
    }

    /// gate_up's units where it runs the `_slots` loop (`grouping` left it there): the fewest
    /// that let its grid fill whole waves of the slots — as few waves as any count up to
    /// [`MOE_MAX_UNITS`] allows — so that [`moe_ranges`] spreads its rows over exactly those
    /// waves' blocks. gpt-oss-120b on 132 SMs: 6 units at batch 1 (one wave, as
    /// [`MoeUnits::for_batch`]), 11 / 17 / 23 / 28 at 2 / 3 / 4 / 5 (one wave), 17 / 20 / 23 at
    /// 6 / 7 / 8 (two), 23 at 12 (three). H200 (docs/perf.md runs 264–267, against
    /// `for_batch`'s 6 below batch 4 and up to 16 from it): batch 2 / 3 / 4 / 5 / 6 / 8 / 12
    /// −5.0 / −6.3 / −3.9 / −4.2 / −6.5 / −2.7 / −2.5 %, 9 / 11 / 14 / 15 −3.0 / −1.9 / −1.9 /
    /// −1.5 %, 7 and 10 −0.4 / −0.8 %, all-MXFP4 batch 3 / 8 −7.2 / −2.1 %, gpt-oss-20b batch
    /// 2 / 3 / 4 −4.7 / −6.5 / −3.6 %. Called by the decoder unless
    /// [`MOE_UNITS_ENV`] fixes the units.
    pub fn whole_waves(mut self, sms: usize, s: MoeShape, t: usize) -> Self {
        let lp = self.gate_up_loop();
        if lp == MoeLoop::Grouped || !lp.slots(MOE_MAX_UNITS, s.hidden) {
            return self;
        }
        let wave = slots_wave(sms);
        let pairs = (s.k * t).max(1);
        let blocks = |u: usize| gate_up_ranges(s, u) * pairs;
        let waves = blocks(MOE_MAX_UNITS).div_ceil(wave).max(1);
        if let Some(u) = (1..=MOE_MAX_UNITS).find(|&u| blocks(u) <= waves * wave) {
            self.gate_up = u;
        }
        self
    }

    /// `fixed` (from [`MOE_UNITS_ENV`]: gate_up, down), or, where the `_slots` loop can run
    /// (`lp` not `Items`, rows short enough):
    /// * down: the fewest units (at most 16) whose grid for the whole batch fits one wave of
    ///   the `_slots` kernels (2 blocks per SM): the slots stream a warp's units without
    ///   draining, and one wave has no tail. gpt-oss-120b: 3 at batch 1 (docs/perf.md run
    ///   86), 6 at 2, 12 at 4, 14 at 5; with the experts' fp16 layout (session 24, H200) 6/6 at
    ///   batch 2 and 12/12 at 4 beat the previous rule's 8/6 and 12/6 by 1.0 and 2.2 %, and
    ///   more units than that (a partial wave) or fewer (a wave and a tail) lost;
    /// * gate_up below batch 4: batch 1's one wave (6 for gpt-oss-120b: 6/3 at batch 1, +4 %
    ///   over 1/1, run 86; 6/6 at batch 3 4.6 % ahead of the previous rule's 8/8, session 24);
    /// * otherwise (gate_up from batch 4, down where one wave needs more than 16 units) the
    ///   most units that still give `t` rows enough blocks: below batch 4 a power of two, at
    ///   most 8, leaving at least 8 blocks per multiprocessor (run 42); from batch 4 any count
    ///   up to 16 leaving at least 3.5 blocks (gpt-oss-120b on the H100: 12 at batch 4, 15 at
    ///   5, 16 from 6 for gate_up, 9 / 11 / 12 / 16 for down at batch 6 / 7 / 8 / 16,
    ///   docs/perf.md runs 164–166, still the best of those tried in session 24); and where
    ///   that is one unit a warp with the slots possible, the one-wave pick.
    pub fn for_batch(
        sms: usize,
        s: MoeShape,
        t: usize,
        fixed: Option<(usize, usize)>,
        lp: MoeLoop,
    ) -> Self {
        if let Some((gate_up, down)) = fixed {
            return Self::new(gate_up, down, lp);
        }
        let wide = usize::from(t >= MOE_WIDE_FROM_BATCH);
        let (min_half_blocks, max_units) =
            (MOE_MIN_HALF_BLOCKS_PER_SM[wide], MOE_AUTO_MAX_UNITS[wide]);
        let wave = slots_wave(sms);
        // The fewest units up to `cap` whose grid for `rows` rows fits one wave of the slots.
        let fits_one_wave = |units_total: usize, rows: usize, cap: usize| {
            (1..=cap).find(|&u| units_total.div_ceil(8 * u) * s.k * rows <= wave)
        };
        // units_total: the kernel's units (a block's 8 warps take 8 u of them); width: the
        // length of the rows the kernel reads.
        let pick = |units_total: usize, width: usize, down: bool| {
            let slots = lp != MoeLoop::Items && MoeLoop::Slots.slots(1, width);
            if slots {
                if down {
                    // The down kernel: one wave of the whole batch where units up to 16 give it.
                    if let Some(u) = fits_one_wave(units_total, t, MOE_AUTO_MAX_UNITS[1]) {
                        return u;
                    }
                } else if wide == 0 {
                    // gate_up below batch 4: batch 1's one wave.
                    return fits_one_wave(units_total, 1, max_units).unwrap_or(max_units);
                }
            }
            let enough =
                |u: usize| 2 * units_total.div_ceil(8 * u) * s.k * t >= min_half_blocks * sms;
            let u = if wide == 1 {
                (1..=max_units).rev().find(|&u| enough(u)).unwrap_or(1)
            } else {
                let mut u = 1;
                while u < max_units && enough(2 * u) {
                    u *= 2;
                }
                u
            };
            if u == 1 && slots {
                fits_one_wave(units_total, t, max_units).unwrap_or(max_units)
            } else {
                u
            }
        };
        Self::new(
            pick(s.inter, s.hidden, false),
            pick(s.hidden.div_ceil(2), s.inter, true),
            lp,
        )
    }

    /// [`MOE_UNITS_ENV`] as (gate_up, down), or None when unset: `N` for both kernels, or
    /// `G/D`, each in 1..=32.
    pub fn from_env() -> Result<Option<(usize, usize)>> {
        match std::env::var(MOE_UNITS_ENV).as_deref() {
            Err(_) | Ok("") => Ok(None),
            Ok(v) => Self::parse(v).map(Some),
        }
    }

    fn parse(v: &str) -> Result<(usize, usize)> {
        let one = |p: &str| match p.trim().parse::<usize>() {
            Ok(n) if (1..=MOE_MAX_UNITS).contains(&n) => Ok(n),
            _ => anyhow::bail!(
                "{MOE_UNITS_ENV}={v}: expected a whole number from 1 to {MOE_MAX_UNITS}, or two \
                 of them as GATE_UP/DOWN"
            ),
        };
        match v.split_once('/') {
            Some((g, d)) => Ok((one(g)?, one(d)?)),
            None => one(v).map(|n| (n, n)),
        }
    }
}

/// act[t, s] = swiglu(W1_e x[t] + b1_e) for the routed experts e = idx[t, s] (x coded as
/// `codes` per block of 32 in the kernel).
///
/// `norm` ([`InputNorm`]): x is the residual stream, which the kernel normalises itself
/// (RMSNorm times the norm's weights) and stages before its wait on the router. Only with the
/// router's announcements (`ready`), and only where x was complete before the router passed
/// its own wait (the decode step: o's projection wrote it); not with the grouped loop.
#[allow(clippy::too_many_arguments)]
pub fn moe_gate_up(
    g: &Gpu,
    w: &MoeWeights,
    s: MoeShape,
    codes: MoeCodes,
    x: u64,
    idx: u64,
    act: u64,
    t: usize,
    units: usize,
    lp: MoeLoop,
    ready: Option<MoeWords>,
    norm: Option<InputNorm>,
) -> Result<()> {
    w.layout.expect(
        ExpertLayout::for_codes(codes),
        "the decode MoE kernels of these codes",
    )?;
    let (kernel, smem, grid, grp) = moe_decode_launch(g, false, codes, lp, s, units, t, ready)?;
    ensure!(
        norm.is_none() || (ready.is_some() && grp.is_none()),
        "gate_up normalises its input only with the router's announcements and not grouped"
    );
    let mut args = vec![
        Arg::Ptr(w.gu_blocks),
        Arg::Ptr(w.gu_scales),
        Arg::Ptr(w.gu_bias),
        Arg::Ptr(x),
        Arg::Ptr(idx),
        Arg::Ptr(act),
        i(s.inter)?,
        i(s.hidden)?,
        i(s.k)?,
    ];
    if grp.is_some() {
        args.push(i(t)?);
    }
    args.extend([Arg::F32(s.limit), Arg::F32(s.alpha), i(units)?]);
    match grp {
        Some((cap, stride)) => args.extend([i(cap)?, i(stride)?]),
        None => args.extend([
            opt(ready.map(|r| r.ready)),
            opt(ready.map(|r| r.done)),
            opt(norm.map(|n| n.w)),
            Arg::F32(norm.map_or(0.0, |n| n.eps)),
        ]),
    }
    g.launch(kernel, grid, (256, 1, 1), u(smem)?, &args)
}

/// Most experts per token the tensor-core MoE groups (kernel constant `TCG_MAX_K`).
const TCG_MAX_K: usize = 32;

/// Whether the tensor-core decode MoE ([`moe_gate_up_tc`], [`moe_down_tc`]) takes this shape:
/// k within its grouping, and 16 staged rows of the wider input within shared memory.
pub fn moe_tc_fits(g: &Gpu, s: MoeShape) -> bool {
    // Static: the group (pair list) and the grouping's copy of the routing.
    let staged = TCG_TOKENS * (s.hidden.max(s.inter) + TCG_XPAD) * 2;
    let group = (2 + TCG_TOKENS) * 4 + TCG_TOKENS * TCG_MAX_K * 4 + 16;
    s.k <= TCG_MAX_K
        && s.hidden.is_multiple_of(32)
        && s.inter.is_multiple_of(32)
        && staged + group <= g.max_shared()
}

/// Launch tensor-core MoE kernel `base` (`_t8` or `_t16` by `t`) over `t` tokens: groups of 16
/// tokens (z), up to one block row per distinct expert of a group (y), `tiles` of 16 weight
/// rows (x); `width` is the staged input's row length.
fn moe_tc_launch(
    g: &Gpu,
    base: &str,
    s: MoeShape,
    experts: usize,
    t: usize,
    tiles: usize,
    width: usize,
    args: &[Arg],
) -> Result<()> {
    ensure!(
        moe_tc_fits(g, s),
        "MoE shape {s:?} not taken by the tensor-core MoE"
    );
    let kernel = format!("{base}_{}", if t <= 8 { "t8" } else { "t16" });
    let leaders = (t.min(TCG_TOKENS) * s.k).min(experts);
    g.launch(
        &kernel,
        (u(tiles)?, u(leaders)?, u(t.div_ceil(TCG_TOKENS))?),
        (TCG_THREADS, 1, 1),
        u(t.min(TCG_TOKENS) * (width + TCG_XPAD) * 2)?,
        args,
    )
}

/// The decode MoE's gate_up on tensor cores: act[t, s] = swiglu(W13_e h[t] + b13_e) for e =
/// idx[t, s], each distinct expert of a group of 16 tokens read once, its routed rows as the
/// MMA's n dimension (bf16 activations). `experts` bounds the distinct experts of a group.
pub fn moe_gate_up_tc(
    g: &Gpu,
    w: &MoeWeights,
    s: MoeShape,
    experts: usize,
    x: u64,
    idx: u64,
    act: u64,
    t: usize,
) -> Result<()> {
    s.check()?;
    w.layout
        .expect(ExpertLayout::Standard, "the tensor-core decode MoE kernels")?;
    moe_tc_launch(
        g,
        "moe_gate_up_tc",
        s,
        experts,
        t,
        (2 * s.inter).div_ceil(TCM_ROWS),
        s.hidden,
        &[
            Arg::Ptr(w.gu_blocks),
            Arg::Ptr(w.gu_scales),
            Arg::Ptr(w.gu_bias),
            Arg::Ptr(x),
            Arg::Ptr(idx),
            Arg::Ptr(act),
            i(s.inter)?,
            i(s.hidden)?,
            i(s.k)?,
            i(t)?,
            Arg::F32(s.limit),
            Arg::F32(s.alpha),
        ],
    )
}

/// The decode MoE's down projection on tensor cores (each distinct expert read once per group
/// of 16 tokens), then the slots summed into y in order as [`moe_down`] does.
pub fn moe_down_tc(
    g: &Gpu,
    w: &MoeWeights,
    s: MoeShape,
    experts: usize,
    idx: u64,
    wts: u64,
    act: u64,
    part: u64,
    y: u64,
    t: usize,
    accumulate: bool,
) -> Result<()> {
    s.check()?;
    w.layout
        .expect(ExpertLayout::Standard, "the tensor-core decode MoE kernels")?;
    moe_tc_launch(
        g,
        "moe_down_tc",
        s,
        experts,
        t,
        s.hidden.div_ceil(TCM_ROWS),
        s.inter,
        &[
            Arg::Ptr(w.dn_blocks),
            Arg::Ptr(w.dn_scales),
            Arg::Ptr(w.dn_bias),
            Arg::Ptr(act),
            Arg::Ptr(idx),
            Arg::Ptr(wts),
            Arg::Ptr(part),
            i(s.hidden)?,
            i(s.inter)?,
            i(s.k)?,
            i(t)?,
        ],
    )?;
    moe_combine(g, part, y, s.hidden, s.k, t, accumulate)
}

/// Environment variable fixing the fp16 tensor-core MoE's K split (`N`, or `G/D` for
/// gate_up / down; each 1, 2, 4 or 8) for A/B runs; unset: [`MoeF16Split::for_batch`].
pub const MOE_F16_KS_ENV: &str = "MXTUNE_MOE16_KS";

/// Warps splitting each 16-row tile's K in [`moe_gate_up_f16`] (`gate_up`) and
/// [`moe_down_f16`] (`down`): a block of 8 warps covers 128 / ks rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeF16Split {
    pub gate_up: usize,
    pub down: usize,
}

impl MoeF16Split {
    /// From `$MXTUNE_MOE16_KS`; `None` when unset.
    pub fn from_env() -> Result<Option<Self>> {
        match std::env::var(MOE_F16_KS_ENV) {
            Err(_) => Ok(None),
            Ok(v) => Self::parse(&v).map(Some),
        }
    }

    fn parse(v: &str) -> Result<Self> {
        let one = |s: &str| -> Result<usize> {
            match s.trim().parse::<usize>() {
                Ok(n @ (1 | 2 | 4 | 8)) => Ok(n),
                _ => anyhow::bail!(
                    "{MOE_F16_KS_ENV}={v}: expected 1, 2, 4 or 8, or G/D with each of those"
                ),
            }
        };
        match v.split_once('/') {
            Some((g, d)) => Ok(Self {
                gate_up: one(g)?,
                down: one(d)?,
            }),
            None => {
                let n = one(v)?;
                Ok(Self {
                    gate_up: n,
                    down: n,
                })
            }
        }
    }

    /// The split for a batch of `t` rows: the smallest whose grid (row blocks times the
    /// experts a group of min(t, 16) tokens routes to) gives every SM `per_sm` blocks.
    pub fn for_batch(sms: usize, s: MoeShape, experts: usize, t: usize) -> Self {
        let leaders = (t.clamp(1, TCG_TOKENS) * s.k).min(experts);
        let pick = |rows: usize| {
            [1usize, 2, 4, 8]
                .into_iter()
                .find(|&ks| rows.div_ceil(TCM_ROWS / ks) * leaders >= MOE_F16_BLOCKS_PER_SM * sms)
                .unwrap_or(8)
        };
        Self {
            gate_up: pick(2 * s.inter),
            down: pick(s.hidden),
        }
    }
}

/// Blocks per SM [`MoeF16Split::for_batch`] aims for (the kernels are compiled for 3).
const MOE_F16_BLOCKS_PER_SM: usize = 3;

/// Whether the fp16 tensor-core MoE ([`moe_gate_up_f16`], [`moe_down_f16`]) takes this shape:
/// k within the grouping, whole 32-element blocks, 16 staged fp16 rows and a zero row in
/// shared memory.
pub fn moe_f16_fits(g: &Gpu, s: MoeShape) -> bool {
    s.k <= TCG_MAX_K
        && s.hidden.is_multiple_of(32)
        && s.inter.is_multiple_of(32)
        && (TCG_TOKENS + 1) * moe_f16_stride(s.hidden.max(s.inter)) + 16 * 1024 <= g.max_shared()
}

/// Bytes of one staged fp16 row of `cols` (kernel `moe16_stride`).
fn moe_f16_stride(cols: usize) -> usize {
    let s = cols * 2;
    s + ((64 - (s & 127)) & 127)
}

/// Launch an fp16 tensor-core MoE kernel over `t` tokens: groups of 16 tokens (z), one block
/// row per distinct expert of a group at most (y), `rows` output rows in blocks of 128 / ks (x);
/// `cols` is the staged input's row length.
#[allow(clippy::too_many_arguments)]
fn moe_f16_launch(
    g: &Gpu,
    kernel: &str,
    s: MoeShape,
    experts: usize,
    t: usize,
    rows: usize,
    cols: usize,
    ks: usize,
    args: &[Arg],
) -> Result<()> {
    ensure!(
        moe_f16_fits(g, s),
        "MoE shape {s:?} not taken by the fp16 tensor-core MoE"
    );
    ensure!(
        matches!(ks, 1 | 2 | 4 | 8),
        "fp16 MoE K split {ks}: expected 1, 2, 4 or 8"
    );
    let leaders = (t.min(TCG_TOKENS) * s.k).min(experts);
    g.launch(
        kernel,
        (
            u(rows.div_ceil(TCM_ROWS / ks))?,
            u(leaders)?,
            u(t.div_ceil(TCG_TOKENS))?,
        ),
        (TCG_THREADS, 1, 1),
        u((t.min(TCG_TOKENS) + 1) * moe_f16_stride(cols))?,
        args,
    )
}

/// The decode MoE's gate_up on tensor cores with fp16 operands: act[t, s] = swiglu(W13_e h[t] +
/// b13_e) for e = idx[t, s], each distinct expert of a group of 16 tokens read once, its routed
/// rows the MMA's n dimension; the weights exact, the inputs fp16 of x / D per row (D a power
/// of two), the block scales applied to the fp32 sums. `experts` bounds the distinct experts.
#[allow(clippy::too_many_arguments)]
pub fn moe_gate_up_f16(
    g: &Gpu,
    w: &MoeWeights,
    s: MoeShape,
    experts: usize,
    x: u64,
    idx: u64,
    act: u64,
    t: usize,
    ks: usize,
) -> Result<()> {
    s.check()?;
    w.layout.expect(
        ExpertLayout::Standard,
        "the fp16 tensor-core decode MoE kernels",
    )?;
    moe_f16_launch(
        g,
        "moe_gate_up_f16",
        s,
        experts,
        t,
        2 * s.inter,
        s.hidden,
        ks,
        &[
            Arg::Ptr(w.gu_blocks),
            Arg::Ptr(w.gu_scales),
            Arg::Ptr(w.gu_bias),
            Arg::Ptr(x),
            Arg::Ptr(idx),
            Arg::Ptr(act),
            i(s.inter)?,
            i(s.hidden)?,
            i(s.k)?,
            i(t)?,
            Arg::F32(s.limit),
            Arg::F32(s.alpha),
            i(ks)?,
        ],
    )
}

/// The decode MoE's down projection as [`moe_gate_up_f16`], then y[t] (+)= the k slots' rows
/// summed in slot order by the last block of each row range (`ctr`: [`moe_counters`] zeroed
/// u32s, left zeroed), as [`moe_down`] does: no combine launch.
#[allow(clippy::too_many_arguments)]
pub fn moe_down_f16(
    g: &Gpu,
    w: &MoeWeights,
    s: MoeShape,
    experts: usize,
    idx: u64,
    wts: u64,
    act: u64,
    part: u64,
    y: u64,
    t: usize,
    accumulate: bool,
    ks: usize,
    ctr: u64,
) -> Result<()> {
    s.check()?;
    w.layout.expect(
        ExpertLayout::Standard,
        "the fp16 tensor-core decode MoE kernels",
    )?;
    moe_f16_launch(
        g,
        "moe_down_f16",
        s,
        experts,
        t,
        s.hidden,
        s.inter,
        ks,
        &[
            Arg::Ptr(w.dn_blocks),
            Arg::Ptr(w.dn_scales),
            Arg::Ptr(w.dn_bias),
            Arg::Ptr(act),
            Arg::Ptr(idx),
            Arg::Ptr(wts),
            Arg::Ptr(part),
            i(s.hidden)?,
            i(s.inter)?,
            i(s.k)?,
            i(t)?,
            i(ks)?,
            Arg::Ptr(y),
            i(usize::from(accumulate))?,
            Arg::Ptr(ctr),
        ],
    )
}

/// y[t] (+)= Σ_s w[t,s] (W2_e act[t, s] + b2_e): one block per (16 × units rows, slot) writes
/// the slot's weighted rows to `part` [t, k, H]; the last slot block of each row range sums
/// the slots into y in order (act coded as `codes` per block of 32 in the kernel). `ctr`:
/// [`moe_counters`] zeroed u32s. `mail` ([`moe_mail_words`] zeroed u32s, left zeroed): the
/// `_slots` kernels post the slots' rows there instead, flagged, and the last slot's block of
/// each row range sums them, with no count and no reload (the same bits; the other kernels
/// ignore it). The kernel reads `idx` and issues its first weight loads
/// before its wait on the previous kernel (`MOE_DOWN_EARLY`), so `idx` must be complete
/// before that kernel's own wait: launch it right after [`moe_gate_up`] of the same `idx`.
pub fn moe_down(
    g: &Gpu,
    w: &MoeWeights,
    s: MoeShape,
    codes: MoeCodes,
    idx: u64,
    wts: u64,
    act: u64,
    part: u64,
    y: u64,
    t: usize,
    accumulate: bool,
    units: usize,
    lp: MoeLoop,
    ctr: u64,
    ready: Option<MoeWords>,
    await_units: usize,
    mail: Option<u64>,
) -> Result<()> {
    w.layout.expect(
        ExpertLayout::for_codes(codes),
        "the decode MoE kernels of these codes",
    )?;
    let (kernel, smem, grid, grp) = moe_decode_launch(g, true, codes, lp, s, units, t, ready)?;
    ensure!(
        await_units == 0 || ready.is_some(),
        "down waits on gate_up's counts only with the router's announcements"
    );
    let mut args = vec![
        Arg::Ptr(w.dn_blocks),
        Arg::Ptr(w.dn_scales),
        Arg::Ptr(w.dn_bias),
        Arg::Ptr(act),
        Arg::Ptr(idx),
        Arg::Ptr(wts),
        Arg::Ptr(part),
        i(s.hidden)?,
        i(s.inter)?,
        i(s.k)?,
    ];
    if grp.is_some() {
        args.push(i(t)?);
    }
    args.extend([
        i(units)?,
        Arg::Ptr(y),
        Arg::I32(accumulate as i32),
        Arg::Ptr(ctr),
    ]);
    match grp {
        Some((cap, stride)) => args.extend([i(cap)?, i(stride)?]),
        None => {
            // gate_up's blocks a pair (its row ranges) when down waits on their count.
            let gu_blocks = match await_units {
                0 => 0,
                u => moe_ranges(g.sms(), s, u, t, false, lp.slots(u, s.hidden))?,
            };
            args.extend([
                opt(ready.map(|r| r.ready)),
                opt(ready.map(|r| r.done)),
                i(gu_blocks)?,
                opt(mail),
            ]);
        }
    }
    g.launch(kernel, grid, (256, 1, 1), u(smem)?, &args)
}

/// Environment switch of the decode MoE's expert announcements ([`TopK::ready`], for A/B
/// timing): `on` (the default: gate_up waits on the announcements, down on each pair's
/// gate_up count), `ids` (gate_up on the announcements, down on gate_up's grid) or `off`
/// (both on the previous grid).
pub const MOE_READY_ENV: &str = "MXTUNE_MOE_READY";

/// What the decode MoE waits on ([`MOE_READY_ENV`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeReady {
    On,
    Ids,
    Off,
}

impl MoeReady {
    /// The words of [`MOE_READY_ENV`], the default first.
    const WORDS: [(&'static str, Self); 3] =
        [("on", Self::On), ("ids", Self::Ids), ("off", Self::Off)];

    /// From [`MOE_READY_ENV`]; a bad value is an error naming it.
    pub fn from_env() -> Result<Self> {
        env_choice(MOE_READY_ENV, &Self::WORDS)
    }
}

/// Whether [`moe_gate_up`] and [`moe_down`] of `t` rows take expert announcements with these
/// units: both run the per-pair kernels (not the grouped ones, whose blocks serve several
/// pairs).
pub fn moe_ready_fits(codes: MoeCodes, s: MoeShape, units: MoeUnits, t: usize) -> bool {
    moe_grp_kernel(false, codes, units.gate_up_loop(), s, s.hidden, t).is_none()
        && moe_grp_kernel(true, codes, units.lp, s, s.inter, t).is_none()
}

/// The decode MoE kernel gate_up (or `down`) runs for `t` rows: its name, dynamic shared
/// memory, grid, and for the grouped kernels the tokens staged at a time and their stride.
/// Row ranges of 8 warps × `units` units: gate_up's units are gate/linear row pairs (8 u
/// intermediate units a block), down's two output rows (16 u rows). One block per (routed
/// pair, row range), or for the grouped kernels (row range, leader — up to one per pair of a
/// group of TCG_TOKENS tokens —, token group). `ready`: the router's announcements, which
/// only the per-pair kernels take (an error for the grouped ones).
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn moe_decode_launch(
    g: &Gpu,
    down: bool,
    codes: MoeCodes,
    lp: MoeLoop,
    s: MoeShape,
    units: usize,
    t: usize,
    ready: Option<MoeWords>,
) -> Result<(&'static str, usize, (u32, u32, u32), Option<(usize, usize)>)> {
    s.check()?;
    check_units(units)?;
    let (width, what) = if down {
        (s.inter, "intermediate")
    } else {
        (s.hidden, "hidden")
    };
    // The units' ranges (the grouped kernels'); the `_slots` kernels' may be wider.
    let ranges = moe_ranges(g.sms(), s, units, t, down, false)?;
    let launch = match moe_grp_kernel(down, codes, lp, s, width, t) {
        Some((kernel, cap, stride, smem)) => (
            kernel,
            smem,
            (
                u(ranges)?,
                u(t.min(TCG_TOKENS) * s.k)?,
                u(t.div_ceil(TCG_TOKENS))?,
            ),
            Some((cap, stride)),
        ),
        None => {
            let slots = lp.slots(units, width);
            let (kernel, smem) = moe_gemv_kernel(down, codes, width, slots);
            let ranges = moe_ranges(g.sms(), s, units, t, down, slots)?;
            (kernel, smem, (u(s.k * t)?, u(ranges)?, 1), None)
        }
    };
    ensure!(
        launch.3.is_none() || ready.is_none(),
        "the grouped decode MoE takes no expert announcements (moe_ready_fits)"
    );
    ensure!(
        launch.1 <= g.max_shared(),
        "{what} size {width} too large for the decode MoE's staged inputs ({} bytes, the device \
         allows {})",
        launch.1,
        g.max_shared()
    );
    Ok(launch)
}

/// Row ranges of the decode gate_up kernel with `units` units a warp (8 warps a block, a unit
/// a gate/linear row pair): its blocks a routed pair.
fn gate_up_ranges(s: MoeShape, units: usize) -> usize {
    s.inter.div_ceil(8 * units)
}

/// Environment knob for A/B runs: `MXTUNE_MOE_RANGES=G/D` fixes the row ranges (blocks a
/// routed pair) of the decode MoE's `_slots` gate_up and down kernels, at least as many as
/// their units need; their warps then share the rows evenly (`slots_share`, moe_gemv.cu).
pub const MOE_RANGES_ENV: &str = "MXTUNE_MOE_RANGES";

fn moe_ranges_env() -> Result<Option<(usize, usize)>> {
    static R: std::sync::OnceLock<Result<Option<(usize, usize)>, String>> =
        std::sync::OnceLock::new();
    env_once(&R, || {
        let v = std::env::var(MOE_RANGES_ENV).unwrap_or_default();
        if v.is_empty() {
            return Ok(None);
        }
        let bad =
            || anyhow::anyhow!("{MOE_RANGES_ENV}={v}: expected GATE_UP/DOWN, two whole numbers");
        let (g, d) = v.split_once('/').ok_or_else(bad)?;
        match (g.trim().parse::<usize>(), d.trim().parse::<usize>()) {
            (Ok(g), Ok(d)) if g > 0 && d > 0 => Ok(Some((g, d))),
            _ => Err(bad()),
        }
    })
}

/// Row ranges (blocks a routed pair) of the decode MoE's per-pair kernel, `down` or gate_up,
/// with `units` units a warp for `t` rows on `sms` multiprocessors; `slots`: it runs the
/// `_slots` loop. The units' ranges, except for gate_up's `_slots` kernel where those leave
/// part of their last wave of the slots empty (gpt-oss-120b at batch 1: 60 ranges × 4 pairs
/// in the H100's and H200's 264 slots): there the waves' share of a pair (66), its warps
/// sharing the rows evenly (5 or 6 units each; docs/perf.md runs 258–260: batch 1 −0.2 to
/// −0.35 %, all-MXFP4 −0.6 to −0.8 %, 20b 0 to −0.2 %; down's own wave of 66 lost, +0.3 %).
/// At most one unit a warp. [`MoeUnits::whole_waves`] picks gate_up's units for this.
/// [`MOE_RANGES_ENV`] sets the `_slots` kernels' ranges (within those bounds).
pub fn moe_ranges(
    sms: usize,
    s: MoeShape,
    units: usize,
    t: usize,
    down: bool,
    slots: bool,
) -> Result<usize> {
    let (base, most) = if down {
        (s.hidden.div_ceil(16 * units), s.hidden.div_ceil(16))
    } else {
        (gate_up_ranges(s, units), s.inter.div_ceil(8))
    };
    if !slots {
        return Ok(base);
    }
    match moe_ranges_env()? {
        Some((g, d)) => {
            let r = if down { d } else { g };
            ensure!(
                (base..=most).contains(&r),
                "{MOE_RANGES_ENV}: {r} {} ranges with {units} units a warp: expected {base} to \
                 {most}",
                if down { "down" } else { "gate_up" }
            );
            Ok(r)
        }
        None if down => Ok(base),
        None => {
            let (wave, pairs) = (slots_wave(sms), (s.k * t).max(1));
            let waves = (base * pairs).div_ceil(wave);
            Ok(base.max((waves * wave / pairs).min(most)))
        }
    }
}

/// Counters [`moe_down`] needs for `t` rows (zeroed once; the kernel leaves them zero).
pub fn moe_counters(hidden: usize, t: usize) -> usize {
    hidden.div_ceil(16) * t
}

/// y[t] (+)= Σ_s part[t, s] over the k slots in order ([t, k, H] fp32).
pub fn moe_combine(
    g: &Gpu,
    part: u64,
    y: u64,
    hidden: usize,
    k: usize,
    t: usize,
    accumulate: bool,
) -> Result<()> {
    g.launch(
        "moe_combine",
        (u(hidden.div_ceil(256))?, u(t)?, 1),
        (256, 1, 1),
        0,
        &[
            Arg::Ptr(part),
            Arg::Ptr(y),
            i(hidden)?,
            i(k)?,
            Arg::I32(accumulate as i32),
        ],
    )
}

/// Vocabulary entries per argmax partial block.
pub const ARGMAX_CHUNK: usize = 4096;

/// Token id of the largest logit of each of `t` rows into `out` (device u32 [t]);
/// `part_v`/`part_i` hold t · ceil(vocab / ARGMAX_CHUNK) entries.
pub fn argmax(
    g: &Gpu,
    logits: u64,
    part_v: u64,
    part_i: u64,
    out: u64,
    vocab: usize,
    t: usize,
) -> Result<()> {
    let chunks = vocab.div_ceil(ARGMAX_CHUNK);
    g.launch(
        "argmax_partial",
        (u(chunks)?, u(t)?, 1),
        (256, 1, 1),
        0,
        &[
            Arg::Ptr(logits),
            i(vocab)?,
            i(ARGMAX_CHUNK)?,
            Arg::Ptr(part_v),
            Arg::Ptr(part_i),
        ],
    )?;
    g.launch(
        "argmax_final",
        (u(t)?, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::Ptr(part_v),
            Arg::Ptr(part_i),
            i(chunks)?,
            Arg::Ptr(out),
        ],
    )
}

/// Threads per row of the sampling kernel (kernel constant `SAMPLE_THREADS`).
const SAMPLE_THREADS: u32 = 512;

/// Most banned ids one row of the sampling kernel takes (kernel constant `SAMPLE_MAX_BANNED`).
pub const SAMPLE_MAX_BANNED: usize = 256;

/// Largest vocabulary the sampling kernel's fixed-point masses hold without overflow.
pub const SAMPLE_MAX_VOCAB: usize = 1 << 26;

/// One row's request to the sampling kernel (`SampleRow` in sampling.cu).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SampleRow {
    /// Uniform number in [0, 1) from the request's stream (ignored when greedy).
    pub u: f64,
    /// Temperature (> 0 unless greedy).
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 disables.
    pub top_p: f32,
    /// 0 disables.
    pub top_k: usize,
    /// Take the largest allowed logit.
    pub greedy: bool,
    /// Return the chosen token's logprob.
    pub logprob: bool,
    /// Banned ids: `banned[ban_off .. ban_off + ban_n]`.
    pub ban_off: usize,
    /// At most [`SAMPLE_MAX_BANNED`].
    pub ban_n: usize,
    /// Row of the logits to read.
    pub logit_row: usize,
    /// Where the result goes: `out[2 · out_row]` token, `out[2 · out_row + 1]` logprob bits.
    pub out_row: usize,
}

/// Bytes of one [`SampleRow`] on the device.
pub const SAMPLE_ROW_BYTES: usize = 40;

impl SampleRow {
    /// The device layout (little endian, 40 bytes per row).
    pub fn encode(rows: &[SampleRow]) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(rows.len() * SAMPLE_ROW_BYTES);
        let int = |v: usize| -> Result<[u8; 4]> {
            Ok(i32::try_from(v)
                .map_err(|_| anyhow::anyhow!("sampling row field {v} does not fit 32 bits"))?
                .to_le_bytes())
        };
        for r in rows {
            ensure!(
                r.ban_n <= SAMPLE_MAX_BANNED,
                "{} banned ids in one row; the sampling kernel takes at most {SAMPLE_MAX_BANNED}",
                r.ban_n
            );
            out.extend(r.u.to_le_bytes());
            out.extend(r.temperature.to_le_bytes());
            out.extend(r.top_p.to_le_bytes());
            out.extend(int(r.top_k.min(i32::MAX as usize))?);
            out.extend((r.greedy as i32 | (r.logprob as i32) << 1).to_le_bytes());
            out.extend(int(r.ban_off)?);
            out.extend(int(r.ban_n)?);
            out.extend(int(r.logit_row)?);
            out.extend(int(r.out_row)?);
        }
        Ok(out)
    }
}

impl SampleRow {
    /// Whether the row needs only the largest logit and the token weights: no top-k, no
    /// top-p, no logprob, nothing banned (the default request). Such rows go to
    /// [`sample_plain`], which spreads each row over many blocks.
    pub fn is_plain(&self) -> bool {
        self.top_k == 0 && self.top_p >= 1.0 && !self.logprob && self.ban_n == 0
    }
}

/// Whether the sampling kernels have rows to launch for: false for none, an error for a
/// vocabulary outside their range.
fn sample_vocab(vocab: usize, nrows: usize) -> Result<bool> {
    ensure!(
        vocab > 0 && vocab < SAMPLE_MAX_VOCAB,
        "vocabulary of {vocab} outside the sampling kernel's range (1 to {SAMPLE_MAX_VOCAB})"
    );
    Ok(nrows > 0)
}

/// Ids per chunk of [`sample_plain`] (kernel constant `SAMPLE_CHUNK`).
const SAMPLE_CHUNK: usize = 4096;
/// Threads per block of [`sample_plain`]'s kernels (`SAMPLE_PART_THREADS`).
const SAMPLE_PART_THREADS: u32 = 256;
/// Bytes of one chunk's partial result (`SamplePart` in sampling.cu).
const SAMPLE_PART_BYTES: usize = 24;

/// Scratch bytes [`sample_plain`] needs for `nrows` rows of `vocab` logits.
pub fn sample_plain_scratch(vocab: usize, nrows: usize) -> usize {
    nrows * vocab.div_ceil(SAMPLE_CHUNK) * SAMPLE_PART_BYTES
}

/// [`sample`] for rows that are all [`SampleRow::is_plain`], on many blocks a row: each
/// chunk's largest logit (`sample_max_part`), each chunk's exact mass of token weights
/// (`sample_mass_part`, non-greedy rows), then per row the chunk the draw falls in and the
/// walk through it (`sample_pick`). The same token as [`sample`] (the same weights, exact
/// sums, the walk in id order); no logprob (its bits are NaN). `parts`: scratch of
/// [`sample_plain_scratch`] bytes.
pub fn sample_plain(
    g: &Gpu,
    logits: u64,
    vocab: usize,
    rows: u64,
    nrows: usize,
    parts: u64,
    out: u64,
) -> Result<()> {
    if !sample_vocab(vocab, nrows)? {
        return Ok(());
    }
    let nc = vocab.div_ceil(SAMPLE_CHUNK);
    let args = [Arg::Ptr(logits), i(vocab)?, Arg::Ptr(rows), Arg::Ptr(parts)];
    for kernel in ["sample_max_part", "sample_mass_part"] {
        g.launch(
            kernel,
            (u(nc)?, u(nrows)?, 1),
            (SAMPLE_PART_THREADS, 1, 1),
            0,
            &args,
        )?;
    }
    g.launch(
        "sample_pick",
        (u(nrows)?, 1, 1),
        (SAMPLE_PART_THREADS, 1, 1),
        0,
        &[
            Arg::Ptr(logits),
            i(vocab)?,
            Arg::Ptr(rows),
            Arg::Ptr(parts),
            i(nc)?,
            Arg::Ptr(out),
        ],
    )
}

/// Sample `nrows` rows described by `rows` (device [`SampleRow`] array, see
/// [`SampleRow::encode`]) from `logits` ([*, vocab] fp32); `banned` is the device u32 array
/// the rows index; `out` receives (token, logprob bits) pairs at each row's `out_row`.
pub fn sample(
    g: &Gpu,
    logits: u64,
    vocab: usize,
    rows: u64,
    nrows: usize,
    banned: u64,
    out: u64,
) -> Result<()> {
    if !sample_vocab(vocab, nrows)? {
        return Ok(());
    }
    g.launch(
        "sample_rows",
        (u(nrows)?, 1, 1),
        (SAMPLE_THREADS, 1, 1),
        0,
        &[
            Arg::Ptr(logits),
            i(vocab)?,
            Arg::Ptr(rows),
            Arg::Ptr(banned),
            Arg::Ptr(out),
        ],
    )
}

/// Fill `n` bf16 with `offset + scale · U(-1, 1)` from the counter hash of `seed`.
pub fn fill_bf16(g: &Gpu, out: u64, n: usize, seed: u64, scale: f32, offset: f32) -> Result<()> {
    let blocks = u(n.div_ceil(256).clamp(1, 65536))?;
    g.launch(
        "fill_bf16",
        (blocks, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::Ptr(out),
            Arg::U64(n as u64),
            Arg::U64(seed),
            Arg::F32(scale),
            Arg::F32(offset),
        ],
    )
}

/// Fill `n` bytes uniformly in `lo..=hi` from the counter hash of `seed`.
pub fn fill_u8(g: &Gpu, out: u64, n: usize, seed: u64, lo: u8, hi: u8) -> Result<()> {
    let blocks = u(n.div_ceil(256).clamp(1, 65536))?;
    g.launch(
        "fill_u8",
        (blocks, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::Ptr(out),
            Arg::U64(n as u64),
            Arg::U64(seed),
            Arg::I32(lo as i32),
            Arg::I32(hi as i32),
        ],
    )
}

/// Blocks × threads of the read probe (a fixed, chip-filling grid).
pub const PROBE_THREADS: usize = 1024 * 1024;

/// Read `bytes` (a multiple of 16) from `src` once; `sink` holds PROBE_THREADS u32.
pub fn read_probe(g: &Gpu, src: u64, bytes: usize, sink: u64) -> Result<()> {
    ensure!(
        bytes.is_multiple_of(16),
        "probe size {bytes} not a multiple of 16"
    );
    g.launch(
        "read_probe",
        (u(PROBE_THREADS / 256)?, 1, 1),
        (256, 1, 1),
        0,
        &[Arg::Ptr(src), Arg::U64((bytes / 16) as u64), Arg::Ptr(sink)],
    )
}

/// Token rows per tensor-core tile of the dense GEMM (kernel constant `TC_BM`; the grouped MoE
/// takes its rows from its [`MoeTile`]).
pub const TC_BM: usize = 64;
/// Output columns per tensor-core tile (kernel constant `TC_BN`).
const TC_BN: usize = 128;
/// K per tensor-core stage (kernel constant `TC_BK`).
const TC_BK: usize = 32;

/// Prefill GEMM on tensor cores: y[m] (+)= W x[m] + b for `m` rows, W bf16 [n, k], x fp32
/// [m, k] (rounded to bf16 for the MMA), fp32 out [m, n]. `k` must be a multiple of 32.
pub fn gemm(
    g: &Gpu,
    w: u64,
    bias: Option<u64>,
    x: u64,
    y: u64,
    m: usize,
    n: usize,
    k: usize,
    accumulate: bool,
) -> Result<()> {
    tc_gemm_launch(
        g,
        ("gemm_bf16_tc", TC_BM, 0),
        &[Arg::Ptr(w)],
        bias,
        x,
        y,
        m,
        n,
        k,
        accumulate,
        (&[], 1),
    )
}

/// Launch a tensor-core prefill GEMM (`gemm_bf16_tc`, `gemm_mxfp4_tc`, `gemm_bf16_cp`):
/// `tile` is (kernel, rows per block, dynamic shared bytes); `weights` are the kernel's weight
/// arguments, which come between x and the bias; `tail` (arguments after `accumulate`, grid
/// z) is `(&[], 1)` but for a split `gemm_bf16_cp`. `k` must be a multiple of the stage.
#[allow(clippy::too_many_arguments)]
fn tc_gemm_launch(
    g: &Gpu,
    tile: (&str, usize, usize),
    weights: &[Arg],
    bias: Option<u64>,
    x: u64,
    y: u64,
    m: usize,
    n: usize,
    k: usize,
    accumulate: bool,
    (tail, z): (&[Arg], usize),
) -> Result<()> {
    let (kernel, rows, smem) = tile;
    ensure!(
        k.is_multiple_of(TC_BK),
        "GEMM inner size {k} is not a multiple of {TC_BK} (the tensor-core stage, one MXFP4 \
         block)"
    );
    let mut args = vec![Arg::Ptr(x)];
    args.extend_from_slice(weights);
    args.extend([
        opt(bias),
        Arg::Ptr(y),
        i(m)?,
        i(n)?,
        i(k)?,
        Arg::I32(accumulate as i32),
    ]);
    args.extend_from_slice(tail);
    g.launch(
        kernel,
        (u(n.div_ceil(TC_BN))?, u(m.div_ceil(rows))?, u(z)?),
        (256, 1, 1),
        u(smem)?,
        &args,
    )
}

/// A dense projection's weights on the device: bf16 `[rows, cols]` as in the checkpoint, or
/// MXFP4 quantized at load (blocks `[rows, cols/32, 16]` with their words in [`BF16_WORDS`],
/// scales `[rows, cols/32]` up to [`DENSE_MAX_SCALE`]).
#[derive(Debug, Clone, Copy)]
pub enum DenseW {
    /// bf16 weights.
    Bf16(u64),
    /// MXFP4 blocks and E8M0 scales.
    Mxfp4 {
        /// Packed E2M1 nibbles.
        blocks: u64,
        /// One scale byte per 32 weights.
        scales: u64,
    },
}

impl DenseW {
    /// Whether the weights are MXFP4.
    pub fn is_mxfp4(self) -> bool {
        matches!(self, DenseW::Mxfp4 { .. })
    }

    /// Columns each lane of the tensor-core GEMV loads as one span: 16 bf16 (two 16-byte
    /// words) or one 32-element MXFP4 block.
    pub fn tc_span(self) -> usize {
        if self.is_mxfp4() { 32 } else { 16 }
    }
}

/// Quantize `n` bf16 values (whole blocks of 32, `src` 16-byte aligned) to MXFP4 blocks
/// (`n / 2` bytes) and scales (`n / 32` bytes) with the quantizer of `engine::mxfp4`
/// (bit-identical); the number of non-finite inputs is added to the device u32 `nonfinite`.
pub fn mxfp4_quantize(
    g: &Gpu,
    src: u64,
    blocks: u64,
    scales: u64,
    n: usize,
    nonfinite: u64,
) -> Result<()> {
    ensure!(
        n.is_multiple_of(32),
        "{n} values are not whole MXFP4 blocks of 32"
    );
    let nblocks = n / 32;
    g.launch(
        "mxfp4_quantize_bf16",
        (u(nblocks.div_ceil(256).clamp(1, 65536))?, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::Ptr(src),
            Arg::Ptr(blocks),
            Arg::Ptr(scales),
            Arg::U64(nblocks as u64),
            Arg::Ptr(nonfinite),
        ],
    )
}

/// Static shared memory of `gemv_mxfp4` (the norm's reduction scratch), left out of what its
/// staged input may take.
const FP4_GEMV_STATIC_SMEM: usize = 128;

/// y[t] (+)= W x[t] + b with MXFP4 weights W [rows, cols] (`cols` a multiple of 32); with
/// `norm` the input is rmsnorm(x) · w, fused (the staged input is always in shared memory).
/// The decode GEMV of `--mxfp4-layers` (qkv, o with the residual add, lm_head).
pub fn gemv_mxfp4(
    g: &Gpu,
    blocks: u64,
    scales: u64,
    bias: Option<u64>,
    x: u64,
    y: u64,
    rows: usize,
    cols: usize,
    t: usize,
    accumulate: bool,
    norm: Option<Norm>,
) -> Result<()> {
    ensure!(
        cols.is_multiple_of(32),
        "MXFP4 GEMV input width {cols} is not a multiple of 32"
    );
    let smem = t.min(GEMV_TOKENS) * cols / 32 * STAGE_PAD * 4;
    ensure!(
        smem + FP4_GEMV_STATIC_SMEM <= g.max_shared(),
        "MXFP4 GEMV input width {cols}: the staged input ({smem} bytes) exceeds the device's \
         shared memory ({} bytes)",
        g.max_shared()
    );
    g.launch(
        "gemv_mxfp4",
        (u(rows.div_ceil(GEMV_ROWS))?, u(t.div_ceil(GEMV_TOKENS))?, 1),
        (256, 1, 1),
        u(smem)?,
        &[
            Arg::Ptr(blocks),
            Arg::Ptr(scales),
            opt(bias),
            Arg::Ptr(x),
            Arg::Ptr(y),
            i(rows)?,
            i(cols)?,
            i(t)?,
            Arg::I32(accumulate as i32),
            opt(norm.map(|n| n.w)),
            Arg::F32(norm.map_or(0.0, |n| n.eps)),
            opt(norm.map(|n| n.out)),
        ],
    )
}

/// Prefill GEMM on tensor cores with MXFP4 weights W [n, k] (dequantized to bf16 in shared
/// memory one stage at a time): y[m] (+)= W x[m] + b, x fp32 [m, k] rounded to bf16 for the
/// MMA, fp32 out [m, n]. `k` must be a multiple of 32.
pub fn gemm_mxfp4(
    g: &Gpu,
    blocks: u64,
    scales: u64,
    bias: Option<u64>,
    x: u64,
    y: u64,
    m: usize,
    n: usize,
    k: usize,
    accumulate: bool,
) -> Result<()> {
    tc_gemm_launch(
        g,
        ("gemm_mxfp4_tc", TC_BM, 0),
        &[Arg::Ptr(blocks), Arg::Ptr(scales)],
        bias,
        x,
        y,
        m,
        n,
        k,
        accumulate,
        (&[], 1),
    )
}

/// The decode GEMV of a dense projection in whichever format its weights are, on the path
/// `path` picks ([`dense_gemv_tc`], or [`gemv`]/[`gemv_mxfp4`]); a shape the
/// tensor-core kernel does not take runs on the SIMT one.
pub fn dense_gemv(
    g: &Gpu,
    path: DecodeGemv,
    w: DenseW,
    bias: Option<u64>,
    x: u64,
    y: u64,
    rows: usize,
    cols: usize,
    t: usize,
    accumulate: bool,
    norm: Option<Norm>,
) -> Result<()> {
    if path.dense_on_tensor_cores() && tc_gemv_fits(g, w, rows, cols, t) {
        return dense_gemv_tc(g, w, bias, x, y, rows, cols, t, accumulate, norm, None);
    }
    match w {
        DenseW::Bf16(p) => gemv(g, p, bias, x, y, rows, cols, t, accumulate, norm),
        DenseW::Mxfp4 { blocks, scales } => gemv_mxfp4(
            g, blocks, scales, bias, x, y, rows, cols, t, accumulate, norm,
        ),
    }
}

/// Block rows of `gemm_bf16_cp`.
const GCP_BM: usize = 128;
/// Shared-memory stages of `gemm_bf16_cp` (kernel constant `GCP_NS`).
const GCP_NS: usize = 4;
/// Dynamic shared bytes of `gemm_bf16_cp`: GCP_NS stages of A (GCP_BM rows) and B (TC_BN
/// rows), each row TC_BK bf16 plus 8 of padding.
const GCP_SMEM: usize = GCP_NS * (GCP_BM + TC_BN) * (TC_BK + 8) * 2;

/// out = bf16(x) for `elems` fp32 (a multiple of 4), rounded to nearest even.
pub fn rows_bf16(g: &Gpu, x: u64, out: u64, elems: usize) -> Result<()> {
    ensure!(
        elems.is_multiple_of(4),
        "rows_bf16 of {elems} elements: a multiple of 4 needed"
    );
    let n4 = elems / 4;
    g.launch(
        "rows_bf16",
        (u(n4.div_ceil(256).clamp(1, 4 * g.sms()))?, 1, 1),
        (256, 1, 1),
        0,
        &[Arg::Ptr(x), Arg::Ptr(out), Arg::U64(n4 as u64)],
    )
}

/// Device scratch for the partial sums of a split pass (fp32), and its size in floats.
#[derive(Debug, Clone, Copy)]
pub struct SplitScratch {
    /// Device address.
    pub ptr: u64,
    /// Floats it holds.
    pub floats: usize,
}

/// Most ways a split pass cuts its serial loop.
pub const SPLIT_MAX: usize = 16;
/// Fewest serial steps (K stages, key tiles) a split is left with.
pub const SPLIT_MIN_STEPS: usize = 8;

/// Environment switch of the split passes of few-row prefills (the dense GEMMs' K loop and
/// the attention's keys): `off` (the default) or `auto` (split where the grid alone leaves
/// SMs idle, [`split_count`]). A split sums in another order, and how many splits a pass
/// takes depends on all its rows, so under `auto` a prompt prefilled beside others is no
/// longer the same bits as alone (the selftest's one-pass check then fails by design). A
/// cached conversation's new turn of 38 tokens at depth 4 173 prefills in 33.6 ms against
/// 42.0 (docs/perf.md, run 155).
pub const PREFILL_SPLIT_ENV: &str = "MXTUNE_PREFILL_SPLIT";

/// Whether few-row prefill passes may split ([`PREFILL_SPLIT_ENV`]); a bad value is an error
/// naming it.
pub fn prefill_split_from_env() -> Result<bool> {
    env_choice(PREFILL_SPLIT_ENV, &[("off", false), ("auto", true)])
}

/// Ways to cut the serial loop of a launch of `blocks` blocks, each `steps` steps long, on
/// `sms` SMs, when a split's partial sums take `split_floats` of a scratch of `scratch_floats`:
/// as many as bring the grid to two blocks an SM, but none left with fewer than
/// [`SPLIT_MIN_STEPS`] steps, at most [`SPLIT_MAX`], and all within the scratch. 1: no split.
/// A pass of many rows (a grid that fills the GPU) never splits.
pub fn split_count(
    blocks: usize,
    steps: usize,
    sms: usize,
    split_floats: usize,
    scratch_floats: usize,
) -> usize {
    if steps == 0 {
        return 1;
    }
    let want = (2 * sms).div_ceil(blocks.max(1));
    let splits = want
        .min(steps / SPLIT_MIN_STEPS)
        .min(scratch_floats / split_floats.max(1))
        .clamp(1, SPLIT_MAX);
    // Even shares: no split left empty.
    steps.div_ceil(steps.div_ceil(splits))
}

/// The prefill GEMM of a dense projection in whichever format its weights are ([`gemm`] or
/// [`gemm_mxfp4`]); bf16 weights with a `scratch` of m·k bf16 run [`rows_bf16`] into it and
/// then `gemm_bf16_cp` (both operands by `cp.async`, 128-row tiles), the same bits as
/// [`gemm`]. With `split` a pass of few rows cuts its K loop ([`split_count`]) and
/// `gemm_split_reduce` adds the partial sums: the same products, summed in another order.
#[allow(clippy::too_many_arguments)]
pub fn dense_gemm(
    g: &Gpu,
    w: DenseW,
    bias: Option<u64>,
    x: u64,
    y: u64,
    m: usize,
    n: usize,
    k: usize,
    accumulate: bool,
    scratch: Option<u64>,
    split: Option<SplitScratch>,
) -> Result<()> {
    match w {
        DenseW::Bf16(p) => match scratch {
            Some(xb) => {
                rows_bf16(g, x, xb, m * k)?;
                let blocks = n.div_ceil(TC_BN) * m.div_ceil(GCP_BM);
                let stages = k / TC_BK;
                let splits = split.map_or(1, |sp| {
                    split_count(blocks, stages, g.sms(), m * n, sp.floats)
                });
                let per = stages.div_ceil(splits);
                let part = split.filter(|_| splits > 1).map_or(0, |sp| sp.ptr);
                tc_gemm_launch(
                    g,
                    ("gemm_bf16_cp", GCP_BM, GCP_SMEM),
                    &[Arg::Ptr(p)],
                    bias,
                    xb,
                    y,
                    m,
                    n,
                    k,
                    accumulate,
                    (&[Arg::Ptr(part), i(per)?], splits),
                )?;
                if splits == 1 {
                    return Ok(());
                }
                g.launch(
                    "gemm_split_reduce",
                    (u((m * n).div_ceil(256))?, 1, 1),
                    (256, 1, 1),
                    0,
                    &[
                        Arg::Ptr(part),
                        opt(bias),
                        Arg::Ptr(y),
                        i(m)?,
                        i(n)?,
                        i(splits)?,
                        Arg::I32(accumulate as i32),
                    ],
                )
            }
            None => gemm(g, p, bias, x, y, m, n, k, accumulate),
        },
        DenseW::Mxfp4 { blocks, scales } => {
            gemm_mxfp4(g, blocks, scales, bias, x, y, m, n, k, accumulate)
        }
    }
}

/// dst[i] = src[rows[i]] for `n` rows of `cols` fp32; `rows` device u32.
pub fn rows_gather(g: &Gpu, src: u64, rows: u64, dst: u64, cols: usize, n: usize) -> Result<()> {
    g.launch(
        "rows_gather",
        (u(cols.div_ceil(256))?, u(n)?, 1),
        (256, 1, 1),
        0,
        &[Arg::Ptr(src), Arg::Ptr(rows), Arg::Ptr(dst), i(cols)?],
    )
}

/// Device scratch of the grouped MoE: the entry permutation and the tile list.
#[derive(Debug, Clone, Copy)]
pub struct MoeGroups {
    /// Segment position → entry (`t · k + s`), `total` ints.
    pub perm: u64,
    /// (expert, first, end) per tile, 3 ints each, `max_tiles` of them.
    pub tiles: u64,
    /// Number of tiles written (one int).
    pub ntiles: u64,
    /// Which tile kernels multiply.
    pub kernels: GroupedKernels,
}

/// The tile kernels of the grouped MoE (`MXTUNE_PREFILL_MOE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupedKernels {
    /// `moe_gate_up_rb` / `moe_down_rb` (the default): raw MXFP4 bytes and bf16 activation
    /// rows by cp.async, the weights dequantized straight into mma's B fragments.
    Registers,
    /// `moe_gate_up_grouped` / `moe_down_grouped`: the weights dequantized into shared memory
    /// and read back with ldmatrix (the kernels before; for A/B timing).
    Shared,
}

/// Environment switch of the grouped MoE's tile kernels: `regs` (the default) or `smem`.
pub const PREFILL_MOE_ENV: &str = "MXTUNE_PREFILL_MOE";

impl GroupedKernels {
    /// From [`PREFILL_MOE_ENV`]; a bad value is an error naming it.
    pub fn from_env() -> Result<Self> {
        env_choice(
            PREFILL_MOE_ENV,
            &[("regs", Self::Registers), ("smem", Self::Shared)],
        )
    }
}

/// Upper bound of grouped-MoE tiles of `tile` for `total` entries over `experts` experts.
pub fn moe_max_tiles(total: usize, experts: usize, tile: MoeTile) -> usize {
    total.div_ceil(tile.rows()) + experts
}

/// The grouped MoE's (gate_up, down) kernels for a tile.
fn moe_grouped_kernels(tile: MoeTile, k: GroupedKernels) -> (&'static str, &'static str) {
    match (k, tile) {
        (GroupedKernels::Shared, MoeTile::T32x128 | MoeTile::T64x128) => {
            ("moe_gate_up_grouped", "moe_down_grouped")
        }
        (GroupedKernels::Shared, MoeTile::T128x128 | MoeTile::Auto) => {
            ("moe_gate_up_grouped_m128", "moe_down_grouped_m128")
        }
        (GroupedKernels::Registers, MoeTile::T32x128) => ("moe_gate_up_rb_m32", "moe_down_rb_m32"),
        (GroupedKernels::Registers, MoeTile::T64x128) => ("moe_gate_up_rb", "moe_down_rb"),
        (GroupedKernels::Registers, MoeTile::T128x128 | MoeTile::Auto) => {
            ("moe_gate_up_rb_m128", "moe_down_rb_m128")
        }
    }
}

/// A row length rounded up to the register-B tiles' 64-wide stages.
fn rb_row(n: usize) -> usize {
    n.div_ceil(64) * 64
}

/// Prefill MoE grouped by expert for `t` tokens on tiles of `tile` ([`MoeTile::Auto`] resolved
/// for these t·k entries, [`MoeTile::for_pass`]): x is the normalised input
/// [t, H], `act` scratch [t·k, I] fp32, `part` scratch [t·k, H] fp32; the weighted expert
/// outputs are added into y (or written with `accumulate` false). `groups.tiles` must hold
/// [`moe_max_tiles`]`(t·k, experts, tile)` entries. With [`GroupedKernels::Registers`] the same
/// scratch holds other things for a while: `part` first holds x as permuted bf16 rows
/// (`moe_act_bf16`, [t, H rounded up to 64]) and `act` the SwiGLU output the same way
/// ([t·k, I rounded up to 64] bf16); both fit in the fp32 sizes for every I, H ≥ 32.
pub fn moe_grouped(
    g: &Gpu,
    w: &MoeWeights,
    s: MoeShape,
    tile: MoeTile,
    experts: usize,
    x: u64,
    idx: u64,
    wts: u64,
    groups: &MoeGroups,
    act: u64,
    part: u64,
    y: u64,
    t: usize,
    accumulate: bool,
) -> Result<()> {
    s.check()?;
    let total = t * s.k;
    // The tile list was sized for `tile` as given (`Auto`: the 32-row count, the largest).
    // The shared-memory kernels have no 32-row tile: their smallest is 64.
    let tile = match (tile.for_pass(total, experts), groups.kernels) {
        (MoeTile::T32x128, GroupedKernels::Shared) => MoeTile::T64x128,
        (t, _) => t,
    };
    let tiles = moe_max_tiles(total, experts, tile);
    let (gate_up, down) = moe_grouped_kernels(tile, groups.kernels);
    // The tiles read the experts in either layout (their last argument).
    let lay = Arg::I32(i32::from(w.layout == ExpertLayout::F16));
    let regs = groups.kernels == GroupedKernels::Registers;
    let (hp, ip) = (rb_row(s.hidden), rb_row(s.inter));
    if regs && (hp > 2 * s.k * s.hidden || ip > 2 * s.inter) {
        anyhow::bail!(
            "grouped MoE: H={} I={} are too small for the register-B tiles' scratch \
             (set {PREFILL_MOE_ENV}=smem)",
            s.hidden,
            s.inter
        );
    }
    // The gate_up tile's activations: x itself, or its bf16 rows (in `part`).
    let gu_x = if regs {
        g.launch(
            "moe_act_bf16",
            (u((hp / 2).div_ceil(256))?, u(t)?, 1),
            (256, 1, 1),
            0,
            &[Arg::Ptr(x), Arg::Ptr(part), i(s.hidden)?, i(hp)?],
        )?;
        part
    } else {
        x
    };
    g.launch(
        "moe_group",
        (1, 1, 1),
        (1024, 1, 1),
        u(2 * experts * 4)?,
        &[
            Arg::Ptr(idx),
            i(total)?,
            i(experts)?,
            i(tile.rows())?,
            Arg::Ptr(groups.perm),
            Arg::Ptr(groups.tiles),
            Arg::Ptr(groups.ntiles),
        ],
    )?;
    g.launch(
        gate_up,
        (u((2 * s.inter).div_ceil(TC_BN))?, u(tiles)?, 1),
        (256, 1, 1),
        0,
        &[
            Arg::Ptr(w.gu_blocks),
            Arg::Ptr(w.gu_scales),
            Arg::Ptr(w.gu_bias),
            Arg::Ptr(gu_x),
            Arg::Ptr(groups.perm),
            Arg::Ptr(groups.tiles),
            Arg::Ptr(groups.ntiles),
            Arg::Ptr(act),
            i(s.inter)?,
            i(s.hidden)?,
            i(s.k)?,
            Arg::F32(s.limit),
            Arg::F32(s.alpha),
            lay,
        ],
    )?;
    g.launch(
        down,
        (u(s.hidden.div_ceil(TC_BN))?, u(tiles)?, 1),
        (256, 1, 1),
        0,
        &[
            Arg::Ptr(w.dn_blocks),
            Arg::Ptr(w.dn_scales),
            Arg::Ptr(w.dn_bias),
            Arg::Ptr(act),
            Arg::Ptr(wts),
            Arg::Ptr(groups.perm),
            Arg::Ptr(groups.tiles),
            Arg::Ptr(groups.ntiles),
            Arg::Ptr(part),
            i(s.hidden)?,
            i(s.inter)?,
            lay,
        ],
    )?;
    moe_combine(g, part, y, s.hidden, s.k, t, accumulate)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gpt-oss's attention geometry (both sizes): 64 query heads, 8 KV heads of 64 dims.
    const GPT_OSS_ATTN: AttnShape = AttnShape {
        hq: 64,
        hkv: 8,
        d: 64,
    };

    /// The streamed matrices' units of one tile, as the plans below were written for.
    const TS: TcgStream = TcgStream::Tiles;

    /// The plan of a bf16 matrix in passes of 8 on `slots`, the K split from
    /// [`TCG_SPLIT_FROM`] tokens where `split`.
    fn bf16_plan(tiles: usize, t: usize, slots: [usize; 2], split: bool) -> TcgPlan {
        let from = split.then_some(TCG_SPLIT_FROM);
        tc_gemv_plan(tiles, t, 64, 8, true, TS, slots, from, None)
    }

    /// gpt-oss's expert shape (both sizes), the tests' usual MoE.
    const GPT_OSS_MOE: MoeShape = MoeShape {
        hidden: 2880,
        inter: 2880,
        k: 4,
        limit: 7.0,
        alpha: 1.702,
    };

    #[test]
    fn word_layouts_decode_every_word_to_its_elements_times_a_power_of_two() {
        // Each stored bit is a function of the standard word's bits: a bijection on words
        // (distinct masks of full rank), checked on a spread of words and the corners.
        let mut x = 0x9e37_79b9u32;
        let mut words = vec![0u32, u32::MAX, 0x8888_8888, 0x7777_7777, 1, 0x8000_0000];
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            words.push(x);
        }
        // Each half's value as f64: fp16 pairs hold the values times 2^-14, bf16 times 2^-126.
        let f16 = |h: u16| half::f16::from_bits(h).to_f64() * 16384.0;
        let bf16 = |h: u16| half::bf16::from_bits(h).to_f64() * 2f64.powi(126);
        for (layout, value) in [
            (F16_WORDS, &f16 as &dyn Fn(u16) -> f64),
            (BF16_WORDS, &bf16),
        ] {
            let masks = layout.masks().unwrap();
            for &w in &words {
                let stored = word_layout_encode(&masks, w);
                let pairs = layout.decode(stored);
                assert_eq!(
                    pairs,
                    layout.pairs_of_standard(w),
                    "{} {w:#010x}",
                    layout.name
                );
                for (j, p) in pairs.iter().enumerate() {
                    for h in 0..2 {
                        let nib = (w >> (8 * j + 4 * h)) & 15;
                        let v = value((p >> (16 * h)) as u16);
                        let want = crate::engine::cuda::reference::FP4[nib as usize];
                        assert_eq!(
                            v,
                            want,
                            "{} element {} of {w:#010x}",
                            layout.name,
                            2 * j + h
                        );
                        assert_eq!(v.is_sign_negative(), nib & 8 != 0);
                    }
                }
            }
            // Distinct words stay distinct (the transform loses nothing).
            let mut enc: Vec<u32> = words
                .iter()
                .map(|&w| word_layout_encode(&masks, w))
                .collect();
            let mut src = words.clone();
            enc.sort_unstable();
            enc.dedup();
            src.sort_unstable();
            src.dedup();
            assert_eq!(enc.len(), src.len(), "{}", layout.name);
        }
    }

    #[test]
    fn word_layouts_are_the_kernels_constants() {
        // The masks and rotations the kernels' decodes (`fp4l_to_f16x2`, `fp4b_to_bf16x2`) are
        // written with, as common.cuh spells them.
        let common = include_str!("../../../engine-kernels/common.cuh");
        for (layout, name) in [(F16_WORDS, "F16L_MASK"), (BF16_WORDS, "BF16L_MASK")] {
            let define = format!("#define {name} {:#010X}u", layout.mask()).replace("0X", "0x");
            assert!(common.contains(&define), "{define}");
            let [(a, b1), (a2, b2), (a3, b3)] = layout.rotations;
            assert!(a == a2 && a == a3, "{}: one shared rotation", layout.name);
            let call = format!("fp4_rot_pairs<{name}, {a}, {b1}, {b2}, {b3}>(w, p)");
            assert!(common.contains(&call), "{call}");
        }
        assert_eq!(F16_WORDS.mask(), 0x8E00_8E00);
        assert_eq!(BF16_WORDS.mask(), 0x81C0_81C0);
    }

    #[test]
    fn a_layout_whose_pairs_miss_an_element_bit_is_refused() {
        // Rotations that send two element bits to the same place: the map is singular.
        let bad = WordLayout {
            rotations: [(2, 6), (2, 6), (2, 12)],
            ..BF16_WORDS
        };
        let e = bad.masks().unwrap_err().to_string();
        assert!(e.contains("bf16 layout") && e.contains("singular"), "{e}");
    }

    #[test]
    fn decode_moe_codes_name_their_expert_layout() {
        assert_eq!(ExpertLayout::for_codes(MoeCodes::F16), ExpertLayout::F16);
        for c in [MoeCodes::F32, MoeCodes::Q8, MoeCodes::Fp8] {
            assert_eq!(ExpertLayout::for_codes(c), ExpertLayout::Standard);
        }
        let e = ExpertLayout::Standard
            .expect(ExpertLayout::F16, "the fp16-dot kernels")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("F16 layout") && e.contains("Standard layout"),
            "{e}"
        );
    }

    /// A few-row pass splits until the grid holds two blocks an SM, never into shares under
    /// the fewest steps nor past the scratch, with no empty share; a full grid never splits.
    #[test]
    fn split_count_fills_an_idle_gpu_and_only_that() {
        let big = usize::MAX;
        // gpt-oss-120b's qkv for 38 rows on an H100: 40 blocks of 90 K stages.
        assert_eq!(split_count(40, 90, 132, 38 * 5120, big), 7);
        // o: 23 blocks of 128 stages.
        assert_eq!(split_count(23, 128, 132, 38 * 2880, big), 12);
        // One block, 90 stages: at most 90 / 8 = 11 shares, made even (10 of 9 stages).
        assert_eq!(split_count(1, 90, 132, 1, big), 10);
        // A full grid, too few steps, or no room: one share.
        assert_eq!(split_count(264, 90, 132, 1, big), 1);
        assert_eq!(split_count(40, 7, 132, 1, big), 1);
        assert_eq!(split_count(40, 90, 132, 1000, 1999), 1);
        assert_eq!(split_count(40, 90, 132, 1000, 3000), 3);
        // Never past SPLIT_MAX; no steps, no split.
        assert_eq!(split_count(1, 10_000, 132, 1, big), SPLIT_MAX);
        assert_eq!(split_count(1, 0, 132, 1, big), 1);
        assert_eq!(split_count(0, 90, 0, 0, 0), 1);
        // Attention: 3 tiles of 8 KV heads over 4 173 keys (66 key tiles).
        let s = GPT_OSS_ATTN;
        let sp = SplitScratch {
            ptr: 0,
            floats: big,
        };
        assert_eq!(attn_splits(s, 132, 38, 3, 4173, Some(sp)), 8);
        assert_eq!(attn_splits(s, 132, 38, 3, 4173, None), 1);
        assert_eq!(attn_splits(s, 132, 38, 3, 144, Some(sp)), 1);
    }

    /// `auto` takes the GEMV router for few rows and `router_rows` for many; the default
    /// (`rows`) always `router_rows`; the default split is off.
    #[test]
    fn the_prefill_router_follows_the_pass_size() {
        let r = PrefillRouter::Auto;
        assert!(!r.rows_kernel(38) && !r.rows_kernel(ROUTER_ROWS_FROM - 1));
        assert!(r.rows_kernel(ROUTER_ROWS_FROM) && r.rows_kernel(2048));
        assert!(PrefillRouter::Rows.rows_kernel(1) && !PrefillRouter::Gemv.rows_kernel(4096));
        let routers = [("rows", PrefillRouter::Rows), ("auto", PrefillRouter::Auto)];
        assert_eq!(
            choice(PREFILL_ROUTER_ENV, "", &routers).unwrap(),
            PrefillRouter::Rows
        );
        assert!(!choice(PREFILL_SPLIT_ENV, "", &[("off", false), ("auto", true)]).unwrap());
        let e = choice(PREFILL_ROUTER_ENV, "fast", &routers)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("MXTUNE_PREFILL_ROUTER=fast") && e.contains("rows, auto"),
            "{e}"
        );
    }

    /// The tensor-core GEMV's grid: a block per row tile for the short matrices, the resident
    /// slots for a long one, which then also takes 16 tokens in one pass.
    /// The router's rows per block: one at small batches, more as the token groups multiply
    /// the grid, never past the kernel's most or below one; a forced count is kept in range.
    #[test]
    fn wide_rows_per_block_grows_with_the_token_groups() {
        let rpb = |rows, t| wide_rows_per_block(rows, t, 132, None);
        // gpt-oss-120b's router (128 experts) on an H100 or H200: one row a block up to
        // batch 8 (256 blocks for 264 slots of two), two from 9 (384 and 512 blocks).
        assert_eq!(
            [1, 4, 5, 8, 9, 12, 16].map(|t| rpb(128, t)),
            [1, 1, 1, 1, 2, 2, 2]
        );
        // A GB10's 48 SMs (96 slots of two): two rows a block from batch 1 (the previous rule
        // took 4 at every batch there; neither measured).
        assert_eq!(
            [1, 4, 8, 16].map(|t| wide_rows_per_block(128, t, 48, None)),
            [2, 2, 3, 4]
        );
        // gpt-oss-20b's (32 experts): the grid is small already.
        assert_eq!([1, 8, 16].map(|t| rpb(32, t)), [1, 1, 1]);
        assert_eq!(rpb(2047, 16), GEMV_WIDE_R);
        assert_eq!(wide_rows_per_block(128, 16, 0, None), GEMV_WIDE_R);
        assert_eq!(wide_rows_per_block(128, 16, 132, Some(2)), 2);
        assert_eq!(wide_rows_per_block(128, 1, 132, Some(9)), GEMV_WIDE_R);
    }

    #[test]
    fn tc_gemv_plan_streams_long_matrices_on_the_slots() {
        // An H100's slots at K = 2880: 3 blocks per SM of the 8-token kernel, 2 of the 16-token.
        let slots = [3 * 132, 2 * 132];
        let plan = |tiles, t, pass, persist| {
            tc_gemv_plan(tiles, t, 64, pass, persist, TS, slots, None, Some(1))
        };
        let tp = |per_pass, grid_x| TcgPlan {
            per_pass,
            grid_x,
            ksplit: 1,
            tiles_per_block: 1,
        };
        // qkv (320 tiles), o (180): a block per tile; two passes of 8 above 8 tokens.
        for t in [1, 4, 8, 9, 16] {
            assert_eq!(plan(320, t, 8, true), tp(8, 320), "qkv, t={t}");
            assert_eq!(plan(180, t, 8, true), tp(8, 180), "o, t={t}");
        }
        // The lm_head (201 088 rows): the slots from 2 tokens, one pass of up to 16 tokens; at
        // one token a bf16 block stages an eighth of its weight bytes: a block per tile.
        assert_eq!(plan(12_568, 1, 8, true), tp(8, 12_568));
        assert_eq!(plan(12_568, 2, 8, true), tp(8, 396));
        assert_eq!(plan(12_568, 8, 8, true), tp(8, 396));
        // MXFP4 (17 bytes per 32 weights) from one token.
        assert_eq!(
            tc_gemv_plan(12_568, 1, 17, 8, true, TS, slots, None, None),
            tp(8, 396)
        );
        assert_eq!(plan(12_568, 9, 8, true), tp(16, 264));
        assert_eq!(plan(12_568, 16, 8, true), tp(16, 264));
        // Off: as before, a block per tile, 8 tokens a pass unless 16 are asked for.
        assert_eq!(plan(12_568, 16, 8, false), tp(8, 12_568));
        assert_eq!(plan(12_568, 16, 16, false), tp(16, 12_568));
        assert_eq!(plan(320, 16, 16, true), tp(16, 320));
        // Exactly four waves is long; just under is not.
        assert_eq!(plan(4 * 396, 2, 8, true), tp(8, 396));
        assert_eq!(plan(4 * 396 - 1, 2, 8, true), tp(8, 4 * 396 - 1));
        // A long matrix in two passes (asked for 8): half the slots each.
        let two = tc_gemv_plan(4000, 16, 64, 8, true, TS, [3 * 132, 4000], None, None);
        assert_eq!(two, tp(8, 198));
        // No slot reported (a device that fits none): one block, never zero.
        assert_eq!(
            tc_gemv_plan(100, 2, 64, 8, true, TS, [0, 0], None, None),
            tp(8, 1)
        );
        assert_eq!(
            tc_gemv_plan(0, 2, 64, 8, true, TS, slots, None, None),
            tp(8, 0)
        );
        // The K split: o (180 tiles) up to 8 tokens, not in two passes (720 blocks > 396), not
        // qkv (640 > 396), not a streamed matrix, never where the caller rules it out.
        let split = |tiles, t, ok| bf16_plan(tiles, t, slots, ok).ksplit;
        // From 4 tokens (at one, the combine cost more than it gained).
        // In two passes o takes 2 row tiles a block: 90 units, 360 blocks split.
        assert_eq!(
            [1, 3, 4, 8, 9, 16].map(|t| split(180, t, true)),
            [1, 1, 2, 2, 2, 2]
        );
        assert_eq!(split(198, 4, true), 2);
        assert_eq!(split(199, 4, true), 1);
        assert_eq!(split(320, 4, true), 1);
        assert_eq!(split(12_568, 4, true), 1);
        assert_eq!(split(180, 8, false), 1);
    }

    #[test]
    fn tc_gemv_plan_streams_units_of_eight_tiles_where_each_block_gets_three() {
        let slots = [3 * 132, 2 * 132];
        let plan = |tiles, t, bytes32, stream, pref| {
            let p = tc_gemv_plan(tiles, t, bytes32, 8, true, stream, slots, None, pref);
            (p.per_pass, p.grid_x, p.tiles_per_block)
        };
        let u = TcgStream::Units;
        // gpt-oss's lm_head (12 568 tiles: 1571 units of 8) on 396 slots: ~4 units a block,
        // bf16 or MXFP4, at every token count (bf16 at one token streamed too).
        for bytes32 in [17, 64] {
            for t in [1, 2, 8] {
                assert_eq!(
                    plan(12_568, t, bytes32, u, None),
                    (8, 396, TCG_STREAM_TILES),
                    "t={t}"
                );
            }
            // 9-16 tokens: one pass on the 16-token kernel's 264 slots; more: passes of 16.
            assert_eq!(
                plan(12_568, 16, bytes32, u, None),
                (16, 264, TCG_STREAM_TILES)
            );
            assert_eq!(
                plan(12_568, 40, bytes32, u, None),
                (16, 88, TCG_STREAM_TILES)
            );
        }
        // Fewer than three units a slot: units of one tile, and bf16 at one token a block a
        // tile, as `Tiles` has them.
        let short = 8 * 3 * 396 - 8;
        assert_eq!(plan(short, 2, 64, u, None), (8, 396, 1));
        assert_eq!(plan(short, 1, 64, u, None), (8, short, 1));
        assert_eq!(plan(short + 8, 1, 64, u, None), (8, 396, TCG_STREAM_TILES));
        // Tiles: as before.
        assert_eq!(plan(12_568, 8, 64, TcgStream::Tiles, None), (8, 396, 1));
        assert_eq!(plan(12_568, 1, 64, TcgStream::Tiles, None), (8, 12_568, 1));
        // Fixed by the caller (the selftest), whatever the rule says.
        assert_eq!(
            plan(4 * 396, 2, 64, TcgStream::Tiles, Some(TCG_STREAM_TILES)),
            (8, 396, TCG_STREAM_TILES)
        );
        assert_eq!(plan(12_568, 8, 64, u, Some(1)), (8, 396, 1));
        // Not long (qkv): the rule does not apply.
        assert_eq!(plan(320, 1, 17, u, None), (8, 320, 1));
        assert_eq!(
            tc_gemv_kernel("fp4", 8, TCG_STREAM_TILES),
            "gemv_tc_fp4_t8_r128"
        );
        assert_eq!(
            tc_gemv_kernel("bf16", 16, TCG_STREAM_TILES),
            "gemv_tc_bf16_t16_r128"
        );
    }

    #[test]
    fn tc_gemv_wide_plan_fills_one_wave_with_its_k_split() {
        // 132 SMs of 2 blocks; the scratch and the chunks bound the split.
        let slots = |_ks: usize| -> Result<usize> { Ok(264) };
        let plan = |tiles, nchunks, rows, t, norm_out, fixed| {
            tc_gemv_wide_plan(tiles, nchunks, rows, t, norm_out, fixed, slots)
                .unwrap()
                .map(|p| (p.grid_x, p.ksplit))
        };
        // gpt-oss: qkv (5120 x 2880, 45 bf16 chunks) 80 units x 3, o (2880 x 4096) 45 x 5;
        // all-MXFP4 chunks of 256 columns: 12 and 16.
        assert_eq!(plan(320, 45, 5120, 16, false, None), Some((80, 3)));
        assert_eq!(plan(180, 64, 2880, 16, false, None), Some((45, 5)));
        assert_eq!(plan(320, 12, 5120, 9, false, None), Some((80, 3)));
        // Only at 9-16 tokens.
        for t in [1, 8, 17, 32] {
            assert_eq!(plan(320, 45, 5120, t, false, None), None, "t={t}");
        }
        // The norm's output written: no split.
        assert_eq!(plan(320, 45, 5120, 16, true, None), Some((80, 1)));
        // Every split's last block has chunks: 2 chunks split at most 2 ways, 12 at most 6.
        assert_eq!(plan(3, 2, 37, 9, false, None), Some((1, 2)));
        assert_eq!(plan(63, 12, 1001, 12, false, None), Some((16, 6)));
        // The scratch bounds it: 16 tokens of 16 000 rows split at most 2 ways, of 16 384 not
        // at all (the squares take a float a token and split past the partial sums).
        assert_eq!(plan(8, 45, 16_000, 16, false, None), Some((2, 2)));
        assert_eq!(plan(8, 45, 16_384, 16, false, None), Some((2, 1)));
        // Fixed: that split alone, where it fits; none when no split fits one wave.
        assert_eq!(plan(320, 45, 5120, 16, false, Some(2)), Some((80, 2)));
        assert_eq!(plan(320, 45, 5120, 16, false, Some(4)), None);
        assert_eq!(plan(4 * 265, 45, 16_960, 16, false, None), None);
        // No slot reported (a device that fits none): no wide plan.
        let none = tc_gemv_wide_plan(320, 45, 5120, 16, false, None, |_| Ok(0)).unwrap();
        assert_eq!(none, None);
        assert_eq!(
            [("bf16", 16, 4), ("fp4", 16, 4)].map(|(f, p, n)| tc_gemv_kernel(f, p, n)),
            ["gemv_tc_bf16_t16_r64", "gemv_tc_fp4_t16_r64"]
        );
        // The split's staging width: its share of the chunks, never past the row.
        let p = |ks| TcgPlan {
            per_pass: 16,
            grid_x: 80,
            ksplit: ks,
            tiles_per_block: TCG_WIDE_TILES,
        };
        assert_eq!(tc_plan_width(&p(3), 2880, 64), 960);
        assert_eq!(tc_plan_width(&p(1), 2880, 64), 2880);
        assert_eq!(tc_plan_width(&p(3), 2880, 256), 1024);
        assert_eq!(tc_plan_width(&p(2), 96, 64), 64);
        assert_eq!(tc_plan_width(&p(8), 100, 64), 64);
    }

    #[test]
    fn tc_gemv_plan_takes_two_row_tiles_a_block_in_two_passes() {
        let slots = [3 * 132, 2 * 132];
        let plan = |tiles, t, split| bf16_plan(tiles, t, slots, split);
        let p = |grid_x, ksplit, tiles_per_block| TcgPlan {
            per_pass: 8,
            grid_x,
            ksplit,
            tiles_per_block,
        };
        // One pass: a tile a block (2 lost there, docs/perf.md run 139).
        for t in [1, 4, 8] {
            assert_eq!(plan(320, t, false), p(320, 1, 1), "qkv, t={t}");
        }
        // Two or three passes: two tiles a block, a partial last unit rounded up.
        for t in [9, 12, 16, 20] {
            assert_eq!(plan(320, t, false), p(160, 1, 2), "qkv, t={t}");
            assert_eq!(plan(321, t, false), p(161, 1, 2), "321 tiles, t={t}");
        }
        // o splits its 90 units' K in two passes (360 blocks fit 396 slots); qkv does not.
        assert_eq!(plan(180, 16, true), p(90, 2, 2));
        assert_eq!(plan(320, 16, true), p(160, 1, 2));
        // A streamed matrix and the 16-token kernel keep a tile a block.
        assert_eq!(plan(12_568, 16, false).tiles_per_block, 1);
        let sixteen = tc_gemv_plan(320, 16, 64, 16, true, TS, slots, None, None);
        assert_eq!((sixteen.per_pass, sixteen.tiles_per_block), (16, 1));
        // Asked for: one tile a block in two passes, two in one.
        let fixed = |t, n| tc_gemv_plan(320, t, 64, 8, true, TS, slots, None, Some(n));
        assert_eq!(fixed(16, 1), p(320, 1, 1));
        assert_eq!(fixed(4, 2), p(160, 1, 2));
        assert_eq!(
            [("bf16", 1), ("bf16", 2), ("fp4", 1), ("fp4", 2)]
                .map(|(f, n)| tc_gemv_kernel(f, 8, n)),
            [
                "gemv_tc_bf16_t8",
                "gemv_tc_bf16_t8_r32",
                "gemv_tc_fp4_t8",
                "gemv_tc_fp4_t8_r32"
            ]
        );
        let table: Vec<&str> = crate::engine::cuda::compile::KERNEL_FILES
            .iter()
            .flat_map(|f| f.entries.iter().copied())
            .collect();
        assert!(
            table.contains(&TCG_PLAIN_ENTRY),
            "{TCG_PLAIN_ENTRY} not compiled"
        );
    }

    /// The tensor-core prefill attention's tiles: at most 16 rows, cut where the sequence (KV
    /// offset) changes or the positions stop being consecutive.
    #[test]
    fn attention_kernel_words_and_the_tensor_core_stage() {
        let pick = |v: &str| choice(ATTN_KERNEL_ENV, v, ATTN_KERNEL_CHOICES);
        assert_eq!(pick("").unwrap(), None);
        assert_eq!(pick("gqa-tc").unwrap(), Some(AttnKernel::GqaTc));
        assert_eq!(pick("gqa").unwrap(), Some(AttnKernel::Gqa));
        let e = pick("tc").unwrap_err().to_string();
        assert!(e.contains("MXTUNE_ATTN=tc") && e.contains("gqa-tc"), "{e}");
        // Two buffers of 32 K and 32 V rows per warp (fp8: V only), rows padded by 16 bytes.
        let sh = |d| AttnShape { hq: 64, hkv: 8, d };
        assert_eq!(gqa_tc_smem(sh(64), KvDtype::Bf16, 4), 4 * 4 * 32 * 144);
        assert_eq!(gqa_tc_smem(sh(32), KvDtype::Bf16, 4), 4 * 4 * 32 * 80);
        assert_eq!(gqa_tc_smem(sh(64), KvDtype::Fp8, 4), 4 * 2 * 32 * 80);
        assert_eq!(gqa_tc_smem(sh(64), KvDtype::Fp8, 8), 8 * 2 * 32 * 80);
        assert_eq!(AttnKernel::GqaTc.min_split(), AttnKernel::Gqa.min_split());
    }

    #[test]
    fn decode_attention_splits_grow_with_the_root_of_the_context_up_to_the_cap() {
        let s = GPT_OSS_ATTN;
        let t = AttnTuning::default();
        let n = |keys| t.splits(AttnKernel::GqaTc, s, 132, keys, ATTN_MAX_SPLITS);
        // One per min_split keys while that is fewer, then one per 4 √keys, then the cap:
        // 2 blocks an SM of 132 over 8 KV heads = 33.
        assert_eq!(t.split_cap(AttnKernel::GqaTc, s, 132), Some(33));
        assert_eq!((n(1), n(128), n(129), n(300)), (1, 1, 2, 3));
        assert_eq!((n(1024), n(4096), n(16384), n(32768)), (8, 16, 32, 33));
        // The CUDA-core kernels (small blocks, many an SM) keep the rule by length.
        for k in [AttnKernel::PerHead, AttnKernel::Gqa] {
            assert_eq!(t.split_cap(k, s, 48), None);
            let by_len = (4096 / t.min_split(k)).min(ATTN_MAX_SPLITS);
            assert_eq!(t.splits(k, s, 48, 4096, ATTN_MAX_SPLITS), by_len);
        }
        // The scratch bounds every rule.
        assert_eq!(t.splits(AttnKernel::GqaTc, s, 132, 32768, 4), 4);
        // No bound: the rule by context length alone.
        let plain = AttnTuning {
            split_blocks_per_sm: 0,
            ..AttnTuning::default()
        };
        let m = |keys| plain.splits(AttnKernel::GqaTc, s, 132, keys, ATTN_MAX_SPLITS);
        assert_eq!((m(1024), m(4096), m(32768)), (8, 32, ATTN_MAX_SPLITS));
        assert_eq!(plain.split_cap(AttnKernel::GqaTc, s, 132), None);
    }

    #[test]
    fn eight_warp_attention_for_one_row_of_an_fp8_cache_from_its_split_length() {
        let s = GPT_OSS_ATTN;
        let t = AttnTuning::default();
        assert_eq!(t.wide_from, 512);
        let v = |kv, keys, nsplit, rows| t.tc_variant(kv, s, 132, keys, nsplit, rows);
        let wide = |kv, keys, nsplit| v(kv, keys, nsplit, 1).wide;
        // One row: 32768 keys in 33 splits (993 a split, 264 blocks: the cap) wide; 4096 in 16
        // (256 a split) not.
        assert!(wide(KvDtype::Fp8, 32768, 33));
        assert!(!wide(KvDtype::Fp8, 4096, 16));
        assert!(wide(KvDtype::Fp8, 512, 1) && !wide(KvDtype::Fp8, 1022, 2));
        // An engine of two rows a step: 528 blocks at 33 splits, past the cap.
        assert!(!v(KvDtype::Fp8, 32768, 33, 2).wide);
        assert!(v(KvDtype::Fp8, 16384, 16, 2).wide);
        // A bf16 cache has no eight-warp entry; 0 or no cap turns it off.
        assert!(!wide(KvDtype::Bf16, 32768, 33));
        for off in [
            AttnTuning {
                wide_from: 0,
                ..AttnTuning::default()
            },
            AttnTuning {
                split_blocks_per_sm: 0,
                ..AttnTuning::default()
            },
        ] {
            assert!(!off.tc_variant(KvDtype::Fp8, s, 132, 32768, 33, 1).wide);
        }
        assert_eq!(v(KvDtype::Fp8, 32768, 33, 1).warps(), 8);
        assert_eq!(v(KvDtype::Fp8, 32768, 33, 2).warps(), 4);
    }

    #[test]
    fn tensor_core_attention_entries_by_shape_are_in_the_dispatch_table() {
        let sh = |hq, hkv, d| AttnShape { hq, hkv, d };
        let v = |fixed_dim, wide| TcVariant { fixed_dim, wide };
        let e = gqa_tc_entry;
        let (f8, b16) = (KvDtype::Fp8, KvDtype::Bf16);
        // Each entry's name after `attn_split_gqa_tc`.
        for (kv, s, variant, want) in [
            // gpt-oss (8 query heads a KV head, head dim 64): the `_g8` entries.
            (f8, sh(64, 8, 64), v(true, true), "_fp8_d64_w8_g8"),
            (f8, sh(64, 8, 64), v(true, false), "_fp8_d64_g8"),
            (b16, sh(64, 8, 64), v(true, true), "_d64_g8"),
            // 16 heads a KV head: the tile's every row live.
            (f8, sh(32, 2, 64), v(true, false), "_fp8_d64"),
            (b16, sh(32, 2, 64), v(true, false), "_d64"),
            // Head dim 32, or the fixed entries off: the run-time entries.
            (f8, sh(8, 2, 32), v(true, true), "_fp8_w8"),
            (b16, sh(64, 8, 64), v(false, false), ""),
        ] {
            let got = e(kv, s, variant);
            assert_eq!(
                got,
                format!("attn_split_gqa_tc{want}"),
                "{kv:?} {s:?} {variant:?}"
            );
        }
        let table: Vec<&str> = crate::engine::cuda::compile::KERNEL_FILES
            .iter()
            .flat_map(|f| f.entries.iter().copied())
            .collect();
        for kv in [KvDtype::Bf16, KvDtype::Fp8] {
            for s in [sh(64, 8, 64), sh(32, 2, 64), sh(8, 2, 32)] {
                for (fixed_dim, wide) in
                    [(true, true), (true, false), (false, true), (false, false)]
                {
                    let name = e(kv, s, v(fixed_dim, wide));
                    assert!(table.contains(&name), "{name} is not in the dispatch table");
                }
            }
        }
    }

    #[test]
    fn prefill_attention_tiles_are_runs_of_one_sequence() {
        // 20 rows of one sequence, 3 of another, then a gap in positions.
        let pos: Vec<u32> = (100..120).chain(0..3).chain([7, 9]).collect();
        let offs: Vec<u64> = [0u64; 20]
            .into_iter()
            .chain([5000; 3])
            .chain([5000; 2])
            .collect();
        assert_eq!(
            super::prefill_attn_tiles(&pos, &offs),
            vec![0, 16, 16, 4, 20, 3, 23, 1, 24, 1]
        );
        assert!(super::prefill_attn_tiles(&[], &[]).is_empty());
    }

    /// Every activation format's decode MoE kernels are in the dispatch table, and the 8-bit
    /// staging takes 52 bytes per group of 32 (a quarter of the shared-memory reads of fp32).
    #[test]
    fn moe_gemv_kernels_per_activation_format() {
        let entries: Vec<&str> = super::super::compile::KERNEL_FILES
            .iter()
            .flat_map(|f| f.entries.iter().copied())
            .collect();
        for codes in [MoeCodes::F32, MoeCodes::F16, MoeCodes::Q8, MoeCodes::Fp8] {
            for (down, slots) in [(false, false), (true, false), (false, true), (true, true)] {
                let (name, smem) = moe_gemv_kernel(down, codes, 2880, slots);
                assert!(entries.contains(&name), "{name} not in KERNEL_FILES");
                let full = codes == MoeCodes::F16 && slots;
                assert_eq!(name.ends_with("_slots_full"), full, "{name}");
                assert_eq!(name.ends_with("_slots"), slots && !full, "{name}");
                let want = match codes {
                    MoeCodes::F32 => 90 * 144,
                    MoeCodes::F16 => 90 * 84,
                    MoeCodes::Q8 | MoeCodes::Fp8 => 90 * 52,
                };
                assert_eq!(smem, want, "{name}");
            }
        }
        assert_eq!(
            moe_gemv_kernel(false, ActFormat::Bf16.into(), 96, false).0,
            "moe_gate_up_swiglu"
        );
        assert_eq!(
            moe_gemv_kernel(false, MoeCodes::of(ActFormat::Bf16, MoeDot::F16), 96, true).0,
            "moe_gate_up_swiglu_h2_slots"
        );
        assert_eq!(
            moe_gemv_kernel(true, MoeCodes::of(ActFormat::Q8, MoeDot::F16), 96, false).0,
            "moe_down_q8"
        );
        // The full-row entries take rows of exactly 3 items of 32 blocks (2049-3072 inputs).
        let f16 = MoeCodes::of(ActFormat::Bf16, MoeDot::F16);
        for (n, name) in [
            (2048, "moe_down_h2_slots"),
            (2080, "moe_down_h2_slots_full"),
            (3072, "moe_down_h2_slots_full"),
            (3104, "moe_down_h2_slots"),
        ] {
            assert_eq!(moe_gemv_kernel(true, f16, n, true).0, name, "{n}");
        }
    }

    #[test]
    fn moe_f16_split_per_batch_and_from_its_variable() {
        let s = GPT_OSS_MOE;
        // 120b on the H100 (132 SMs, 3 blocks each): at batch 1, 4 experts, gate_up's 5760
        // rows need 32-row blocks (720 of them) and down's 2880 rows 16-row blocks; at batch
        // 16 the 64 experts a group can route to fill the GPU with 128-row blocks.
        let b1 = MoeF16Split::for_batch(132, s, 128, 1);
        assert_eq!((b1.gate_up, b1.down), (4, 8));
        let b16 = MoeF16Split::for_batch(132, s, 128, 16);
        assert_eq!((b16.gate_up, b16.down), (1, 1));
        // A model of 4 experts caps the group's distinct experts at 4 whatever the batch.
        assert_eq!(MoeF16Split::for_batch(132, s, 4, 16), b1);
        assert_eq!(
            MoeF16Split::parse("2").unwrap(),
            MoeF16Split {
                gate_up: 2,
                down: 2
            }
        );
        assert_eq!(
            MoeF16Split::parse("8/1").unwrap(),
            MoeF16Split {
                gate_up: 8,
                down: 1
            }
        );
        for bad in ["3", "0", "16", "2/", "x", "4/5"] {
            let e = MoeF16Split::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("MXTUNE_MOE16_KS") && e.contains("1, 2, 4 or 8"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn moe_ranges_fill_gate_ups_waves() {
        let s = GPT_OSS_MOE;
        let r = |sms, units, t, down, slots| moe_ranges(sms, s, units, t, down, slots).unwrap();
        // gpt-oss-120b at batch 1 (units 6/3) on 132 SMs: gate_up takes the wave's 264 / 4
        // pairs = 66 ranges (its 2880 units 5 or 6 a warp), down keeps its units' 60.
        assert_eq!(r(132, 6, 1, false, true), 66);
        assert_eq!(r(132, 3, 1, true, true), 60);
        // The items loop keeps its units' ranges; the slots widen theirs to whole waves (two
        // at batch 2 with 6 units: 480 blocks → 528) and keep those that fill them.
        assert_eq!(r(132, 6, 1, false, false), 60);
        assert_eq!(r(132, 6, 2, false, true), 66);
        assert_eq!(r(132, 11, 2, false, true), 33);
        assert_eq!(r(132, 17, 6, false, true), 22);
        assert_eq!(r(132, 23, 12, false, true), 16);
        // A GB10's 48 SMs: 15 units fill its wave of 96 exactly (24 a pair).
        assert_eq!(r(48, 15, 1, false, true), 24);
        // Never more than a unit a warp: a small shape on a large device.
        let small = MoeShape {
            hidden: 160,
            inter: 96,
            k: 2,
            ..s
        };
        assert_eq!(moe_ranges(132, small, 1, 1, false, true).unwrap(), 12);
    }

    #[test]
    fn gate_up_units_fill_whole_waves() {
        let s = GPT_OSS_MOE;
        let wu = |sms, t| {
            MoeUnits::for_batch(sms, s, t, None, MoeLoop::Auto)
                .grouping(128, 4, t, MOE_GRP_FROM_SHARE)
                .whole_waves(sms, s, t)
        };
        // 132 SMs: one wave of 264 up to batch 5, two at 6-8 (and 10), three at 12.
        let picks = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12].map(|t| wu(132, t).gate_up);
        assert_eq!(picks, [6, 11, 17, 23, 28, 17, 20, 23, 28, 23]);
        for t in [1, 2, 3, 4, 5, 6, 7, 8, 10, 12] {
            let u = wu(132, t);
            // The grid fills its waves: no further range a pair fits them.
            let pairs = s.k * t;
            let blocks = moe_ranges(132, s, u.gate_up, t, false, true).unwrap() * pairs;
            let waves = blocks.div_ceil(264);
            assert!(blocks + pairs > waves * 264, "batch {t}: {blocks} blocks");
        }
        // Down keeps for_batch's units; gate_up grouped (batch 64) keeps its units too.
        assert_eq!(wu(132, 2).down, 6);
        let g64 = wu(132, 64);
        assert!(g64.gate_up_grouped);
        assert_eq!(
            g64.gate_up,
            MoeUnits::for_batch(132, s, 64, None, MoeLoop::Auto).gate_up
        );
        // The items loop keeps for_batch's pick; a GB10's 48 SMs (a wave of 96).
        assert_eq!(
            MoeUnits::for_batch(132, s, 2, None, MoeLoop::Items)
                .whole_waves(132, s, 2)
                .gate_up,
            MoeUnits::for_batch(132, s, 2, None, MoeLoop::Items).gate_up
        );
        assert_eq!([1, 2, 3].map(|t| wu(48, t).gate_up), [15, 30, 23]);
    }

    #[test]
    fn moe_units_per_batch_on_the_h100() {
        let s = GPT_OSS_MOE;
        let pick = |t, lp| {
            let u = MoeUnits::for_batch(132, s, t, None, lp);
            (
                u.gate_up,
                u.down,
                lp.slots(u.gate_up, s.hidden),
                lp.slots(u.down, s.inter),
            )
        };
        // Batch 1: one wave of the slots kernels (240 gate_up and 240 down blocks of 264; gate_up
        // then runs on 264, moe_ranges).
        assert_eq!(pick(1, MoeLoop::Auto), (6, 3, true, true));
        assert_eq!(pick(1, MoeLoop::Items), (1, 1, false, false));
        // gate_up below batch 4: batch 1's wave; down: one wave of the batch (240, 240 and
        // 240 blocks at batch 2, 3 and 4, 260 at 5).
        assert_eq!(pick(2, MoeLoop::Auto), (6, 6, true, true));
        assert_eq!(pick(3, MoeLoop::Auto), (6, 9, true, true));
        // gate_up from batch 4: the most units leaving 3.5 blocks per SM (480 blocks of 12
        // units at batch 4; the next count up, 448, is too few).
        assert_eq!(pick(4, MoeLoop::Auto), (12, 12, true, true));
        assert_eq!(pick(5, MoeLoop::Auto), (15, 14, true, true));
        assert_eq!(pick(6, MoeLoop::Auto), (16, 9, true, true));
        assert_eq!(pick(7, MoeLoop::Auto), (16, 11, true, true));
        assert_eq!(pick(8, MoeLoop::Auto), (16, 12, true, true));
        assert_eq!(pick(16, MoeLoop::Auto), (16, 16, true, true));
        // Rows too long for the slots: the items loop and its units.
        let wide = MoeShape {
            hidden: 4096,
            inter: 4096,
            ..s
        };
        let u = MoeUnits::for_batch(132, wide, 1, None, MoeLoop::Auto);
        assert_eq!((u.gate_up, u.down), (1, 1));
        assert_eq!(
            MoeUnits::for_batch(132, s, 1, Some((2, 5)), MoeLoop::Auto),
            MoeUnits::new(2, 5, MoeLoop::Auto)
        );
    }

    /// gate_up groups by expert where the batch sends enough tokens to each expert it names:
    /// gpt-oss-120b (128 experts, top 4) from batch 52, gpt-oss-20b (32) from batch 14; only
    /// under `Auto`, and the down kernel never.
    #[test]
    fn gate_up_groups_by_expert_where_experts_are_shared() {
        let share = |e, t| moe_tokens_per_expert(e, 4, t);
        assert!((share(128, 1) - 1.0).abs() < 1e-12);
        assert!((share(128, 16) - 1.2554).abs() < 1e-3, "{}", share(128, 16));
        assert!((share(32, 16) - 2.268).abs() < 1e-3, "{}", share(32, 16));
        assert_eq!(moe_tokens_per_expert(0, 4, 16), 0.0);
        let s = GPT_OSS_MOE;
        let grouped = |e, t, lp| {
            MoeUnits::for_batch(132, s, t, None, lp)
                .grouping(e, 4, t, MOE_GRP_FROM_SHARE)
                .gate_up_loop()
                == MoeLoop::Grouped
        };
        for t in [1, 2, 4, 8, 12, 16, 29, 51] {
            assert!(!grouped(128, t, MoeLoop::Auto), "120b batch {t}");
        }
        assert!(grouped(128, 52, MoeLoop::Auto));
        assert!(grouped(128, 64, MoeLoop::Auto));
        for t in [4, 7, 8, 12, 13] {
            assert!(!grouped(32, t, MoeLoop::Auto), "20b batch {t}");
        }
        assert!(grouped(32, 14, MoeLoop::Auto) && grouped(32, 32, MoeLoop::Auto));
        // An explicit loop stays what it is; `grouped` groups both kernels at any batch.
        assert!(!grouped(32, 16, MoeLoop::Slots));
        assert!(grouped(128, 1, MoeLoop::Grouped));
        let u = MoeUnits::for_batch(132, s, 16, None, MoeLoop::Auto).grouping(
            128,
            4,
            16,
            MOE_GRP_FROM_SHARE,
        );
        assert_eq!(u.lp, MoeLoop::Auto, "the down kernel's loop");
    }

    /// The grouped kernels exist for the fp16 dot only (other codes run the slots), stage up
    /// to MOE_GRP_NT tokens 16-byte aligned, and need the slots' row length.
    #[test]
    fn grouped_moe_kernels_and_their_staging() {
        let entries: Vec<&str> = super::super::compile::KERNEL_FILES
            .iter()
            .flat_map(|f| f.entries.iter().copied())
            .collect();
        let s = GPT_OSS_MOE;
        for down in [false, true] {
            let (name, cap, stride, smem) =
                moe_grp_kernel(down, MoeCodes::F16, MoeLoop::Grouped, s, 2880, 16).unwrap();
            assert!(entries.contains(&name), "{name} not in KERNEL_FILES");
            assert_eq!((cap, stride, smem), (MOE_GRP_NT, 7568, MOE_GRP_NT * 7568));
            let (_, cap, _, _) =
                moe_grp_kernel(down, MoeCodes::F16, MoeLoop::Grouped, s, 2880, 2).unwrap();
            assert_eq!(cap, 2);
            for codes in [MoeCodes::F32, MoeCodes::Q8, MoeCodes::Fp8] {
                assert!(moe_grp_kernel(down, codes, MoeLoop::Grouped, s, 2880, 16).is_none());
            }
            for lp in [MoeLoop::Auto, MoeLoop::Slots, MoeLoop::Items] {
                assert!(moe_grp_kernel(down, MoeCodes::F16, lp, s, 2880, 16).is_none());
            }
            assert!(moe_grp_kernel(down, MoeCodes::F16, MoeLoop::Grouped, s, 4096, 16).is_none());
        }
    }

    #[test]
    fn switches_take_their_words_and_name_the_rest() {
        let words = [("auto", 0), ("items", 1), ("slots", 2)];
        assert_eq!(choice("X", "", &words).unwrap(), 0);
        assert_eq!(choice("X", "slots", &words).unwrap(), 2);
        let e = choice("MXTUNE_MOE_LOOP", "slot", &words)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "MXTUNE_MOE_LOOP=slot: expected auto, items, slots");
    }

    #[test]
    fn moe_ready_takes_the_per_pair_kernels_only() {
        let s = GPT_OSS_MOE;
        assert!(moe_ready_fits(
            MoeCodes::F16,
            s,
            MoeUnits::new(6, 3, MoeLoop::Auto),
            1
        ));
        assert!(moe_ready_fits(
            MoeCodes::F32,
            s,
            MoeUnits::new(1, 1, MoeLoop::Items),
            3
        ));
        let grouped = MoeUnits::new(16, 16, MoeLoop::Grouped);
        assert!(!moe_ready_fits(MoeCodes::F16, s, grouped, 16));
        assert_eq!(
            choice(MOE_READY_ENV, "", &MoeReady::WORDS).unwrap(),
            MoeReady::On
        );
        let e = choice(MOE_READY_ENV, "yes", &MoeReady::WORDS)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "MXTUNE_MOE_READY=yes: expected on, ids, off");
    }

    #[test]
    fn moe_units_env_takes_one_number_or_two() {
        assert_eq!(MoeUnits::parse("4").unwrap(), (4, 4));
        assert_eq!(MoeUnits::parse("6/3").unwrap(), (6, 3));
        for bad in ["0", "33", "x", "4/", "/3", "1/2/3"] {
            let e = MoeUnits::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("MXTUNE_MOE_UNITS") && e.contains("GATE_UP/DOWN"),
                "{e}"
            );
        }
    }

    #[test]
    fn moe_loop_takes_slots_for_several_units_on_short_rows() {
        // gpt-oss rows: 2880 inputs = 90 blocks = 3 items a lane.
        assert!(!MoeLoop::Auto.slots(1, 2880));
        assert!(MoeLoop::Auto.slots(2, 2880));
        assert!(MoeLoop::Slots.slots(1, 2880));
        assert!(!MoeLoop::Items.slots(8, 2880));
        // 3072 inputs still fit three items; 3104 (97 blocks) does not, whatever is asked.
        assert!(MoeLoop::Auto.slots(8, 3072));
        assert!(!MoeLoop::Auto.slots(8, 3104));
        assert!(!MoeLoop::Slots.slots(1, 4096));
    }
}
