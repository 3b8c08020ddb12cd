//! Kernel compilation: NVRTC turns each `engine-kernels/*.cu` file into a cubin for one GPU
//! architecture; cubins are cached on disk keyed by the source, architecture, options and
//! NVRTC version, so a warm start compiles nothing.

use std::ffi::{CStr, CString, c_char};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use super::libs;

/// Environment variable overriding the cubin cache directory.
pub const CACHE_ENV: &str = "MXTUNE_KERNEL_CACHE";

/// Text prepended to every kernel file (bf16 helpers, reductions, MXFP4 decoding).
const COMMON: &str = include_str!("../../../engine-kernels/common.cuh");

/// One kernel source file and the entry points it defines.
#[derive(Debug, Clone, Copy)]
pub struct KernelFile {
    /// File name under `engine-kernels/`.
    pub name: &'static str,
    /// The file's text (embedded in the binary so it runs from anywhere).
    pub source: &'static str,
    /// `extern "C"` kernels the file defines.
    pub entries: &'static [&'static str],
}

macro_rules! kernel_file {
    ($name:literal, [$($entry:literal),+ $(,)?]) => {
        KernelFile {
            name: $name,
            source: include_str!(concat!("../../../engine-kernels/", $name)),
            entries: &[$($entry),+],
        }
    };
}

/// Every kernel file of the engine: the dispatch table the host loads from.
pub const KERNEL_FILES: &[KernelFile] = &[
    kernel_file!("embedding.cu", ["embed_gather", "rows_gather"]),
    kernel_file!("rmsnorm.cu", ["rmsnorm_residual"]),
    kernel_file!(
        "gemv_bf16.cu",
        [
            "gemv_bf16",
            "gemv_bf16_norm",
            "gemv_bf16_wide",
            "gemv_bf16_wide_rows",
            "gemv_bf16_wide_late",
            "gemv_router_t1",
            "gemv_bf16_wide_rows_late",
            "router_rows"
        ]
    ),
    kernel_file!(
        "gemv_tc.cu",
        [
            "gemv_tc_bf16_t8",
            "gemv_tc_bf16_t8_r32",
            "gemv_tc_bf16_t8_plain",
            "gemv_tc_bf16_t16",
            "gemv_tc_bf16_t16_r64",
            "gemv_tc_bf16_t16_r64_defer",
            "gemv_tc_bf16_t8_r128",
            "gemv_tc_bf16_t16_r128",
            "gemv_tc_fp4_t8",
            "gemv_tc_fp4_t8_r32",
            "gemv_tc_fp4_t16",
            "gemv_tc_fp4_t16_r64",
            "gemv_tc_fp4_t16_r64_defer",
            "gemv_tc_fp4_t8_r128",
            "gemv_tc_fp4_t16_r128",
            "moe_gate_up_tc_t8",
            "moe_gate_up_tc_t16",
            "moe_down_tc_t8",
            "moe_down_tc_t16",
            "moe_gate_up_f16",
            "moe_down_f16"
        ]
    ),
    kernel_file!("rope_kv.cu", ["rope_kv_write"]),
    kernel_file!(
        "attention_decode.cu",
        [
            "attn_split",
            "attn_split_gqa",
            "attn_split_gqa_tc",
            "attn_split_gqa_tc_fp8",
            "attn_split_gqa_tc_d64",
            "attn_split_gqa_tc_fp8_d64",
            "attn_split_gqa_tc_fp8_w8",
            "attn_split_gqa_tc_fp8_d64_w8",
            "attn_split_gqa_tc_d64_g8",
            "attn_split_gqa_tc_fp8_d64_g8",
            "attn_split_gqa_tc_fp8_d64_w8_g8",
            "attn_combine"
        ]
    ),
    kernel_file!(
        "attention_prefill.cu",
        [
            "attn_prefill",
            "attn_prefill_tc",
            "attn_prefill_tc_d64",
            "attn_split_combine"
        ]
    ),
    kernel_file!(
        "moe_gemv.cu",
        [
            "moe_gate_up_swiglu",
            "moe_gate_up_swiglu_q8",
            "moe_gate_up_swiglu_fp8",
            "moe_down",
            "moe_down_q8",
            "moe_down_fp8",
            "moe_gate_up_swiglu_slots",
            "moe_gate_up_swiglu_q8_slots",
            "moe_gate_up_swiglu_fp8_slots",
            "moe_down_slots",
            "moe_down_q8_slots",
            "moe_down_fp8_slots",
            "moe_gate_up_swiglu_h2",
            "moe_down_h2",
            "moe_gate_up_swiglu_h2_slots",
            "moe_down_h2_slots",
            "moe_gate_up_swiglu_h2_slots_full",
            "moe_down_h2_slots_full",
            "moe_gate_up_swiglu_h2_grp",
            "moe_down_h2_grp"
        ]
    ),
    kernel_file!(
        "gemm_bf16.cu",
        [
            "gemm_bf16_tc",
            "gemm_bf16_cp",
            "gemm_split_reduce",
            "rows_bf16"
        ]
    ),
    kernel_file!(
        "mxfp4_dense.cu",
        [
            "mxfp4_quantize_bf16",
            "mxfp4_word_layout",
            "gemv_mxfp4",
            "gemm_mxfp4_tc"
        ]
    ),
    kernel_file!(
        "moe_grouped.cu",
        [
            "moe_group",
            "moe_gate_up_grouped",
            "moe_gate_up_grouped_m128",
            "moe_down_grouped",
            "moe_down_grouped_m128",
            "moe_act_bf16",
            "moe_gate_up_rb",
            "moe_gate_up_rb_m128",
            "moe_down_rb",
            "moe_down_rb_m128",
            "moe_gate_up_rb_m32",
            "moe_down_rb_m32",
            "moe_combine"
        ]
    ),
    kernel_file!("argmax.cu", ["argmax_partial", "argmax_final"]),
    kernel_file!(
        "sampling.cu",
        [
            "sample_rows",
            "sample_max_part",
            "sample_mass_part",
            "sample_pick"
        ]
    ),
    kernel_file!("synthetic.cu", ["fill_bf16", "fill_u8"]),
    kernel_file!("bandwidth.cu", ["read_probe"]),
];

