//! Finding CUDA's shared libraries before cudarc touches them: cudarc (dynamic loading) panics
//! when the driver or NVRTC library is missing, so every entry point checks here first and
//! turns a missing library into an error the caller can fall back from.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

/// Environment variable naming a directory that holds `libnvrtc.so.*` (e.g. the PyPI wheel's
/// `site-packages/nvidia/cu13/lib`); it is loaded from there before the usual search path.
pub const NVRTC_DIR_ENV: &str = "MXTUNE_NVRTC_LIB_DIR";

/// Check that the CUDA driver library (libcuda) can be loaded. Cached after the first call.
pub fn ensure_driver() -> Result<()> {
    static DRIVER: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let found = DRIVER.get_or_init(|| {
        // SAFETY: only probes whether the library can be dlopen'ed; calls nothing in it.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            Ok(())
        } else {
            Err(format!(
                "the CUDA driver library was not found (tried {:?}); install the NVIDIA driver \
                 or run on the CPU backend",
                cudarc::get_lib_name_candidates("cuda")
            ))
        }
    });
    found.clone().map_err(anyhow::Error::msg)
}

/// Check that NVRTC can be loaded, first from `$MXTUNE_NVRTC_LIB_DIR` when it is set.
/// Cached after the first call.
pub fn ensure_nvrtc() -> Result<()> {
    static NVRTC: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let found = NVRTC.get_or_init(|| {
        if let Some(dir) = std::env::var_os(NVRTC_DIR_ENV) {
            preload_nvrtc_dir(Path::new(&dir)).map_err(|e| format!("{e:#}"))?;
        }
        // SAFETY: only probes whether the library can be dlopen'ed; calls nothing in it.
        if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            Ok(())
        } else {
            Err(format!(
                "NVRTC (libnvrtc.so) was not found (tried {:?}); install the CUDA toolkit or \
                 `pip install nvidia-cuda-nvrtc` and set {NVRTC_DIR_ENV} to its lib directory",
                cudarc::get_lib_name_candidates("nvrtc")
            ))
        }
    });
    found.clone().map_err(anyhow::Error::msg)
}

/// dlopen the builtins library and then libnvrtc from `dir` with RTLD_GLOBAL, so that the
/// later dlopen by soname (cudarc's) and libnvrtc's own dlopen of its builtins resolve to
/// these already-loaded copies without LD_LIBRARY_PATH.
fn preload_nvrtc_dir(dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("reading {NVRTC_DIR_ENV}={}", dir.display()))?;
    let mut builtins: Vec<PathBuf> = Vec::new();
    let mut main: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let path = entry
            .with_context(|| format!("listing {}", dir.display()))?
            .path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("libnvrtc-builtins.so") {
            builtins.push(path);
        } else if name.starts_with("libnvrtc.so") {
            main.push(path);
        }
    }
    if main.is_empty() {
        bail!(
            "{NVRTC_DIR_ENV}={} holds no libnvrtc.so*; point it at the directory of \
             libnvrtc.so.13 (pip: site-packages/nvidia/cu13/lib)",
            dir.display()
        );
    }
    // Longest name first: the versioned file (libnvrtc.so.13) rather than a dev symlink.
    main.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for lib in builtins.iter().chain(main.iter().take(1)) {
        dlopen_global(lib)?;
    }
    Ok(())
}

fn dlopen_global(path: &Path) -> Result<()> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .with_context(|| format!("library path {} contains a NUL byte", path.display()))?;
    // SAFETY: dlopen with a valid C string; the handle is kept for the process lifetime on
    // purpose (cudarc holds its own handle to the same library).
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a thread-local C string or null.
        let err = unsafe { libc::dlerror() };
        let msg = if err.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: non-null dlerror result is a valid C string.
            unsafe { std::ffi::CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()
        };
        bail!("could not load {}: {msg}", path.display());
    }
    Ok(())
}
