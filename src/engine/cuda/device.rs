//! One CUDA device: context, stream, and every engine kernel loaded from cubins compiled for
//! the device's own architecture (NVRTC, disk-cached).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Result, bail};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits,
};

use super::compile::{CubinOrigin, KERNEL_FILES, KernelCache};
use super::timeline::{self, Launch, Record};

/// cudarc is built without `std`, so its `DriverError` is no `std::error::Error`; this adds
/// anyhow-style context to its results.
trait DriverContext<T> {
    fn drv(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> DriverContext<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn drv(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| anyhow::anyhow!("{}: CUDA driver error {:?}", what(), e.0))
    }
}
use super::libs;

/// A kernel argument: device pointers travel as raw addresses so optional inputs can be null.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    /// Device pointer (0 = null).
    Ptr(u64),
    /// `int`.
    I32(i32),
    /// `unsigned long long`.
    U64(u64),
    /// `float`.
    F32(f32),
}

/// Environment switch for programmatic dependent launch (`0` turns it off, for A/B timing).
pub const PDL_ENV: &str = "MXTUNE_PDL";

fn pdl_enabled_by_env() -> Result<bool> {
    match std::env::var(PDL_ENV).as_deref() {
        Err(_) | Ok("1") | Ok("on") => Ok(true),
        Ok("0") | Ok("off") => Ok(false),
        Ok(v) => bail!("{PDL_ENV}={v}: expected 1/on or 0/off"),
    }
}

/// How the kernels were obtained at start-up (the cold/warm start figure).
#[derive(Debug, Clone)]
pub struct LoadReport {
    /// Kernel files compiled by NVRTC now.
    pub compiled: usize,
    /// Kernel files read from the cubin cache.
    pub cached: usize,
    /// Wall time to obtain and load every module.
    pub seconds: f64,
    /// The cache directory.
    pub cache_dir: String,
}

/// An opened GPU with the engine's kernels loaded.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: String,
    name: String,
    funcs: HashMap<&'static str, CudaFunction>,
    /// Per kernel, the dynamic shared memory a block may ask for (set at load).
    dynamic_shared: HashMap<&'static str, usize>,
    max_shared: usize,
    sms: usize,
    /// Programmatic dependent launch (sm_90 and later, unless `MXTUNE_PDL=0`).
    pdl: bool,
    /// [`Gpu::resident_blocks`] answers, by (kernel, threads, dynamic shared memory).
    resident: Mutex<HashMap<(&'static str, u32, usize), usize>>,
    /// Scratch of the tensor-core GEMV's K split ([`Gpu::split_scratch`]): partial sums and
    /// zeroed completion counters.
    split_part: CudaSlice<f32>,
    split_cnt: CudaSlice<u32>,
    /// Cold/warm start report of the kernel load.
    pub load_report: LoadReport,
    /// With [`Gpu::open_timeline`]: the kernels' record buffer and the launches since
    /// [`Gpu::timeline_reset`].
    timeline: Option<TimelineBuf>,
}

/// The device side of `engine profile --timeline`: the records the instrumented kernels write
/// (word 0 their count, then 4 words a record) and the host's log of the launches.
struct TimelineBuf {
    buf: CudaSlice<u64>,
    log: Mutex<Vec<Launch>>,
    /// Each entry's module (its index in `KERNEL_FILES`), as the kernels record it.
    module_of: HashMap<&'static str, u32>,
}

/// Floats of [`Gpu::split_scratch`]'s partial sums: two halves of 16 tokens × 16 384 rows.
pub const SPLIT_PART_LEN: usize = 2 * 16 * 16_384;
/// Its completion counters: one per (row tile, token pass).
pub const SPLIT_CNT_LEN: usize = 4096;

impl Gpu {
    /// Open device `ordinal`, compile (or read cached) kernels for its architecture and load
    /// them. Fails with a clear error, never a panic, when the driver, NVRTC or a GPU is missing.
    pub fn open(ordinal: usize) -> Result<Self> {
        Self::open_inner(ordinal, false)
    }

    /// [`Gpu::open`] with every kernel compiled to record when its blocks enter and pass their
    /// wait (`STEP_TIMELINE`, common.cuh) for [`Gpu::timeline_read`]: slower kernels, for
    /// `engine profile --timeline` only.
    pub fn open_timeline(ordinal: usize) -> Result<Self> {
        Self::open_inner(ordinal, true)
    }