/// NVRTC options besides the architecture; part of the cache key.
const OPTIONS: &[&str] = &["-std=c++17", "--fmad=true"];

/// Extra `NAME=VALUE` macro definitions for every kernel file, separated by spaces: tuning
/// knobs the kernels expose (e.g. `MOE_DECODE_MINB=3`, the blocks per SM the decode MoE is
/// compiled for). Part of the cache key.
pub const DEFINES_ENV: &str = "MXTUNE_KERNEL_DEFINES";

/// The NVRTC options of this process: [`OPTIONS`] plus `-D` for each entry of
/// `$MXTUNE_KERNEL_DEFINES`.
pub fn options() -> Result<Vec<String>> {
    let mut v: Vec<String> = OPTIONS.iter().map(|o| o.to_string()).collect();
    if let Ok(defs) = std::env::var(DEFINES_ENV) {
        v.extend(parse_defines(&defs)?);
    }
    Ok(v)
}

fn parse_defines(defs: &str) -> Result<Vec<String>> {
    let word = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    };
    defs.split_whitespace()
        .map(|d| {
            let (name, value) = d.split_once('=').unwrap_or((d, "1"));
            anyhow::ensure!(
                word(name) && word(value) && !name.starts_with(|c: char| c.is_ascii_digit()),
                "{DEFINES_ENV}: `{d}` is not NAME=VALUE (letters, digits, `_`, `.`)"
            );
            Ok(format!("-D{name}={value}"))
        })
        .collect()
}

impl KernelFile {
    /// The text NVRTC compiles: the common header, then the file (line numbers kept).
    pub fn full_source(&self) -> String {
        format!("{COMMON}\n#line 1 \"{}\"\n{}", self.name, self.source)
    }
}

/// Where a cubin came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CubinOrigin {
    /// NVRTC compiled it now (and it was written to the cache).
    Compiled,
    /// Read from the disk cache; nothing compiled.
    Cached,
}

/// The on-disk cubin cache.
#[derive(Debug, Clone)]
pub struct KernelCache {
    dir: PathBuf,
    /// `-D` options this cache's compiles add to [`options`] (part of the key).
    extra: Vec<String>,
}

