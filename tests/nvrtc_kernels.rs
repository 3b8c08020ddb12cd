//! Every engine kernel must compile with NVRTC for Hopper (sm_90a) and GB10 (sm_121a). Needs
//! NVRTC but no GPU. Without NVRTC the tests skip with a message, unless
//! `MXTUNE_TEST_NVRTC=require` (CI), where a missing NVRTC fails them.

use mxtune::engine::cuda::compile::{CubinOrigin, KERNEL_FILES, KernelCache, compile_cubin};
use mxtune::engine::cuda::libs;

fn nvrtc_or_skip(test: &str) -> bool {
    match libs::ensure_nvrtc() {
        Ok(()) => true,
        Err(e) => {
            if std::env::var("MXTUNE_TEST_NVRTC").as_deref() == Ok("require") {
                panic!("{test}: MXTUNE_TEST_NVRTC=require but NVRTC is unavailable: {e:#}");
            }
            eprintln!("SKIPPED {test}: NVRTC unavailable ({e:#}); set MXTUNE_NVRTC_LIB_DIR");
            false
        }
    }
}

/// An ELF cubin for the requested machine: checks the magic and that every entry point's
/// name is in the image (a missing `extern "C"` would otherwise only show on the GPU).
fn assert_cubin(bytes: &[u8], file: &str, arch: &str, entries: &[&str]) {
    assert!(
        bytes.len() > 64,
        "{file} {arch}: cubin of {} bytes",
        bytes.len()
    );
    assert_eq!(&bytes[..4], b"\x7fELF", "{file} {arch}: not an ELF cubin");
    for e in entries {
        let found = bytes.windows(e.len()).any(|w| w == e.as_bytes());
        assert!(
            found,
            "{file} {arch}: entry point {e} missing from the cubin"
        );
    }
}

#[test]
fn nvrtc_compiles_every_kernel_for_sm90a_and_sm121a() {
    if !nvrtc_or_skip("nvrtc_compiles_every_kernel_for_sm90a_and_sm121a") {
        return;
    }
    assert!(!KERNEL_FILES.is_empty());
    for arch in ["sm_90a", "sm_121a"] {
        for f in KERNEL_FILES {
            let cubin =
                compile_cubin(f.name, &f.full_source(), arch).unwrap_or_else(|e| panic!("{e:#}"));
            assert_cubin(&cubin, f.name, arch, f.entries);
        }
    }
}

#[test]
fn nvrtc_every_kernel_file_is_in_the_dispatch_table() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("engine-kernels");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cu"))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = KERNEL_FILES.iter().map(|f| f.name.to_string()).collect();
    listed.sort();
    assert_eq!(
        on_disk, listed,
        "engine-kernels/*.cu and KERNEL_FILES differ"
    );
}

#[test]
fn nvrtc_reports_a_compile_error_with_the_log() {
    if !nvrtc_or_skip("nvrtc_reports_a_compile_error_with_the_log") {
        return;
    }
    let err = compile_cubin(
        "broken.cu",
        "extern \"C\" __global__ void k() { nope(); }",
        "sm_90a",
    )
    .unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("broken.cu") && msg.contains("nope"), "{msg}");
}

#[test]
fn nvrtc_warm_cache_compiles_nothing() {
    if !nvrtc_or_skip("nvrtc_warm_cache_compiles_nothing") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::at(dir.path().join("kernels"));
    let file = &KERNEL_FILES[0];
    let (cold, origin) = cache.cubin(file, "sm_121a").unwrap();
    assert_eq!(origin, CubinOrigin::Compiled);
    let (warm, origin) = cache.cubin(file, "sm_121a").unwrap();
    assert_eq!(origin, CubinOrigin::Cached);
    assert_eq!(cold, warm);
    // A different architecture is a different key.
    let (_, origin) = cache.cubin(file, "sm_90a").unwrap();
    assert_eq!(origin, CubinOrigin::Compiled);
    let n = std::fs::read_dir(cache.dir()).unwrap().count();
    assert_eq!(n, 2, "one cubin per (file, arch)");
}