    fn open_inner(ordinal: usize, with_timeline: bool) -> Result<Self> {
        libs::ensure_driver()?;
        libs::ensure_nvrtc()?;
        let ctx = CudaContext::new(ordinal)
            .drv(|| format!("opening CUDA device {ordinal} (is a GPU present?)"))?;
        // One stream, ordered by construction: cudarc's per-buffer event tracking would only
        // add host work to every launch.
        // SAFETY: no other stream ever touches this context's buffers.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx
            .compute_capability()
            .drv(|| "reading the device's compute capability".into())?;
        let arch = format!("sm_{major}{minor}");
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        // A created stream, not the legacy default one, which cannot be captured into a graph.
        let stream = ctx.new_stream().drv(|| "creating a CUDA stream".into())?;
        let max_shared = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .drv(|| "reading the shared-memory limit".into())? as usize;
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .drv(|| "reading the multiprocessor count".into())? as usize;
        let mut cache = KernelCache::from_env()?;
        let mut timeline = None;
        if with_timeline {
            cache = cache.with_define("STEP_TIMELINE=1")?;
            timeline = Some(TimelineBuf {
                buf: stream
                    .alloc_zeros::<u64>(1 + 4 * timeline::CAPACITY)
                    .drv(|| "allocating the timeline records".into())?,
                log: Mutex::new(Vec::new()),
                module_of: HashMap::new(),
            });
        }
        let t0 = Instant::now();
        let (mut compiled, mut cached) = (0, 0);
        let mut funcs = HashMap::new();
        let mut dynamic_shared = HashMap::new();
        for (fi, file) in (0u32..).zip(KERNEL_FILES) {
            let (cubin, origin) = cache.cubin(file, &arch)?;
            match origin {
                CubinOrigin::Compiled => compiled += 1,
                CubinOrigin::Cached => cached += 1,
            }
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
                .drv(|| format!("loading the {arch} cubin of {}", file.name))?;
            if let Some(tl) = &timeline {
                // Point this module's copy of the record pointer at the buffer.
                let (buf, _sync) = tl.buf.device_ptr(&stream);
                let set = |name: &str, value: u64, bytes: usize| -> Result<()> {
                    let mut sym = module
                        .get_global(name, &stream)
                        .drv(|| format!("{name} in {}", file.name))?;
                    anyhow::ensure!(
                        sym.len() == bytes,
                        "{name} in {} is not {bytes} bytes",
                        file.name
                    );
                    let v = value.to_le_bytes();
                    stream
                        .memcpy_htod(&v[..bytes], &mut sym)
                        .drv(|| format!("setting {name} in {}", file.name))
                };
                set("mx_timeline", buf, 8)?;
                set("mx_timeline_cap", timeline::CAPACITY as u64, 8)?;
                set("mx_timeline_module", u64::from(fi), 4)?;
            }
            for entry in file.entries {
                if let Some(tl) = timeline.as_mut() {
                    tl.module_of.insert(entry, fi);
                }
                let f = module
                    .load_function(entry)
                    .drv(|| format!("kernel {entry} in {}", file.name))?;
                // Allow every kernel the device's opt-in shared memory (less its static
                // share); each launch still asks only for what it needs.
                let fixed = f
                    .shared_size_bytes()
                    .drv(|| format!("shared size of {entry}"))?;
                f.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    max_shared as i32 - fixed,
                )
                .drv(|| format!("raising the shared-memory limit of {entry}"))?;
                dynamic_shared.insert(*entry, max_shared.saturating_sub(fixed.max(0) as usize));
                funcs.insert(*entry, f);
            }
        }
        let load_report = LoadReport {
            compiled,
            cached,
            seconds: t0.elapsed().as_secs_f64(),
            cache_dir: cache.dir().display().to_string(),
        };
        let pdl = major >= 9 && pdl_enabled_by_env()?;
        let split_part = stream
            .alloc_zeros::<f32>(SPLIT_PART_LEN)
            .drv(|| "allocating the GEMV split scratch".into())?;
        let split_cnt = stream
            .alloc_zeros::<u32>(SPLIT_CNT_LEN)
            .drv(|| "allocating the GEMV split counters".into())?;
        Ok(Self {
            ctx,
            stream,
            arch,
            pdl,
            name,
            funcs,
            dynamic_shared,
            max_shared,
            sms,
            resident: Mutex::new(HashMap::new()),
            split_part,
            split_cnt,
            load_report,
            timeline,
        })
    }

    /// Clear the timeline's records, and with `log` its launch log (an error unless opened by
    /// [`Gpu::open_timeline`]).
    pub fn timeline_reset(&self, log: bool) -> Result<()> {
        let tl = self.timeline_buf()?;
        let zero = [0u64];
        {
            let (ptr, _sync) = tl.buf.device_ptr(&self.stream);
            // SAFETY: the buffer's first word, on this context's stream.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(ptr, &zero, self.stream.cu_stream())
            }
            .drv(|| "clearing the timeline count".into())?;
        }
        self.sync()?;
        if log {
            tl.log
                .lock()
                .map_err(|_| anyhow::anyhow!("timeline log poisoned"))?
                .clear();
        }
        Ok(())
    }

    /// The records the kernels wrote and the launches logged since [`Gpu::timeline_reset`]
    /// (after a sync), and whether records were dropped for want of room.
    pub fn timeline_read(&self) -> Result<(Vec<Record>, Vec<Launch>, bool)> {
        let tl = self.timeline_buf()?;
        self.sync()?;
        let words = self
            .stream
            .clone_dtoh(&tl.buf)
            .drv(|| "reading the timeline records".into())?;
        let count = words.first().copied().unwrap_or(0) as usize;
        let recs = timeline::decode(&words[1..], count.min(timeline::CAPACITY));
        let log = tl
            .log
            .lock()
            .map_err(|_| anyhow::anyhow!("timeline log poisoned"))?
            .clone();
        Ok((recs, log, count > timeline::CAPACITY))
    }

    fn timeline_buf(&self) -> Result<&TimelineBuf> {
        self.timeline
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("the GPU was not opened for a timeline"))
    }

    /// Architecture the kernels were built for (`sm_90`, `sm_121`, …).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The device's marketing name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's PCI bus id as NVML takes it (`domain:bus:device.0`, hex), so NVML reads
    /// the GPU this context runs on whatever the two number their devices.
    pub fn pci_bus_id(&self) -> Result<String> {
        use cudarc::driver::sys::CUdevice_attribute as A;
        let attr = |a: A, what: &str| -> Result<i32> {
            self.ctx
                .attribute(a)
                .drv(|| format!("reading the device's PCI {what}"))
        };
        Ok(format!(
            "{:08X}:{:02X}:{:02X}.0",
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, "domain")?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, "bus")?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, "device")?
        ))
    }

    /// The device's memory in bytes (0 if the driver does not say).
    pub fn total_mem(&self) -> usize {
        self.ctx.total_mem().unwrap_or(0)
    }

    /// Largest dynamic shared memory one block may ask for (bytes; kernels with static shared
    /// memory get that much less).
    pub fn max_shared(&self) -> usize {
        self.max_shared
    }

    /// Largest dynamic shared memory a block of `kernel` may ask for: the device's opt-in
    /// limit less the kernel's static shared memory.
    pub fn dynamic_shared_limit(&self, kernel: &str) -> Result<usize> {
        match self.dynamic_shared.get(kernel) {
            Some(&n) => Ok(n),
            None => bail!("kernel {kernel} is not in the dispatch table"),
        }
    }

    /// Streaming multiprocessors of the device.
    pub fn sms(&self) -> usize {
        self.sms
    }

    /// Blocks of `kernel` (`threads` each, `smem` bytes of dynamic shared memory) that fit
    /// on one multiprocessor at once, as the driver's occupancy calculator counts them (its
    /// registers, shared memory and launch bounds); at least 1. Asked once per shape.
    pub fn resident_blocks(&self, kernel: &str, threads: u32, smem: usize) -> Result<usize> {
        let Some((&name, f)) = self.funcs.get_key_value(kernel) else {
            bail!("kernel {kernel} is not in the dispatch table");
        };
        let mut known = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&n) = known.get(&(name, threads, smem)) {
            return Ok(n);
        }
        let n = f
            .occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)
            .drv(|| format!("occupancy of {kernel}"))?
            .max(1) as usize;
        known.insert((name, threads, smem), n);
        Ok(n)
    }

    /// Device addresses of the tensor-core GEMV's K-split scratch: [`SPLIT_PART_LEN`] floats
    /// of partial sums and [`SPLIT_CNT_LEN`] completion counters, zeroed at open and left
    /// zeroed by every launch (the last block of each pair resets its counter). Launches on
    /// the one stream use it one after another.
    pub fn split_scratch(&self) -> (u64, u64) {
        (self.ptr(&self.split_part), self.ptr(&self.split_cnt))
    }

    /// The stream every launch goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Zeroed device buffer of `n` elements (plain device memory, never managed).
    pub fn alloc<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros::<T>(n.max(1))
            .drv(|| format!("allocating {n} elements on {}", self.name))
    }

    /// Copy a host slice to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        self.stream
            .clone_htod(host)
            .drv(|| format!("uploading {} elements", host.len()))
    }

    /// Overwrite a device buffer from the host.
    pub fn write<T: DeviceRepr>(&self, host: &[T], dst: &mut CudaSlice<T>) -> Result<()> {
        self.stream
            .memcpy_htod(host, dst)
            .drv(|| format!("copying {} elements to the device", host.len()))
    }

    /// Copy a device buffer back (waits for the stream).
    pub fn download<T: DeviceRepr>(&self, src: &CudaSlice<T>) -> Result<Vec<T>> {
        self.stream
            .clone_dtoh(src)
            .drv(|| "copying a device buffer to the host".into())
    }

    /// Copy `bytes` from device address `src` to `dst` on the stream (ordered with the
    /// launches). Both ranges must lie inside live buffers and not overlap: the callers check.
    pub fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the caller guarantees both ranges lie inside allocations of this context
        // that outlive the stream's work, and do not overlap.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream())
        }
        .drv(|| format!("copying {bytes} bytes on the device"))
    }

    /// Raw device address of a buffer, for [`Arg::Ptr`].
    pub fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _guard) = s.device_ptr(&self.stream);
        p
    }

    /// Per kernel: registers per thread, local (spill/stack) bytes and static shared bytes,
    /// sorted by name — the compiler's resource report, read back from the loaded modules.
    pub fn resources(&self) -> Vec<(&'static str, i32, i32, i32)> {
        let mut v: Vec<_> = self
            .funcs
            .iter()
            .map(|(n, f)| {
                (
                    *n,
                    f.num_regs().unwrap_or(-1),
                    f.local_size_bytes().unwrap_or(-1),
                    f.shared_size_bytes().unwrap_or(-1),
                )
            })
            .collect();
        v.sort();
        v
    }

    /// Wait until all queued work is done, surfacing any asynchronous kernel error.
    pub fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .drv(|| "waiting for the GPU".into())
    }

    /// Launch `kernel` on the stream (`cuLaunchKernelEx`), with programmatic stream
    /// serialization allowed when [`Gpu::pdl`]: the kernel's blocks may then start while the
    /// previous kernel on the stream is still finishing. Every engine kernel begins with
    /// `pdl_enter()` (common.cuh) before it touches anything an earlier kernel wrote or reads,
    /// so only weight prefetches overlap. Captured graphs keep the programmatic edges.
    pub fn launch(
        &self,
        kernel: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem_bytes: u32,
        args: &[Arg],
    ) -> Result<()> {
        let Some((&name, f)) = self.funcs.get_key_value(kernel) else {
            bail!("kernel {kernel} is not in the dispatch table");
        };
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        if let Some(tl) = &self.timeline {
            let module = tl.module_of.get(name).copied().unwrap_or(u32::MAX);
            tl.log
                .lock()
                .map_err(|_| anyhow::anyhow!("timeline log poisoned"))?
                .push(Launch {
                    kernel: name,
                    module,
                    blocks: grid.0 * grid.1 * grid.2,
                    threads: block.0 * block.1 * block.2,
                });
        }
        // The driver reads each argument through a pointer to its value; the values live in
        // `args`, which outlives the call.
        let mut params: Vec<*mut std::ffi::c_void> = args
            .iter()
            .map(|a| match a {
                Arg::Ptr(p) | Arg::U64(p) => p as *const u64 as *mut std::ffi::c_void,
                Arg::I32(v) => v as *const i32 as *mut std::ffi::c_void,
                Arg::F32(v) => v as *const f32 as *mut std::ffi::c_void,
            })
            .collect();
        // SAFETY: a zeroed attribute is a valid C struct (id 0, value all zero bytes); the
        // id and the union member set below are the ones the driver reads for it.
        let mut attr: cudarc::driver::sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = cudarc::driver::sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = cudarc::driver::sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(self.pdl),
        };
        self.ctx
            .bind_to_thread()
            .drv(|| "binding the CUDA context".into())?;
        // SAFETY: argument lists match the kernels' signatures (one wrapper per kernel in
        // ops.rs); `params`, `attr` and `cfg` outlive the call, and buffers outlive the launch
        // because callers hold them until a sync.
        unsafe {
            cudarc::driver::sys::cuLaunchKernelEx(
                &cfg,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .drv(|| format!("launching {kernel}"))
    }

    /// Whether launches may overlap the previous kernel's tail (programmatic dependent
    /// launch).
    pub fn pdl(&self) -> bool {
        self.pdl
    }
}