impl KernelCache {
    /// `$MXTUNE_KERNEL_CACHE`, else `~/.cache/mxtune/kernels`.
    pub fn from_env() -> Result<Self> {
        if let Some(d) = std::env::var_os(CACHE_ENV) {
            return Ok(Self::at(PathBuf::from(d)));
        }
        let home = std::env::var_os("HOME").with_context(|| {
            format!("HOME is not set; set {CACHE_ENV} to a directory for compiled kernels")
        })?;
        Ok(Self::at(PathBuf::from(home).join(".cache/mxtune/kernels")))
    }

    /// A cache in `dir` (created on first write).
    pub fn at(dir: PathBuf) -> Self {
        Self {
            dir,
            extra: Vec::new(),
        }
    }

    /// The same cache compiling with `NAME=VALUE` defined too (an instrumented build: its
    /// cubins are cached under their own keys).
    pub fn with_define(mut self, define: &str) -> Result<Self> {
        self.extra.extend(parse_defines(define)?);
        Ok(self)
    }

    /// The NVRTC options of this cache's compiles: [`options`] and its own defines.
    fn options(&self) -> Result<Vec<String>> {
        let mut v = options()?;
        v.extend(self.extra.iter().cloned());
        Ok(v)
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cubin of `file` for `arch` (e.g. `sm_90`), from the cache or compiled now.
    pub fn cubin(&self, file: &KernelFile, arch: &str) -> Result<(Vec<u8>, CubinOrigin)> {
        let source = file.full_source();
        let (major, minor) = nvrtc_version()?;
        let mut h = Sha256::new();
        for part in [
            source.as_str(),
            arch,
            &self.options()?.join(" "),
            &format!("nvrtc {major}.{minor}"),
        ] {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
        let key = hex::encode(&h.finalize()[..12]);
        let stem = file.name.trim_end_matches(".cu");
        let path = self.dir.join(format!("{stem}-{arch}-{key}.cubin"));
        if let Ok(bytes) = std::fs::read(&path)
            && !bytes.is_empty()
        {
            return Ok((bytes, CubinOrigin::Cached));
        }
        let cubin = compile_cubin_with(file.name, &source, arch, &self.options()?)?;
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating kernel cache {}", self.dir.display()))?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &cubin).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path)
            .with_context(|| format!("renaming into {}", path.display()))?;
        Ok((cubin, CubinOrigin::Compiled))
    }
}

/// NVRTC's version (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    libs::ensure_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (checked above); out-pointers are valid.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    check(r, "nvrtcVersion")?;
    Ok((major, minor))
}

fn check(r: cudarc::nvrtc::sys::nvrtcResult, what: &str) -> Result<()> {
    if r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        bail!("{what} failed: {r:?}")
    }
}

/// Compile one source to a cubin for `arch` (`sm_90`, `sm_90a`, `sm_121`, …) with NVRTC.
/// Needs no GPU. The error carries NVRTC's log.
pub fn compile_cubin(name: &str, source: &str, arch: &str) -> Result<Vec<u8>> {
    compile_cubin_with(name, source, arch, &options()?)
}

/// [`compile_cubin`] with the NVRTC options `options` (besides the architecture).
fn compile_cubin_with(name: &str, source: &str, arch: &str, options: &[String]) -> Result<Vec<u8>> {
    use cudarc::nvrtc::sys;
    libs::ensure_nvrtc()?;
    let src = CString::new(source).with_context(|| format!("{name} contains a NUL byte"))?;
    let cname = CString::new(name).with_context(|| format!("kernel name {name:?}"))?;
    let mut opts: Vec<CString> = vec![
        CString::new(format!("--gpu-architecture={arch}"))
            .with_context(|| format!("architecture {arch:?}"))?,
    ];
    for o in options {
        opts.push(CString::new(o.as_str()).context("NVRTC option")?);
    }
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: valid C strings that outlive the program; no headers passed.
    let r = unsafe {
        sys::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    check(r, "nvrtcCreateProgram")?;
    let result = (|| {
        // SAFETY: prog is a live program; the option array outlives the call.
        let r = unsafe { sys::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            bail!(
                "NVRTC could not compile engine-kernels/{name} for {arch} ({r:?}):\n{}",
                program_log(prog)
            );
        }
        let mut size = 0usize;
        // SAFETY: prog compiled; out-pointer valid.
        check(
            unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) },
            "nvrtcGetCUBINSize",
        )?;
        if size == 0 {
            bail!("NVRTC produced no cubin for {name} ({arch}); is `{arch}` a real architecture?");
        }
        let mut buf = vec![0u8; size];
        // SAFETY: buf holds exactly `size` bytes as NVRTC asked.
        check(
            unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char) },
            "nvrtcGetCUBIN",
        )?;
        Ok(buf)
    })();
    // SAFETY: prog was created above and is destroyed exactly once.
    unsafe { sys::nvrtcDestroyProgram(&mut prog) };
    result
}

