//! A stock vLLM image end to end: flag sets rendered in upstream's dialect launch the stand-in
//! image (the test server printing upstream vLLM's own start-up lines, `MXTUNE_TEST_SM`), and
//! the kernel-path verdicts come from those lines. Without Docker these tests skip with a
//! message; `MXTUNE_TEST_DOCKER=require` makes that fail.

mod support;

use mxtune::flags::rules::{GpuArch, evaluate};
use mxtune::flags::{FlagSet, MoeBackend, RenderContext, VllmFlavor, render_with};
use mxtune::launch::docker::DockerTarget;
use mxtune::launch::verdict::PathVerdict;
use mxtune::launch::{LaunchEvent, LaunchOptions, Verdict};
use mxtune::vocab::{LaunchSpec, NetworkMode, TargetKind};
use std::collections::BTreeMap;
use support::*;
use tokio::sync::mpsc;

/// An upstream-flavour flag set for the stand-in image on `port`, on a GPU of capability `sm`.
fn stock(image: &str, port: u16, sm: &str, f: impl FnOnce(&mut FlagSet)) -> FlagSet {
    let mut fs = FlagSet::default();
    fs.container.vllm = VllmFlavor::Upstream;
    fs.container.image = image.into();
    fs.container.network = NetworkMode::Bridge;
    fs.container.gpus_all = false;
    fs.container.ulimits = BTreeMap::new();
    fs.container.hf_cache = None;
    fs.container.jit_cache = None;
    fs.container.env = BTreeMap::from([("MXTUNE_TEST_SM".to_string(), sm.to_string())]);
    fs.serving.host = Some("0.0.0.0".into());
    fs.serving.port = port;
    fs.serving.served_model_name = Some("m".into());
    f(&mut fs);
    fs
}

fn spec(fs: &FlagSet) -> LaunchSpec {
    let ctx = RenderContext {
        home: Some("/nonexistent".into()),
    };
    let spec = render_with(fs, TargetKind::Docker, &ctx).unwrap();
    assert!(
        spec.warnings.is_empty(),
        "a stock image gets no ignored names: {:?}",
        spec.warnings
    );
    spec
}

fn opts(tag: &str) -> LaunchOptions {
    let run_id = format!("test-upstream-{tag}-{}", ulid::Ulid::generate());
    let mut o = LaunchOptions::new(&run_id, "test-upstream").unwrap();
    o.ready_poll = std::time::Duration::from_millis(200);
    o.stop_grace = std::time::Duration::from_secs(5);
    o
}

fn check<'a>(checks: &'a [PathVerdict], flag: &str) -> &'a PathVerdict {
    checks
        .iter()
        .find(|c| c.flag == flag)
        .unwrap_or_else(|| panic!("no {flag} check in {checks:?}"))
}

/// Launches, waits for ready, returns the verdicts, and removes the container.
async fn launch_ready(d: &bollard::Docker, spec: &LaunchSpec, tag: &str) -> Vec<PathVerdict> {
    let o = opts(tag);
    let _cleanup = Cleanup(o.run_id.clone());
    let (tx, _rx) = mpsc::unbounded_channel();
    let mut launch = DockerTarget::launch(d.clone(), spec, &o, tx).await.unwrap();
    let ready = launch.wait_ready().await;
    let report = launch.report();
    let tail = launch.tail(50);
    launch.stop(o.stop_grace, false).await.unwrap();
    ready.unwrap_or_else(|e| panic!("{tag}: {e:#}\n{tail:#?}"));
    // Checks with only must-not-see patterns stay unknown, so the overall verdict is not
    // `valid`; nothing may be invalid.
    assert!(
        report.checks.iter().all(|c| c.verdict != Verdict::Invalid),
        "{tag}: {report:#?}"
    );
    report.checks
}

#[tokio::test]
async fn stock_image_marlin_chosen_is_valid() {
    let Some(d) = docker_or_skip("stock_image_marlin_chosen_is_valid").await else {
        return;
    };
    let image = test_image(&d).await;
    let fs = stock(&image, free_port(), "121", |f| {
        f.axes.moe_backend = MoeBackend::Marlin
    });
    let spec = spec(&fs);
    assert_eq!(spec.env["VLLM_MXFP4_USE_MARLIN"], "1");
    assert!(!spec.env.contains_key("VLLM_MXFP4_BACKEND"));
    let checks = launch_ready(&d, &spec, "marlin").await;
    let moe = check(&checks, "moe_backend");
    assert_eq!(moe.verdict, Verdict::Valid);
    assert!(
        moe.seen
            .iter()
            .any(|l| l.ends_with("Using 'MARLIN' Mxfp4 MoE backend.")),
        "{moe:?}"
    );
    assert_eq!(check(&checks, "cuda_graphs").verdict, Verdict::Valid);
}

