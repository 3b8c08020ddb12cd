//! A stock vLLM image end to end: flag sets rendered in upstream's dialect launch the stand-in
//! image (the test server printing upstream vLLM's own start-up lines, `MXTUNE_TEST_SM`), and
//! the kernel-path verdicts come from those lines. The image is asked for its vLLM release
//! before each launch (`vllm --version`: the stand-in answers `MXTUNE_TEST_VLLM_VERSION`, baked
//! into image variants) and the launch is rendered in that release's names. Without Docker these
//! tests skip with a message; `MXTUNE_TEST_DOCKER=require` makes that fail.

mod support;

use mxtune::flags::rules::{GpuArch, evaluate};
use mxtune::flags::{FlagSet, MoeBackend, RenderContext, VllmFlavor, render_with};
use mxtune::launch::dialect::render_for_launch;
use mxtune::launch::docker::DockerTarget;
use mxtune::launch::verdict::PathVerdict;
use mxtune::launch::{LaunchEvent, LaunchOptions, Verdict};
use mxtune::vocab::{Dialect, LaunchSpec, NetworkMode, TargetKind};
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

/// The spec a launch renders: the image asked for its vLLM release first.
async fn launch_spec(d: &bollard::Docker, fs: &FlagSet, release: &str) -> LaunchSpec {
    let spec = render_for_launch(fs, TargetKind::Docker, Some(d))
        .await
        .unwrap();
    assert!(
        spec.warnings.is_empty(),
        "a stock image gets no ignored names: {:?}",
        spec.warnings
    );
    assert_eq!(
        spec.dialect,
        Some(Dialect {
            flavour: "upstream".into(),
            vllm_version: Some(release.into()),
            version_source: Some("vllm --version".into()),
            note: None,
        }),
        "rendered for the release the image answered"
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

/// What a launch that became ready showed.
struct Launched {
    /// The kernel-path verdicts.
    checks: Vec<PathVerdict>,
    /// What the launch contributes to the run record.
    observed: mxtune::record::schema::Observed,
}

/// Launches, waits for ready, returns the verdicts, and removes the container.
async fn launch_ready(d: &bollard::Docker, spec: &LaunchSpec, tag: &str) -> Vec<PathVerdict> {
    launch_observed(d, spec, tag).await.checks
}

/// [`launch_ready`], with what the run record would say.
async fn launch_observed(d: &bollard::Docker, spec: &LaunchSpec, tag: &str) -> Launched {
    let o = opts(tag);
    let _cleanup = Cleanup(o.run_id.clone());
    let (tx, _rx) = mpsc::unbounded_channel();
    let mut launch = DockerTarget::launch(d.clone(), spec, &o, tx).await.unwrap();
    let ready = launch.wait_ready().await;
    let report = launch.report();
    let tail = launch.tail(50);
    let observed = mxtune::launch::record::observed(&launch, None);
    launch.stop(o.stop_grace, false).await.unwrap();
    ready.unwrap_or_else(|e| panic!("{tag}: {e:#}\n{tail:#?}"));
    // Checks with only must-not-see patterns stay unknown, so the overall verdict is not
    // `valid`; nothing may be invalid.
    assert!(
        report.checks.iter().all(|c| c.verdict != Verdict::Invalid),
        "{tag}: {report:#?}"
    );
    Launched {
        checks: report.checks,
        observed,
    }
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
    let spec = launch_spec(&d, &fs, "0.11.2").await;
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
    let spec = launch_spec(&d, &fs, "0.11.2").await;
    // 0.11 names the attention backend through its environment variable.
    assert_eq!(spec.env["VLLM_ATTENTION_BACKEND"], "TRITON_ATTN");
    assert!(!spec.argv.contains(&"--attention-backend".to_string()));
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
    let spec = launch_spec(&d, &fs, "0.11.2").await;
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
        ..Default::default()
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

/// Containers of `image` left by the version probe.
async fn probe_leftovers(d: &bollard::Docker, image: &str) -> Vec<String> {
    let filters = std::collections::HashMap::from([
        (
            "label".to_string(),
            vec![mxtune::launch::docker::LABEL_PROBE.to_string()],
        ),
        ("ancestor".to_string(), vec![image.to_string()]),
    ]);
    let opts = bollard::query_parameters::ListContainersOptions {
        all: true,
        filters: Some(filters),
        ..Default::default()
    };
    d.list_containers(Some(opts))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|c| c.id)
        .collect()
}

/// The release the image carries is asked before the launch and decides the names: 0.12 takes
/// the attention backend from `VLLM_ATTENTION_BACKEND` (and, like 0.12, the stand-in refuses
/// `--attention-backend`), 0.13 from `--attention-backend`. The banner confirms the release and
/// the run record keeps dialect, rendered release and announced release.
#[tokio::test]
async fn stock_image_release_is_asked_before_launch_and_decides_the_names() {
    let Some(d) =
        docker_or_skip("stock_image_release_is_asked_before_launch_and_decides_the_names").await
    else {
        return;
    };
    for (release, env_form) in [("0.12.0", true), ("0.13.0", false)] {
        let image = test_image_with_env(&d, &[("MXTUNE_TEST_VLLM_VERSION", release)]).await;
        let fs = stock(&image, free_port(), "121", |f| {
            f.axes.moe_backend = MoeBackend::Marlin;
            f.set_axis("attention_backend", "TRITON_ATTN").unwrap();
        });
        let spec = launch_spec(&d, &fs, release).await;
        assert_eq!(
            probe_leftovers(&d, &image).await,
            Vec::<String>::new(),
            "{release}: the version probe removes its container"
        );
        let flag_form = spec
            .argv
            .windows(2)
            .any(|w| w[0] == "--attention-backend" && w[1] == "TRITON_ATTN");
        let env = spec.env.get("VLLM_ATTENTION_BACKEND").map(String::as_str);
        if env_form {
            assert_eq!((env, flag_form), (Some("TRITON_ATTN"), false), "{release}");
        } else {
            assert_eq!((env, flag_form), (None, true), "{release}");
        }
        let l = launch_observed(&d, &spec, &format!("release-{release}")).await;
        assert_eq!(
            check(&l.checks, "attention_backend").verdict,
            Verdict::Valid,
            "{release}: {:#?}",
            l.checks
        );
        assert_eq!(check(&l.checks, "moe_backend").verdict, Verdict::Valid);
        assert_eq!(l.observed.vllm_version.as_deref(), Some(release));
        assert!(
            !l.observed
                .warnings
                .iter()
                .any(|w| w.contains("announces vLLM")),
            "{release}: {:?}",
            l.observed.warnings
        );
        // The run record says which dialect and release were used, and what the image said.
        let mut r = mxtune::record::begin(TargetKind::Docker, Some("stock".into()), &[]);
        r.target.launch = Some(spec.clone());
        r.observed = l.observed;
        let json = serde_json::to_value(&r).unwrap();
        let dialect = &json["target"]["launch"]["dialect"];
        assert_eq!(dialect["flavour"], "upstream");
        assert_eq!(dialect["vllm_version"], release);
        assert_eq!(dialect["version_source"], "vllm --version");
        assert_eq!(json["observed"]["vllm_version"], release);
    }
}

/// When the release cannot be known the launch is rendered for the newest known release and
/// says so; the banner then shows what the image really is, and the disagreement is a warning.
#[tokio::test]
async fn unknown_release_renders_for_the_newest_known_and_says_so() {
    let Some(d) = docker_or_skip("unknown_release_renders_for_the_newest_known_and_says_so").await
    else {
        return;
    };
    let newest = mxtune::flags::versions::NEWEST_KNOWN.to_string();
    // No Docker engine to ask (as `presets show` renders).
    let image = test_image(&d).await;
    let fs = stock(&image, free_port(), "121", |f| {
        f.axes.moe_backend = MoeBackend::Marlin
    });
    let spec = render_for_launch(&fs, TargetKind::Docker, None)
        .await
        .unwrap();
    let dialect = spec.dialect.clone().unwrap();
    assert_eq!(dialect.vllm_version.as_deref(), Some(newest.as_str()));
    assert_eq!(dialect.version_source.as_deref(), Some("assumed"));
    let note = dialect.note.unwrap();
    assert!(
        note.contains("version is unknown") && note.contains("no Docker engine"),
        "{note}"
    );
    let l = launch_observed(&d, &spec, "assumed").await;
    assert_eq!(l.observed.vllm_version.as_deref(), Some("0.11.2"));
    let want =
        format!("the image announces vLLM 0.11.2, but the launch was rendered for vLLM {newest}");
    assert!(
        l.observed.warnings.iter().any(|w| w.contains(&want)),
        "{:?}",
        l.observed.warnings
    );

    // An image whose `vllm --version` says no version: rendered for the newest known, and why.
    let mute = test_image_with_env(&d, &[("MXTUNE_TEST_VLLM_VERSION", "unknown")]).await;
    let fs = stock(&mute, free_port(), "121", |_| {});
    let spec = render_for_launch(&fs, TargetKind::Docker, Some(&d))
        .await
        .unwrap();
    let dialect = spec.dialect.unwrap();
    assert_eq!(dialect.version_source.as_deref(), Some("assumed"));
    let note = dialect.note.unwrap();
    assert!(
        note.contains("`vllm --version` in image") && note.contains("printed no version"),
        "{note}"
    );
    assert_eq!(probe_leftovers(&d, &mute).await, Vec::<String>::new());
}

/// A release that cannot say a value refuses it at render time, naming the first that can.
#[tokio::test]
async fn a_value_the_images_release_cannot_say_is_refused_before_launch() {
    let Some(d) =
        docker_or_skip("a_value_the_images_release_cannot_say_is_refused_before_launch").await
    else {
        return;
    };
    let image = test_image_with_env(&d, &[("MXTUNE_TEST_VLLM_VERSION", "0.10.1")]).await;
    let fs = stock(&image, free_port(), "121", |f| {
        f.set_axis("moe_backend", "cutlass").unwrap()
    });
    let err = render_for_launch(&fs, TargetKind::Docker, Some(&d))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot be expressed on vLLM 0.10.1")
            && err.contains(
                "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS first appears in vLLM 0.10.2"
            ),
        "{err}"
    );
}

/// The panel's launch view shows the release a stock image was rendered for and the one its
/// banner announced.
#[test]
fn panel_launch_view_shows_the_images_vllm_release() {
    use mxtune::flags::preset::PresetStore;
    use mxtune::tui::app::{App, Effect, Paths};
    use mxtune::tui::screens::launch::TargetState;
    use mxtune::tui::{perform, step, ui};

    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(d) = rt.block_on(docker_or_skip(
        "panel_launch_view_shows_the_images_vllm_release",
    )) else {
        return;
    };
    let image = rt.block_on(test_image_with_env(
        &d,
        &[("MXTUNE_TEST_VLLM_VERSION", "0.12.0")],
    ));
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut bg = mxtune::tui::background::Background::new(tx).unwrap();
    let theme = mxtune::tui::theme::Theme {
        color: false,
        ascii: false,
    };
    let mut app = App::new(
        theme,
        Paths {
            presets: PresetStore::new(vec![dir.path().join("presets")]),
            save_dir: dir.path().join("presets"),
            runs_dir: dir.path().join("runs"),
            export_dir: dir.path().to_path_buf(),
        },
    );
    app.flags.flags = stock(&image, free_port(), "121", |f| {
        f.axes.moe_backend = MoeBackend::Marlin;
        f.set_axis("attention_backend", "TRITON_ATTN").unwrap();
    });
    app.launch.choice = TargetKind::Docker;
    app.launch.state = TargetState::Launching;
    perform(&mut app, &mut bg, Effect::StartTarget);
    let mut cleanup = None;
    while !matches!(app.launch.state, TargetState::Ready { .. }) {
        if let TargetState::Failed(m) = &app.launch.state {
            panic!("the panel's launch failed: {m}\n{:?}", app.launch.log.lines);
        }
        let ev = rx.recv().unwrap();
        step(&mut app, &mut bg, ev);
        if cleanup.is_none()
            && let Some(id) = &app.launch.run_id
        {
            cleanup = Some(Cleanup(id.clone()));
        }
    }
    app.tab = mxtune::tui::app::Tab::Launch;
    let mut terminal = ratatui::Terminal::new(ratatui::backend::TestBackend::new(120, 30)).unwrap();
    terminal.draw(|f| ui::draw(f, &app)).unwrap();
    let screen = terminal.backend().to_string();
    assert!(
        screen.contains("vLLM upstream dialect, rendered for 0.12.0 (vllm --version)")
            && screen.contains("image says 0.12.0"),
        "{screen}"
    );
    perform(&mut app, &mut bg, Effect::StopTarget);
    while !matches!(app.launch.state, TargetState::Exited(_)) {
        let ev = rx.recv().unwrap();
        step(&mut app, &mut bg, ev);
    }
    drop(cleanup);
}

/// The panel's Docker launch runs `mxtune launch`'s pre-flight against the real engine: an
/// image that is not there blocks it (the same finding as the CLI's, without `--pull`, which
/// the panel has not), the missing cache is only announced, and nothing is created.
#[test]
fn panel_docker_launch_without_its_image_is_refused_by_preflight() {
    use mxtune::launch::preflight::{BLOCKED, Severity};
    use mxtune::tui::app::{App, Effect, Paths};
    use mxtune::tui::screens::launch::TargetState;
    use mxtune::tui::{perform, step};

    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(d) = rt.block_on(docker_or_skip(
        "panel_docker_launch_without_its_image_is_refused_by_preflight",
    )) else {
        return;
    };
    let image = "mxtune-test-no-such-image:1";
    let dir = tempfile::tempdir().unwrap();
    let jit = dir.path().join("jit");
    let name = format!("mxtune-preflight-{}", ulid::Ulid::generate()).to_lowercase();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut bg = mxtune::tui::background::Background::new(tx).unwrap();
    let mut app = App::new(
        mxtune::tui::theme::Theme {
            color: false,
            ascii: false,
        },
        Paths {
            presets: mxtune::flags::preset::PresetStore::new(vec![dir.path().join("presets")]),
            save_dir: dir.path().join("presets"),
            runs_dir: dir.path().join("runs"),
            export_dir: dir.path().to_path_buf(),
        },
    );
    app.flags.flags = stock(image, free_port(), "121", |f| {
        f.container.jit_cache = Some(jit.display().to_string());
        f.container.name = Some(name.clone());
    });
    app.launch.choice = TargetKind::Docker;
    app.launch.state = TargetState::Launching;
    perform(&mut app, &mut bg, Effect::StartTarget);
    while !matches!(
        app.launch.state,
        TargetState::Failed(_) | TargetState::Ready { .. }
    ) {
        let ev = rx.recv().unwrap();
        step(&mut app, &mut bg, ev);
    }
    assert_eq!(
        app.launch.state,
        TargetState::Failed(BLOCKED.into()),
        "{:?}",
        app.launch.log.lines
    );
    let findings = app.launch.preflight.clone().expect("the findings arrived");
    let errors: Vec<&str> = findings
        .iter()
        .filter(|f| f.finding.severity == Severity::Error)
        .map(|f| f.finding.message.as_str())
        .collect();
    assert_eq!(
        errors,
        vec![format!(
            "image {image} is not present on {}: pull it (`docker pull {image}`) or build it there",
            mxtune::launch::docker::docker_host()
        )],
        "{findings:?}"
    );
    assert!(
        findings
            .iter()
            .any(|f| f.finding.severity == Severity::Warning
                && f.finding
                    .message
                    .starts_with(&format!("mount source {}", jit.display()))),
        "{findings:?}"
    );
    // Nothing was started or created: no container of that name, no cache, no run.
    assert!(
        rt.block_on(d.inspect_container(&name, None)).is_err(),
        "a container {name} exists"
    );
    assert!(!jit.exists(), "a blocked launch created {}", jit.display());
    assert_eq!(app.launch.run_id, None);
}

/// A preset file `name` for the stock image `image` (Marlin, attention named, a free port);
/// returns its container name.
fn stock_preset(dir: &std::path::Path, name: &str, image: &str) -> String {
    let container = format!("mxtune-{name}-{}", ulid::Ulid::generate()).to_lowercase();
    let presets = dir.join("presets");
    std::fs::create_dir_all(&presets).unwrap();
    std::fs::write(
        presets.join(format!("{name}.toml")),
        format!(
            "description = \"stock image test\"\ntarget = \"docker\"\n\
             [axes]\nmoe_backend = \"marlin\"\nattention_backend = \"TRITON_ATTN\"\n\
             [serving]\nmodel = \"openai/gpt-oss-120b\"\nserved_model_name = \"m\"\nhost = \"0.0.0.0\"\nport = {}\n\
             [container]\nimage = \"{image}\"\nname = \"{container}\"\nnetwork = \"bridge\"\ngpus_all = false\nulimits = {{}}\n\
             vllm = \"upstream\"\nhf_cache = \"{}\"\njit_cache = \"{}\"\n\
             [container.env]\nMXTUNE_TEST_SM = \"121\"\n",
            free_port(),
            dir.join("hf").display(),
            dir.join("jit").display()
        ),
    )
    .unwrap();
    container
}

/// `mxtune launch` asks the image, says which release it rendered for and what the image
/// announced; a `mxtune matrix` run record keeps both.
#[tokio::test]
async fn cli_launch_and_matrix_record_name_the_release() {
    let Some(d) = docker_or_skip("cli_launch_and_matrix_record_name_the_release").await else {
        return;
    };
    let image = test_image_with_env(&d, &[("MXTUNE_TEST_VLLM_VERSION", "0.12.0")]).await;
    let dir = tempfile::tempdir().unwrap();
    let container = stock_preset(dir.path(), "stock-cli", &image);
    let mxtune = |args: Vec<std::ffi::OsString>| {
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_mxtune"))
                .args(args)
                .output()
                .unwrap()
        })
    };
    let presets = dir.path().join("presets");
    let runs = dir.path().join("runs");
    let out = mxtune(vec![
        "launch".into(),
        "--preset".into(),
        "stock-cli".into(),
        "--presets-dir".into(),
        presets.clone().into(),
        "--runs-dir".into(),
        runs.clone().into(),
    ])
    .await
    .unwrap();
    let found = mxtune::launch::docker::find_mxtune_containers(&d)
        .await
        .unwrap();
    let _cleanup = Cleanup(
        found
            .iter()
            .find(|f| f.name == container)
            .map(|f| f.run_id.clone())
            .unwrap_or_default(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stderr.contains("dialect: upstream vLLM 0.12.0 (vllm --version)"),
        "{stderr}"
    );
    assert!(
        stdout.contains("vLLM version announced by the target: 0.12.0")
            && stdout.contains("attention_backend=TRITON_ATTN: Valid"),
        "{stdout}"
    );
    let stop = mxtune(vec!["stop".into(), container.clone().into()])
        .await
        .unwrap();
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );

    let container = stock_preset(dir.path(), "stock-matrix", &image);
    let matrix_out = dir.path().join("out");
    let m = mxtune(vec![
        "matrix".into(),
        "--target".into(),
        "docker".into(),
        "stock-matrix".into(),
        "--levels".into(),
        "1,1.5".into(),
        "--presets-dir".into(),
        presets.into(),
        "--runs-dir".into(),
        runs.into(),
        "--out".into(),
        matrix_out.clone().into(),
    ])
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&m.stderr).into_owned();
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(matrix_out.join("matrix-state.json")).unwrap(),
    )
    .unwrap();
    let record = state["order"][0]["record"]
        .as_str()
        .unwrap_or_else(|| panic!("no record: {state}\n{stderr}"));
    let rec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(record).unwrap()).unwrap();
    let dialect = &rec["target"]["launch"]["dialect"];
    assert_eq!(dialect["flavour"], "upstream", "{rec}");
    assert_eq!(dialect["vllm_version"], "0.12.0", "{rec}");
    assert_eq!(dialect["version_source"], "vllm --version", "{rec}");
    assert_eq!(rec["observed"]["vllm_version"], "0.12.0", "{rec}");
    assert_eq!(
        rec["target"]["launch"]["env"]["VLLM_ATTENTION_BACKEND"], "TRITON_ATTN",
        "{rec}"
    );
    let left = mxtune::launch::docker::find_mxtune_containers(&d)
        .await
        .unwrap();
    assert!(!left.iter().any(|f| f.name == container), "{left:?}");
}