fn program_log(prog: cudarc::nvrtc::sys::nvrtcProgram) -> String {
    use cudarc::nvrtc::sys;
    let mut size = 0usize;
    // SAFETY: live program, valid out-pointer.
    if unsafe { sys::nvrtcGetProgramLogSize(prog, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS
        || size == 0
    {
        return String::from("(no log)");
    }
    let mut buf = vec![0u8; size];
    // SAFETY: buffer of the size NVRTC reported.
    unsafe { sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut c_char) };
    CStr::from_bytes_until_nul(&buf)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::{KERNEL_FILES, parse_defines};

    /// The body of kernel `entry` in `src`: from its `extern "C"` line to the matching brace.
    fn kernel_body<'a>(src: &'a str, entry: &str) -> Option<&'a str> {
        let names = |head: &str| {
            head.match_indices(&format!("{entry}(")).any(|(j, _)| {
                !head[..j]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        };
        // A kernel stamped out by a macro (a line `NAME(entry, …)`): the macro's definition,
        // whose kernel is called `name`.
        let stamped = src.match_indices(&format!("({entry},")).find_map(|(j, _)| {
            let line_start = src[..j].rfind('\n').map_or(0, |n| n + 1);
            let macro_name = &src[line_start..j];
            let ident = !macro_name.is_empty()
                && macro_name.chars().all(|c| c.is_alphanumeric() || c == '_');
            ident.then_some(macro_name)
        });
        if let Some(macro_name) = stamped {
            let def = src.find(&format!("#define {macro_name}("))?;
            let def_body = def + src[def..].find('\n')?;
            return kernel_body(&src[def_body..], "name");
        }
        let open = src
            .match_indices("extern \"C\"")
            .map(|(i, _)| i + src[i..].find('{').unwrap_or(0))
            .zip(src.match_indices("extern \"C\"").map(|(i, _)| i))
            .find(|&(open, i)| open > i && names(&src[i..open]))?
            .0;
        let mut depth = 0usize;
        for (i, c) in src[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(&src[open..open + i]);
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// Kernels are looked up by name across every file: two files defining one name would
    /// launch whichever was loaded last with the other's arguments (a session-14 selftest
    /// caught `moe_down_f16` of moe_gemv.cu shadowing gemv_tc.cu's). Names are unique, and
    /// each is defined in the file that lists it and in no other.
    #[test]
    fn kernel_names_are_unique_across_files() {
        let mut seen = std::collections::HashMap::new();
        for file in KERNEL_FILES {
            for entry in file.entries {
                if let Some(other) = seen.insert(*entry, file.name) {
                    panic!("{entry} listed by both {other} and {}", file.name);
                }
            }
        }
        for file in KERNEL_FILES {
            for other in KERNEL_FILES.iter().filter(|o| o.name != file.name) {
                for entry in file.entries {
                    assert!(
                        kernel_body(other.source, entry).is_none(),
                        "{entry} (listed by {}) is also defined in {}",
                        file.name,
                        other.name
                    );
                }
            }
        }
    }

    /// Every launch may overlap the previous kernel (programmatic dependent launch), so a
    /// kernel that does not wait first would read half-written activations: each entry point
    /// must call `pdl_enter()` (or `pdl_wait()`), and nothing but weight prefetches may come
    /// before it.
    #[test]
    fn every_kernel_waits_for_the_previous_grid() {
        for file in KERNEL_FILES {
            for entry in file.entries {
                let body = kernel_body(file.source, entry)
                    .unwrap_or_else(|| panic!("{entry} not found in {}", file.name));
                let waits = |b: &str| b.contains("pdl_enter();") || b.contains("pdl_enter_as(");
                if body.contains("moe_down_body<") && !waits(body) {
                    // The decode MoE's down kernels wait inside their body, after reading
                    // their expert ids and first weights (MOE_DOWN_EARLY).
                    down_body_waits_after_immutable_reads(file.source);
                    continue;
                }
                if body.contains("moe_gate_up_body<") && !waits(body) {
                    // The decode MoE's gate_up kernels wait inside their body: first, or,
                    // with the router's expert announcements, after their first weights.
                    gate_up_body_waits_before_its_input(file.source);
                    continue;
                }
                if body.contains("moe_down_grp_body(") && !waits(body) {
                    // The grouped down kernel too, after grouping the expert ids.
                    grp_down_body_waits_after_immutable_reads(file.source);
                    continue;
                }
                let wait = body
                    .find("pdl_enter();")
                    .or_else(|| body.find("pdl_wait();"))
                    .or_else(|| body.find("pdl_enter_as("))
                    .unwrap_or_else(|| panic!("{entry} ({}) never calls pdl_enter()", file.name));
                for before in body[..wait].lines().skip(1) {
                    let t = before.trim();
                    assert!(
                        t.is_empty()
                            || t.starts_with("//")
                            || t.starts_with('#')
                            || t.starts_with("extern __shared__")
                            || t.starts_with("__shared__")
                            || t.starts_with("const int")
                            || t.contains("prefetch_l2(")
                            // common.cuh: parameter values into registers (no memory read).
                            || touches_only_parameters(t)
                            // attention_decode.cu: the (immutable) sink logits.
                            || t.starts_with("attn_sinks_early(")
                            // attention_decode.cu's attn_combine: its path of
                            // ATTN_COMBINE_VEC, chosen by the parameters alone, waits itself
                            // (checked by combine_vec_reads_only_the_sink_before_its_wait).
                            || t.starts_with("if (attn_combine_vec_takes(part_acc, out, d)) {")
                            || t.starts_with("attn_combine_vec(")
                            || t == "return;"
                            || t == "}"
                            // attention_decode.cu's GQA tensor-core split: the row's position
                            // and cache offset, step inputs, by loads that stay above the wait.
                            || t.contains("= (int)ld_early_u32(pos + ")
                            || t.contains("= ld_early_u64(kv_off + ")
                            // rope_kv.cu: the step's inputs and the constant frequencies
                            // (rope_early, checked below).
                            || t.starts_with("const RopeEarly e = rope_early(")
                            // gemv_tc.cu: the first chunks of the (immutable) weights, the
                            // arguments on the lines after the call.
                            || t.starts_with("using W = TcgBf16T<")
                            || t.starts_with("using W = TcgFp4T<")
                            || t.starts_with("typename W::Raw")
                            || t.starts_with("const W wp{")
                            || t.starts_with("tcg_prefetch")
                            || t.starts_with("cur);"),
                        "{entry} ({}): `{t}` runs before pdl_enter()",
                        file.name
                    );
                }
            }
        }
    }

    /// The source of the kernel file `name`.
    fn kernel_source(name: &str) -> &'static str {
        KERNEL_FILES
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("{name} is not a kernel file"))
            .source
    }

    /// `attn_combine_vec` (attn_combine's path of ATTN_COMBINE_VEC) reads before its wait only
    /// the sink logit, a weight, by a weak load that stays above the wait — never the split
    /// kernel's partials — and waits before it returns.
    #[test]
    fn combine_vec_reads_only_the_sink_before_its_wait() {
        let src = kernel_source("attention_decode.cu");
        let body = fn_body(src, "void attn_combine_vec(");
        let (before, after) = body
            .split_once("pdl_enter();")
            .expect("attn_combine_vec waits");
        for part in ["part_m", "part_l", "part_acc", "out["] {
            let reads = before
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .any(|l| l.contains(part));
            assert!(!reads, "attn_combine_vec: `{part}` read before the wait");
        }
        assert!(
            before.contains("ld_early_bf16(sinks + h)") && !before.contains("sinks["),
            "attn_combine_vec: the sink logit by a weak load only"
        );
        assert!(
            after.contains("part_m[base + lane]") && after.contains("part_acc"),
            "attn_combine_vec: the partials read after the wait"
        );
    }

    /// Whether `line` is a `param_touch(...)` call of plain names (the entry's parameters, or
    /// `blockDim.x`): it reads no memory, so it may come before the wait.
    fn touches_only_parameters(line: &str) -> bool {
        let Some(args) = line
            .strip_prefix("param_touch(")
            .and_then(|r| r.split_once(");"))
            .map(|(args, _)| args)
        else {
            return false;
        };
        args.split(',').map(str::trim).all(|a| {
            a == "blockDim.x"
                || (!a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        })
    }

    #[test]
    fn a_parameter_touch_reads_no_memory() {
        assert!(touches_only_parameters(
            "param_touch(blockDim.x, norm_w, cnt);"
        ));
        assert!(touches_only_parameters(
            "param_touch(blocks, wts, y, stride);    \\"
        ));
        assert!(!touches_only_parameters("param_touch(x[0]);"));
        assert!(!touches_only_parameters("param_touch(*idx, blocks);"));
        assert!(!touches_only_parameters("param_touch(pos + 1);"));
        assert!(!touches_only_parameters("pdl_enter();"));
    }

    /// What `rope_kv_write` reads before its wait (`rope_early`): the row's position and cache
    /// offset, which the host copies in before the step's first kernel and no kernel writes,
    /// and the constant frequencies, by loads that stay above the wait (`ld_early_*`) — never
    /// the projection it rotates.
    #[test]
    fn rope_reads_only_step_inputs_before_its_wait() {
        let src = kernel_source("rope_kv.cu");
        let early = fn_body(src, "RopeEarly rope_early(");
        assert!(!early.contains("qkv"), "rope_early reads the projection");
        for load in [
            "ld_early_u32(pos",
            "ld_early_u64(kv_off",
            "ld_early_f32(inv_freq",
        ] {
            assert!(early.contains(load), "rope_early: no `{load}`");
        }
        assert!(
            ["pos[", "kv_off[", "inv_freq["]
                .iter()
                .all(|p| !early.contains(p)),
            "rope_early: a plain load, which ptxas may place after the wait"
        );
    }

    /// `moe_down_body` waits on the previous kernel in both arms of `MOE_DOWN_EARLY`, and
    /// before the early waits it reads nothing an earlier kernel writes but the router's
    /// expert ids and slot weights, by `__ldcg` (complete once gate_up has passed its own wait;
    /// ops::moe_down).
    fn down_body_waits_after_immutable_reads(src: &str) {
        let body = fn_body(src, "void moe_down_body(");
        let arms: Vec<&str> = body.split("#if MOE_DOWN_EARLY").collect();
        assert!(
            body.contains("#if !MOE_DOWN_EARLY\n    pdl_enter_as(DOWN_TRIGGER);"),
            "moe_down_body: no wait when MOE_DOWN_EARLY is 0"
        );
        assert_eq!(arms.len(), 3, "moe_down_body: one early wait per loop kind");
        // Before the slots loop's wait: the common start and the slots branch's; before the
        // item loop's: the item branch's (after `} else {`; the common start is checked above).
        let items = &arms[1][arms[1].rfind("} else {").expect("the item branch")..];
        for before in [arms[0], items] {
            reads_no_earlier_output("moe_down_body", before);
        }
        assert!(
            arms[0].contains("__ldcg(idx"),
            "moe_down_body: the expert ids must be read past L1 before the wait"
        );
        // On gate_up's per-pair count (the router's announcements), each loop's early wait is
        // the count, and the grid's wait comes before the count and combine, which read the
        // residual (the slots' rows before it go to `part`, which only this kernel touches).
        for arm in &arms[1..] {
            assert!(
                arm.trim_start().starts_with(
                    "if (gu_blocks) MOE_DOWN_AWAIT();\n        else pdl_enter_as(DOWN_TRIGGER);"
                ) || arm.trim_start().starts_with(
                    "if (gu_blocks) MOE_DOWN_AWAIT();\n    else pdl_enter_as(DOWN_TRIGGER);"
                ),
                "moe_down_body: the early wait is the pair's count or the grid"
            );
        }
        let late = body
            .find("if (gu_blocks) pdl_enter_as(2);")
            .expect("moe_down_body: no grid wait after the count");
        let publish = body
            .find("// Publish this block's rows")
            .expect("the publish");
        assert!(
            late < publish,
            "moe_down_body: the grid wait must come before the publish"
        );
    }

    /// `moe_gate_up_body`: without announcements it waits before reading the expert id; with
    /// them the id comes from `moe_ready_wait` and each loop waits right before staging the
    /// router's normalised copy, the only output of the kernel before it that it reads (with
    /// norm_w it stages the residual instead, before the announcement: an output of the kernel
    /// before the router).
    fn gate_up_body_waits_before_its_input(src: &str) {
        let body = fn_body(src, "void moe_gate_up_body(");
        assert!(
            body.contains("} else {\n        pdl_enter_as(GATE_UP_TRIGGER);\n        e = idx["),
            "moe_gate_up_body: no wait before the expert id without announcements"
        );
        let late = "if (ready) pdl_enter_as(GATE_UP_TRIGGER);";
        let parts: Vec<&str> = body.split(late).collect();
        assert_eq!(
            parts.len(),
            3,
            "moe_gate_up_body: one late wait per loop kind"
        );
        // Before the late waits the only staging is the residual's, normalised by the block
        // itself (norm_w: the router's input, complete before the router passed its wait).
        let early = "if (norm_w) A::stage_norm(x + (size_t)t * hidden, xs, hidden, norm_w, eps);";
        assert!(
            parts[0].contains("e = moe_ready_wait(ready")
                && parts[0].matches("A::stage").count() == 1
                && parts[0].contains(early),
            "moe_gate_up_body: the announcement first, no staging before the late wait but the \
             self-normalised residual's"
        );
        for after in &parts[1..] {
            assert!(
                after.trim_start().starts_with("if (!norm_w) A::stage(x"),
                "moe_gate_up_body: the late wait must come right before the staging"
            );
        }
        reads_no_earlier_output("moe_gate_up_body", parts[0]);
    }

    /// `moe_down_grp_body` likewise: before its early wait only the grouping of the expert
    /// ids (`tcg_group`, which reads them by `__ldcg`), biases and weights.
    fn grp_down_body_waits_after_immutable_reads(src: &str) {
        let body = fn_body(src, "void moe_down_grp_body(");
        assert!(
            body.contains("#if !MOE_DOWN_EARLY\n    pdl_enter_as(DOWN_TRIGGER);"),
            "moe_down_grp_body: no wait when MOE_DOWN_EARLY is 0"
        );
        let parts: Vec<&str> = body.split("#if MOE_DOWN_EARLY").collect();
        assert_eq!(parts.len(), 2, "moe_down_grp_body: one early wait");
        reads_no_earlier_output("moe_down_grp_body", parts[0]);
        assert!(
            parts[0].contains("tcg_group(idx"),
            "moe_down_grp_body: the grouping before the wait"
        );
        let group = fn_body(super::COMMON, "bool tcg_group(");
        assert!(
            group.contains("__ldcg(idx"),
            "tcg_group reads the ids past L1"
        );
    }

    /// The body of the function whose signature starts with `sig` in `src`.
    fn fn_body<'a>(src: &'a str, sig: &str) -> &'a str {
        let start = src.find(sig).unwrap_or_else(|| panic!("{sig} not found"));
        let body = &src[start + src[start..].find('{').expect("a body")..];
        &body[..body.find("\n}\n").expect("the body's end")]
    }

    /// No line of `text` (code before a kernel's wait) reads what an earlier kernel of the
    /// MoE writes (act, wts, part, y) other than by staging after the wait, or the router's
    /// slot weights past L1 (`__ldcg(wts`: complete, as the expert ids are).
    fn reads_no_earlier_output(name: &str, text: &str) {
        for line in text.lines() {
            let t = line.trim();
            let written = ["act", "wts", "part", "y[", "y +"]
                .iter()
                .any(|w| t.contains(w) && !t.starts_with("//"));
            assert!(
                !written
                    || t.starts_with("A::stage")
                    || t.contains("#if")
                    || t.contains("__ldcg(wts")
                    // The router's expert announcement, which is what gate_up waits on there.
                    || t.starts_with("e = moe_ready_wait(ready"),
                "{name}: `{t}` reads an earlier kernel's output before its wait"
            );
        }
    }

    #[test]
    fn defines_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_defines(" MOE_DECODE_MINB=3  X ").unwrap(),
            ["-DMOE_DECODE_MINB=3", "-DX=1"]
        );
        let e = parse_defines("A=1 B=$(rm)").unwrap_err().to_string();
        assert!(
            e.contains("`B=$(rm)`") && e.contains("MXTUNE_KERNEL_DEFINES"),
            "{e}"
        );
        assert!(parse_defines("1A=2").is_err());
    }
}