#[tokio::test]
async fn stock_image_cutlass_mxfp8_chosen_is_valid() {
    let Some(d) = docker_or_skip("stock_image_cutlass_mxfp8_chosen_is_valid").await else {
        return;
    };
    let image = test_image(&d).await;
    let fs = stock(&image, free_port(), "121", |f| {
        f.set_axis("moe_backend", "cutlass").unwrap();
        f.set_axis("attention_backend", "TRITON_ATTN").unwrap();
        f.set_axis("cuda_graphs", "off").unwrap();
    });
    let spec = spec(&fs);
    assert_eq!(
        spec.env["VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS"], "1",
        "{:?}",
        spec.env
    );
    let checks = launch_ready(&d, &spec, "cutlass").await;
    for flag in [
        "moe_backend",
        "activation",
        "attention_backend",
        "cuda_graphs",
    ] {
        assert_eq!(
            check(&checks, flag).verdict,
            Verdict::Valid,
            "{flag}: {checks:#?}"
        );
    }
    assert!(
        check(&checks, "moe_backend")
            .seen
            .iter()
            .any(|l| l.contains("'FLASHINFER_CUTLASS_MXFP4_MXFP8'")),
        "{checks:#?}"
    );
}

#[tokio::test]
async fn stock_image_refusing_an_explicit_backend_fails_with_an_invalid_verdict() {
    let Some(d) =
        docker_or_skip("stock_image_refusing_an_explicit_backend_fails_with_an_invalid_verdict")
            .await
    else {
        return;
    };
    let image = test_image(&d).await;
    let fs = stock(&image, free_port(), "121", |f| {
        f.axes.moe_backend = MoeBackend::TrtllmMxfp8
    });
    // Knowing the GPU, the rules stop it before launch; not knowing it, the image refuses.
    let sm121: GpuArch = "sm121".parse().unwrap();
    assert!(
        evaluate(&fs, TargetKind::Docker, Some(sm121))
            .iter()
            .any(|f| f.rule == "trtllm-sm100-only" && f.blocks())
    );
    let spec = spec(&fs);
    let o = opts("refused");
    let _cleanup = Cleanup(o.run_id.clone());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut launch = DockerTarget::launch(d.clone(), &spec, &o, tx)
        .await
        .unwrap();
    let err = format!("{:#}", launch.wait_ready().await.unwrap_err());
    assert!(err.contains("fatal log line"), "{err}");
    // The log is read to its end before the exit is reported: then the verdict is complete.
    while let Some(e) = rx.recv().await {
        if matches!(e, LaunchEvent::Exited { .. }) {
            break;
        }
    }
    let report = launch.report();
    let moe = check(&report.checks, "moe_backend");
    assert_eq!(moe.verdict, Verdict::Invalid, "{moe:#?}");
    assert!(
        moe.forbidden_seen.iter().any(|l| l.contains(
            "Mxfp4 MoE backend 'FLASHINFER_TRTLLM_MXFP4_MXFP8' does not support the deployment configuration"
        )),
        "{moe:#?}"
    );
    assert_eq!(report.overall(), Verdict::Invalid);
    launch.stop(o.stop_grace, false).await.unwrap();
}

#[test]
fn upstream_presets_pick_each_backend_and_share_one_editable_image() {
    use mxtune::flags::preset::PresetStore;
    let dir = tempfile::tempdir().unwrap();
    // The operator points every upstream-* preset at another image in one place.
    std::fs::write(
        dir.path().join("upstream-baseline.toml"),
        "extends = \"upstream-baseline\"\n[container]\nimage = \"nvcr.io/nvidia/vllm:spark\"\n",
    )
    .unwrap();
    let store = PresetStore::standard(Some(dir.path().to_path_buf()));
    let ctx = RenderContext {
        home: Some("/home/op".into()),
    };
    for (name, var, value) in [
        ("upstream-marlin", "VLLM_MXFP4_USE_MARLIN", "1"),
        (
            "upstream-cutlass-mxfp8",
            "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS",
            "1",
        ),
        (
            "upstream-cutlass-bf16",
            "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16",
            "1",
        ),
        ("upstream-trtllm", "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16", "1"),
        (
            "upstream-trtllm-mxfp8",
            "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8",
            "1",
        ),
    ] {
        let p = store.load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(p.flags.container.vllm, VllmFlavor::Upstream, "{name}");
        let spec = render_with(&p.flags, TargetKind::Docker, &ctx).unwrap();
        assert_eq!(
            spec.env.get(var).map(String::as_str),
            Some(value),
            "{name}: {:?}",
            spec.env
        );
        assert!(spec.warnings.is_empty(), "{name}: {:?}", spec.warnings);
        assert_eq!(
            spec.container.unwrap().image,
            "nvcr.io/nvidia/vllm:spark",
            "{name}"
        );
        let moe = spec
            .checks
            .iter()
            .find(|c| c.flag == "moe_backend")
            .unwrap();
        assert!(
            moe.must_see[0].contains("Mxfp4 MoE backend"),
            "{name}: {moe:?}"
        );
    }
}
