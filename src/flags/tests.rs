//! Unit tests of the flag tables, rendering for both targets, rules and the generated docs.

use super::axes::*;
use super::model::*;
use super::names;
use super::render::{RenderContext, docker_run_argv, render_with};
use super::rules::{Applies, GpuArch, RULES, Severity, evaluate};
use crate::vocab::{LaunchSpec, NetworkMode, TargetKind};

fn ctx() -> RenderContext {
    RenderContext {
        home: Some("/home/op".into()),
        ..Default::default()
    }
}

fn docker(fs: &FlagSet) -> LaunchSpec {
    render_with(fs, TargetKind::Docker, &ctx()).expect("docker render")
}

fn engine(fs: &FlagSet) -> LaunchSpec {
    render_with(fs, TargetKind::Engine, &ctx()).expect("engine render")
}

/// Whether `argv` holds `flag` immediately followed by `value`.
fn has_pair(argv: &[String], flag: &str, value: &str) -> bool {
    argv.windows(2).any(|w| w[0] == flag && w[1] == value)
}

/// A flag set on the fork's image (the dialect most tables here describe), changed by `f`.
fn with(f: impl FnOnce(&mut FlagSet)) -> FlagSet {
    let mut fs = FlagSet::default();
    fs.container.vllm = VllmFlavor::Fork;
    f(&mut fs);
    fs
}

#[test]
fn moe_backend_renders_per_target() {
    let cases = [
        (
            MoeBackend::Marlin,
            Some(("VLLM_MXFP4_BACKEND", "MARLIN")),
            None,
        ),
        (
            MoeBackend::Cutlass,
            Some(("VLLM_MXFP4_BACKEND", "CUTLASS")),
            None,
        ),
        (
            MoeBackend::Triton,
            Some(("VLLM_MXFP4_BACKEND", "TRITON")),
            None,
        ),
        (
            MoeBackend::Trtllm,
            Some(("VLLM_MXFP4_BACKEND", "TRTLLM")),
            None,
        ),
        (
            MoeBackend::TrtllmMxfp8,
            Some(("VLLM_MXFP4_BACKEND", "TRTLLM_MXFP8")),
            None,
        ),
        (
            MoeBackend::Gemv,
            Some(("VLLM_MXFP4_MOE_KERNEL", "gemv")),
            Some("gemv"),
        ),
        (MoeBackend::Grouped, None, Some("grouped")),
        (MoeBackend::Auto, None, Some("auto")),
    ];
    for (v, env, eng) in cases {
        let fs = with(|f| f.axes.moe_backend = v);
        match (v, env) {
            (_, Some((k, val))) => {
                assert_eq!(docker(&fs).env.get(k).map(String::as_str), Some(val))
            }
            (MoeBackend::Auto, None) => {
                let d = docker(&fs);
                assert!(!d.env.contains_key("VLLM_MXFP4_BACKEND"));
                assert!(!d.env.contains_key("VLLM_MXFP4_MOE_KERNEL"));
            }
            (_, None) => {
                let err = render_with(&fs, TargetKind::Docker, &ctx())
                    .unwrap_err()
                    .to_string();
                assert!(
                    err.contains("axes.moe_backend") && err.contains("marlin"),
                    "{err}"
                );
            }
        }
        match eng {
            Some(val) => assert!(has_pair(&engine(&fs).argv, "--moe-kernel", val), "{v:?}"),
            None => assert!(
                render_with(&fs, TargetKind::Engine, &ctx()).is_err(),
                "{v:?}"
            ),
        }
    }
}

#[test]
fn activation_renders_per_target_and_warns_planned() {
    let d = docker(&with(|f| f.axes.activation = Activation::Mxfp8));
    assert_eq!(d.env["VLLM_MXFP4_ACTIVATION"], "mxfp8");
    assert!(
        d.warnings
            .iter()
            .any(|w| w.contains("VLLM_MXFP4_ACTIVATION") && w.contains("planned"))
    );
    assert_eq!(
        docker(&with(|f| f.axes.activation = Activation::Fp8)).env["VLLM_MXFP4_ACTIVATION"],
        "fp8"
    );
    assert_eq!(
        docker(&with(|f| f.axes.activation = Activation::Bf16)).env["VLLM_MXFP4_ACTIVATION"],
        "bf16"
    );
    assert!(
        !docker(&with(|_| {}))
            .env
            .contains_key("VLLM_MXFP4_ACTIVATION")
    );
    assert!(
        render_with(
            &with(|f| f.axes.activation = Activation::Q8),
            TargetKind::Docker,
            &ctx()
        )
        .is_err()
    );
    for (v, s) in [
        (Activation::Bf16, "bf16"),
        (Activation::Q8, "q8"),
        (Activation::Fp8, "fp8"),
    ] {
        assert!(has_pair(
            &engine(&with(|f| f.axes.activation = v)).argv,
            "--activation",
            s
        ));
    }
    assert!(
        !engine(&with(|_| {}))
            .argv
            .contains(&"--activation".to_string())
    );
    assert!(
        render_with(
            &with(|f| f.axes.activation = Activation::Mxfp8),
            TargetKind::Engine,
            &ctx()
        )
        .is_err()
    );
}

#[test]
fn tile_renders_override_file_and_engine_flag() {
    for (v, s) in [(Tile::T64x128, "64x128"), (Tile::T128x128, "128x128")] {
        let fs = with(|f| f.axes.tile = v);
        let d = docker(&fs);
        assert_eq!(d.env["FLASHINFER_DEBUG_TILE_OVERRIDE"], "1");
        assert_eq!(
            d.container.as_ref().unwrap().files["/tmp/flashinfer_moe_tile"],
            s
        );
        assert!(
            !d.env.contains_key("FLASHINFER_MOE_TILE"),
            "the planned name is never rendered"
        );
        assert!(has_pair(&engine(&fs).argv, "--tile", s));
    }
    let d = docker(&with(|_| {}));
    assert!(d.container.unwrap().files.is_empty());
    assert!(has_pair(&engine(&with(|_| {})).argv, "--tile", "auto"));
}

#[test]
fn mxfp4_layers_render() {
    assert!(
        !docker(&with(|_| {}))
            .argv
            .contains(&"--mxfp4-layers".to_string())
    );
    for (v, s) in [
        (Mxfp4Layers::MoeQkvO, "moe,qkv,o"),
        (Mxfp4Layers::All, "moe,qkv,o,lm_head"),
    ] {
        let fs = with(|f| f.axes.mxfp4_layers = v);
        assert!(has_pair(&docker(&fs).argv, "--mxfp4-layers", s));
        assert!(has_pair(&engine(&fs).argv, "--mxfp4-layers", s));
    }
    assert!(has_pair(
        &engine(&with(|_| {})).argv,
        "--mxfp4-layers",
        "moe"
    ));
}

#[test]
fn attention_backend_and_config_render() {
    for (v, s) in [
        (AttentionBackend::TritonAttn, "TRITON_ATTN"),
        (AttentionBackend::Flashinfer, "FLASHINFER"),
        (AttentionBackend::FlashAttn, "FLASH_ATTN"),
    ] {
        let fs = with(|f| f.axes.attention_backend = v);
        assert!(has_pair(&docker(&fs).argv, "--attention-backend", s));
        assert!(
            render_with(&fs, TargetKind::Engine, &ctx()).is_err(),
            "engine has its own kernels"
        );
    }
    let fs = with(|f| f.axes.attention_config = Some(r#"{ "backend": "TRITON_ATTN" }"#.into()));
    assert!(has_pair(
        &docker(&fs).argv,
        "--attention-config",
        r#"{"backend":"TRITON_ATTN"}"#
    ));
    let bad = with(|f| f.axes.attention_config = Some("backend=x".into()));
    let err = render_with(&bad, TargetKind::Docker, &ctx())
        .unwrap_err()
        .to_string();
    assert!(err.contains("attention_config"), "{err}");
}

#[test]
fn sinks_render() {
    let off = with(|f| f.axes.sinks = Sinks::Off);
    assert_eq!(docker(&off).env["VLLM_ATTENTION_SINKS"], "false");
    assert!(has_pair(&engine(&off).argv, "--sinks", "off"));
    let on = with(|f| f.axes.sinks = Sinks::On);
    assert_eq!(docker(&on).env["VLLM_ATTENTION_SINKS"], "true");
    assert!(has_pair(&engine(&on).argv, "--sinks", "on"));
    assert!(
        !docker(&with(|_| {}))
            .env
            .contains_key("VLLM_USE_ATTENTION_SINKS")
    );
    assert!(!engine(&with(|_| {})).argv.contains(&"--sinks".to_string()));
}

#[test]
fn kv_cache_dtype_renders() {
    let fp8 = with(|f| f.axes.kv_cache_dtype = KvCacheDtype::Fp8);
    assert!(has_pair(&docker(&fp8).argv, "--kv-cache-dtype", "fp8"));
    assert!(has_pair(&engine(&fp8).argv, "--kv-dtype", "fp8"));
    let bf16 = with(|f| f.axes.kv_cache_dtype = KvCacheDtype::Bf16);
    assert!(has_pair(
        &docker(&bf16).argv,
        "--kv-cache-dtype",
        "bfloat16"
    ));
    assert!(has_pair(&engine(&bf16).argv, "--kv-dtype", "bf16"));
}

#[test]
fn speculative_renders_json() {
    let json = |fs: &FlagSet| -> serde_json::Value {
        let d = docker(fs);
        let i = d
            .argv
            .iter()
            .position(|a| a == "--speculative-config")
            .expect("flag");
        serde_json::from_str(&d.argv[i + 1]).unwrap()
    };
    let short = with(|f| f.axes.speculative = Speculative::Eagle3Short);
    assert_eq!(
        json(&short),
        serde_json::json!({"method": "eagle3", "model": "nvidia/gpt-oss-120b-Eagle3-short-context", "num_speculative_tokens": 3})
    );
    let long = with(|f| {
        f.axes.speculative = Speculative::Eagle3Long;
        f.axes.spec_tokens = 5;
    });
    assert_eq!(
        json(&long)["model"],
        "nvidia/gpt-oss-120b-Eagle3-long-context"
    );
    assert_eq!(json(&long)["num_speculative_tokens"], 5);
    let tp = with(|f| f.axes.speculative = Speculative::Eagle3Throughput);
    assert_eq!(json(&tp)["model"], "nvidia/gpt-oss-120b-Eagle3-throughput");
    let custom = with(|f| {
        f.axes.speculative = Speculative::Eagle3;
        f.axes.spec_model = Some("/models/eagle3-v3".into());
    });
    assert_eq!(json(&custom)["model"], "/models/eagle3-v3");
    let missing = with(|f| f.axes.speculative = Speculative::Eagle3);
    let err = render_with(&missing, TargetKind::Docker, &ctx())
        .unwrap_err()
        .to_string();
    assert!(err.contains("spec_model"), "{err}");
    let ngram = with(|f| f.axes.speculative = Speculative::Ngram);
    assert_eq!(json(&ngram)["method"], "ngram");
    assert_eq!(json(&ngram)["prompt_lookup_max"], 5);
    assert_eq!(
        json(&with(|f| f.axes.speculative = Speculative::Suffix))["method"],
        "suffix"
    );
    assert!(
        !docker(&with(|_| {}))
            .argv
            .contains(&"--speculative-config".to_string())
    );
    assert!(render_with(&short, TargetKind::Engine, &ctx()).is_err());
}

#[test]
fn cuda_graphs_render() {
    let off = with(|f| f.axes.cuda_graphs = CudaGraphs::Off);
    assert!(docker(&off).argv.contains(&"--enforce-eager".to_string()));
    assert!(has_pair(&engine(&off).argv, "--cuda-graphs", "off"));
    assert!(
        !docker(&with(|_| {}))
            .argv
            .contains(&"--enforce-eager".to_string())
    );
    assert!(has_pair(&engine(&with(|_| {})).argv, "--cuda-graphs", "on"));
}

#[test]
fn serving_limits_render_on_both_targets() {
    let fs = with(|f| {
        let s = &mut f.serving;
        s.served_model_name = Some("gpt-oss-120b".into());
        s.quantization = Some("mxfp4".into());
        s.tensor_parallel_size = Some(1);
        s.gpu_memory_utilization = Some(0.7);
        s.max_model_len = Some(131072);
        s.max_num_seqs = Some(2);
        s.max_num_batched_tokens = Some(8192);
        s.max_waiting_queue_length = Some(16);
        s.long_prefill_token_threshold = Some(256);
        s.prefix_caching = Some(true);
        s.load_format = Some("fastsafetensors".into());
        s.async_scheduling = Some(true);
        f.axes.kv_cache_dtype = KvCacheDtype::Fp8;
    });
    let d = docker(&fs);
    assert_eq!(&d.argv[..3], ["vllm", "serve", "openai/gpt-oss-120b"]);
    for (k, v) in [
        ("--port", "8000"),
        ("--served-model-name", "gpt-oss-120b"),
        ("--quantization", "mxfp4"),
        ("--tensor-parallel-size", "1"),
        ("--gpu-memory-utilization", "0.7"),
        ("--max-model-len", "131072"),
        ("--max-num-seqs", "2"),
        ("--max-num-batched-tokens", "8192"),
        ("--load-format", "fastsafetensors"),
    ] {
        assert!(has_pair(&d.argv, k, v), "{k} {v} in {:?}", d.argv);
    }
    assert!(d.argv.contains(&"--enable-prefix-caching".to_string()));
    assert!(d.argv.contains(&"--async-scheduling".to_string()));
    assert!(
        !d.argv.iter().any(|a| a.contains("queue")),
        "vLLM has no waiting-queue limit: {:?}",
        d.argv
    );
    assert_eq!(d.served_model_name, "gpt-oss-120b");
    let no_cache = with(|f| f.serving.prefix_caching = Some(false));
    assert!(
        docker(&no_cache)
            .argv
            .contains(&"--no-enable-prefix-caching".to_string())
    );
    let bad = with(|f| f.serving.gpu_memory_utilization = Some(1.5));
    assert!(render_with(&bad, TargetKind::Docker, &ctx()).is_err());

    let e = engine(&fs);
    assert!(has_pair(&e.argv, "--max-model-len", "131072"));
    assert!(has_pair(&e.argv, "--max-num-seqs", "2"));
    assert!(has_pair(&e.argv, "--max-waiting-queue-length", "16"));
    assert!(has_pair(&e.argv, "--max-num-batched-tokens", "8192"));
    assert!(has_pair(&e.argv, "--long-prefill-token-threshold", "256"));
    // `mxtune serve` itself takes what the panel renders.
    let serve_at = e.argv.iter().position(|a| a == "serve").unwrap();
    let args = crate::engine::serve::parse_args(&e.argv[serve_at + 1..]).unwrap();
    assert_eq!(args.max_waiting_queue_length, 16);
    assert_eq!(args.max_num_batched_tokens, Some(8192));
    assert_eq!(args.long_prefill_token_threshold, 256);
    assert!(args.prefix_caching());
    assert!(crate::engine::serve::refusals(&args).is_empty());
    // Prefix caching reaches the engine under vLLM's names, with a check of its start-up line.
    let check = |spec: &LaunchSpec| {
        spec.checks
            .iter()
            .find(|c| c.flag == "serving.prefix_caching")
            .cloned()
    };
    let c = check(&e).expect("a prefix-caching check");
    assert_eq!(c.value, "true");
    let line = regex::Regex::new(&c.must_see[0]).unwrap();
    assert!(line.is_match("mxtune serve: prefix caching on (--enable-prefix-caching): …"));
    assert!(!line.is_match("mxtune serve: prefix caching off (--no-enable-prefix-caching)"));
    let e_off = engine(&no_cache);
    assert!(
        e_off
            .argv
            .contains(&"--no-enable-prefix-caching".to_string())
    );
    assert!(!e_off.argv.contains(&"--enable-prefix-caching".to_string()));
    let serve_at = e_off.argv.iter().position(|a| a == "serve").unwrap();
    let off = crate::engine::serve::parse_args(&e_off.argv[serve_at + 1..]).unwrap();
    assert!(!off.prefix_caching());
    let c = check(&e_off).expect("a prefix-caching check");
    let line = regex::Regex::new(&c.must_see[0]).unwrap();
    assert!(line.is_match("mxtune serve: prefix caching off (--no-enable-prefix-caching)"));
    let unset = engine(&with(|_| {}));
    assert!(check(&unset).is_none());
    assert!(!unset.argv.iter().any(|a| a.contains("prefix-caching")));
    assert!(has_pair(&e.argv, "--served-model-name", "gpt-oss-120b"));
    assert!(has_pair(&e.argv, "--host", "127.0.0.1"));
    assert!(
        !e.argv.contains(&"--quantization".to_string()),
        "vLLM-only limits stay off the engine"
    );
    assert!(e.container.is_none());
}

#[test]
fn engine_model_and_device_render() {
    let e = engine(&with(|_| {}));
    assert_eq!(&e.argv[..4], ["mxtune", "serve", "--synthetic", "tiny"]);
    assert!(has_pair(&e.argv, "--device", "auto"));
    assert_eq!(e.served_model_name, "tiny");
    let dir = with(|f| {
        f.engine.model = "~/models/gpt-oss-20b".into();
        f.engine.device = Device::Cuda;
    });
    let e = engine(&dir);
    assert!(has_pair(&e.argv, "--model", "/home/op/models/gpt-oss-20b"));
    assert!(has_pair(&e.argv, "--device", "cuda"));
    assert_eq!(e.served_model_name, "gpt-oss-20b");
    let empty = with(|f| f.engine.model = "synthetic:".into());
    assert!(render_with(&empty, TargetKind::Engine, &ctx()).is_err());
}

#[test]
fn engine_checks_follow_the_kernel_path_contract() {
    let re = |spec: &LaunchSpec, flag: &str| {
        let k = spec
            .checks
            .iter()
            .find(|k| k.flag == flag)
            .unwrap_or_else(|| panic!("{flag}"));
        regex::Regex::new(&k.must_see[0]).unwrap()
    };
    let cuda = engine(&with(|f| {
        f.engine.device = Device::Cuda;
        f.axes.moe_backend = MoeBackend::Gemv;
        f.axes.mxfp4_layers = Mxfp4Layers::Moe;
    }));
    assert!(re(&cuda, "moe_backend").is_match("kernel-path moe_kernel=gemv"));
    assert!(!re(&cuda, "moe_backend").is_match("kernel-path moe_kernel=grouped"));
    assert!(re(&cuda, "mxfp4_layers").is_match("kernel-path mxfp4_layers=moe"));
    assert!(!re(&cuda, "mxfp4_layers").is_match("kernel-path mxfp4_layers=moe,qkv,o"));
    assert!(re(&cuda, "device").is_match("kernel-path backend=cuda"));
    assert!(!re(&cuda, "moe_backend").is_match("kernel-path moe_kernel=n/a"));
    // auto accepts whatever the engine resolved.
    assert!(re(&cuda, "tile").is_match("kernel-path tile=64x128"));
    assert!(re(&cuda, "sinks").is_match("kernel-path sinks=on"));

    let cpu = engine(&with(|f| f.engine.device = Device::Cpu));
    assert!(re(&cpu, "device").is_match("kernel-path backend=cpu"));
    assert!(re(&cpu, "cuda_graphs").is_match("kernel-path cuda_graphs=n/a"));
    assert!(!re(&cpu, "cuda_graphs").is_match("kernel-path cuda_graphs=on"));
    let auto = engine(&with(|_| {}));
    assert!(re(&auto, "cuda_graphs").is_match("kernel-path cuda_graphs=n/a"));
    assert!(re(&auto, "cuda_graphs").is_match("kernel-path cuda_graphs=on"));
    assert!(!re(&auto, "cuda_graphs").is_match("kernel-path cuda_graphs=off"));
    let keys: Vec<&str> = auto.checks.iter().map(|k| k.must_see[0].as_str()).collect();
    for key in [
        "backend",
        "moe_kernel",
        "activation",
        "tile",
        "mxfp4_layers",
        "kv_dtype",
        "sinks",
        "cuda_graphs",
    ] {
        assert!(
            keys.iter()
                .any(|k| k.starts_with(&format!("^kernel-path {key}="))),
            "{key}"
        );
    }
}

#[test]
fn vllm_checks_carry_the_seeds_patterns() {
    let d = docker(&with(|f| f.axes.moe_backend = MoeBackend::Marlin));
    let k = d.checks.iter().find(|k| k.flag == "moe_backend").unwrap();
    let see = regex::Regex::new(&k.must_see[0]).unwrap();
    let not = regex::Regex::new(&k.must_not_see[0]).unwrap();
    assert!(see.is_match("Using MARLIN Mxfp4 MoE backend"));
    assert!(not.is_match("[MoE] backend=flashinfer fn=flashinfer.fused_moe.cutlass_fused_moe"));
    let c = docker(&with(|f| f.axes.moe_backend = MoeBackend::Cutlass));
    let k = c.checks.iter().find(|k| k.flag == "moe_backend").unwrap();
    let not = regex::Regex::new(&k.must_not_see[0]).unwrap();
    assert!(not.is_match("marlin_moe_wna16::Marlin kernel"));
    assert!(
        !not.is_match("[MXFP4] lm_head uses Marlin"),
        "lm_head on Marlin is fine with CUTLASS MoE"
    );
}

#[test]
fn container_settings_render() {
    let fs = with(|f| {
        let c = &mut f.container;
        c.network = NetworkMode::Bridge;
        c.ipc_host = false;
        c.shm_size = Some("16g".into());
        c.rdma = true;
        c.vllm_src = Some("~/projects/vllm".into());
        c.flashinfer_src = Some("/src/flashinfer".into());
        c.name = Some("vllm-dev".into());
        c.env.insert("FLASHINFER_NVCC_THREADS".into(), "4".into());
    });
    let d = docker(&fs);
    let c = d.container.as_ref().unwrap();
    assert_eq!(c.network, NetworkMode::Bridge);
    assert_eq!(c.shm_size, Some(16 << 30));
    assert_eq!(c.devices, ["/dev/infiniband"]);
    assert_eq!(c.cap_add, ["IPC_LOCK"]);
    assert!(c.gpus_all);
    assert_eq!(d.env["PYTHONPATH"], "/workspace/flashinfer:/workspace/vllm");
    assert_eq!(d.env["FLASHINFER_NVCC_THREADS"], "4");
    let mounts: Vec<(&str, &str)> = c
        .mounts
        .iter()
        .map(|m| (m.host.as_str(), m.container.as_str()))
        .collect();
    for want in [
        ("/home/op/.cache/huggingface", "/root/.cache/huggingface"),
        (
            "/home/op/.cache/mxtune/jit/flashinfer",
            "/root/.cache/flashinfer",
        ),
        ("/home/op/.cache/mxtune/jit/vllm", "/root/.cache/vllm"),
        ("/home/op/.cache/mxtune/jit/torch", "/root/.cache/torch"),
        ("/home/op/.cache/mxtune/jit/triton", "/root/.triton"),
        ("/home/op/projects/vllm", "/workspace/vllm"),
        ("/src/flashinfer", "/workspace/flashinfer"),
    ] {
        assert!(mounts.contains(&want), "{want:?} in {mounts:?}");
    }
    let run = docker_run_argv(&d).unwrap();
    assert!(has_pair(&run, "-p", "127.0.0.1:8000:8000"));
    assert!(has_pair(&run, "--shm-size", &(16u64 << 30).to_string()));
    assert!(has_pair(&run, "--device", "/dev/infiniband"));
    assert!(has_pair(&run, "--cap-add", "IPC_LOCK"));
    assert!(has_pair(&run, "--name", "vllm-dev"));
    assert!(has_pair(&run, "--entrypoint", "vllm"));
    let relative = with(|f| f.container.hf_cache = Some("cache/hf".into()));
    let err = render_with(&relative, TargetKind::Docker, &ctx())
        .unwrap_err()
        .to_string();
    assert!(err.contains("container.hf_cache"), "{err}");
}

#[test]
fn fork_names_warn_only_where_they_are_not_the_images_own() {
    // A fork name the fork image knows renders silently; on a stock image the same axis
    // value is said in upstream's names (see `flags::dialect`), so nothing is ignored.
    let fork = with(|f| f.axes.moe_backend = MoeBackend::Marlin);
    assert!(docker(&fork).warnings.is_empty());
    let stock = with(|f| {
        f.container.vllm = VllmFlavor::Upstream;
        f.axes.moe_backend = MoeBackend::Marlin;
    });
    let d = docker(&stock);
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert!(!d.env.contains_key("VLLM_MXFP4_BACKEND"), "{:?}", d.env);
    // A fork-deprecated name still warns on the fork's own image.
    let gemv = with(|f| f.axes.moe_backend = MoeBackend::Gemv);
    assert!(
        docker(&gemv)
            .warnings
            .iter()
            .any(|w| w.contains("VLLM_MXFP4_MOE_KERNEL")),
        "{:?}",
        docker(&gemv).warnings
    );
}

#[test]
fn every_rendered_name_is_in_the_provenance_table() {
    for a in all_axes() {
        for (value, _, spec) in &a.values {
            for e in spec.vllm.unwrap_or(&[]) {
                let n = match e {
                    VllmEffect::Env(n, _) | VllmEffect::Flag(n) | VllmEffect::Arg(n, _) => n.name,
                    VllmEffect::SpecConfig { .. } => "--speculative-config",
                    VllmEffect::File(..) => continue,
                };
                assert!(
                    names::find(n).is_some(),
                    "{}={value} renders unknown name {n}",
                    a.key
                );
            }
            let ev = spec.vllm_check;
            for r in ev.must_see.iter().chain(ev.must_not_see) {
                regex::Regex::new(r).unwrap_or_else(|e| panic!("{}={value}: {e}", a.key));
            }
        }
    }
    for s in SETTINGS {
        if let Some(n) = s.vllm {
            assert!(names::find(n.name).is_some(), "{}", n.name);
        }
    }
    // Settings keys exist in the serialized flag set.
    let t = toml::Table::try_from(FlagSet {
        axes: Axes {
            attention_config: Some("{}".into()),
            spec_model: Some("x".into()),
            ..Axes::default()
        },
        serving: Serving {
            served_model_name: Some("a".into()),
            host: Some("h".into()),
            quantization: Some("q".into()),
            tensor_parallel_size: Some(1),
            gpu_memory_utilization: Some(0.5),
            max_model_len: Some(1),
            max_num_seqs: Some(1),
            max_num_batched_tokens: Some(1),
            max_waiting_queue_length: Some(1),
            long_prefill_token_threshold: Some(1),
            prefix_caching: Some(true),
            load_format: Some("auto".into()),
            async_scheduling: Some(true),
            ..Serving::default()
        },
        container: Container {
            name: Some("n".into()),
            shm_size: Some("1g".into()),
            vllm_src: Some("/v".into()),
            flashinfer_src: Some("/f".into()),
            ..Container::default()
        },
        ..FlagSet::default()
    })
    .unwrap();
    for s in SETTINGS {
        assert!(t[s.section].get(s.key).is_some(), "{}.{}", s.section, s.key);
    }
    for (k, _) in CONTAINER_SETTINGS {
        assert!(t["container"].get(*k).is_some(), "container.{k}");
    }
}

#[test]
fn axis_values_parse_and_reject_with_choices() {
    assert_eq!(
        "trtllm-mxfp8".parse::<MoeBackend>(),
        Ok(MoeBackend::TrtllmMxfp8)
    );
    assert_eq!("moe,qkv,o".parse::<Mxfp4Layers>(), Ok(Mxfp4Layers::MoeQkvO));
    let err = "gemm".parse::<MoeBackend>().unwrap_err();
    assert!(
        err.contains("gemm") && err.contains("cutlass") && err.contains("moe_backend"),
        "{err}"
    );
}

fn rule_fires(id: &str, fs: &FlagSet, target: TargetKind, arch: Option<&str>) -> Option<Applies> {
    let arch = arch.map(|a| a.parse::<GpuArch>().unwrap());
    evaluate(fs, target, arch)
        .into_iter()
        .find(|f| f.rule == id)
        .map(|f| f.applies)
}

/// (rule, config that triggers it, target, arch that triggers it, arch that does not)
type RuleCase = (
    &'static str,
    FlagSet,
    TargetKind,
    Option<&'static str>,
    Option<&'static str>,
);

#[test]
fn every_rule_fires_only_when_it_should() {
    use TargetKind::{Docker, Engine};
    let base = with(|_| {});
    let cases: Vec<RuleCase> = vec![
        (
            "eagle3-cuda-graphs-sm121",
            with(|f| f.axes.speculative = Speculative::Eagle3Long),
            Docker,
            Some("sm121"),
            Some("sm100"),
        ),
        (
            "flash-attn-sm12x",
            with(|f| f.axes.attention_config = Some(r#"{"backend":"FLASH_ATTN"}"#.into())),
            Docker,
            Some("12.0"),
            Some("9.0"),
        ),
        (
            "waiting-queue-limit-engine-only",
            with(|f| f.serving.max_waiting_queue_length = Some(8)),
            Docker,
            None,
            None,
        ),
        (
            "sinks-off-garbage",
            with(|f| f.axes.sinks = Sinks::Off),
            Engine,
            None,
            None,
        ),
        (
            "trtllm-sm100-only",
            with(|f| f.axes.moe_backend = MoeBackend::Trtllm),
            Docker,
            Some("sm121"),
            Some("sm100"),
        ),
        (
            "tile-needs-cutlass",
            with(|f| f.axes.tile = Tile::T128x128),
            Docker,
            None,
            None,
        ),
        (
            "tile-needs-grouped",
            with(|f| {
                f.axes.tile = Tile::T64x128;
                f.axes.moe_backend = MoeBackend::Gemv;
            }),
            Engine,
            None,
            None,
        ),
        (
            "tile-64x128-needs-fork",
            with(|f| {
                f.axes.tile = Tile::T64x128;
                f.axes.moe_backend = MoeBackend::Cutlass;
            }),
            Docker,
            None,
            None,
        ),
        (
            "attention-backend-and-config",
            with(|f| {
                f.axes.attention_backend = AttentionBackend::Flashinfer;
                f.axes.attention_config = Some(r#"{"backend":"FLASHINFER"}"#.into());
            }),
            Docker,
            None,
            None,
        ),
        (
            "sinks-ignored-by-triton",
            with(|f| {
                f.axes.sinks = Sinks::Off;
                f.axes.attention_backend = AttentionBackend::TritonAttn;
            }),
            Docker,
            None,
            None,
        ),
        (
            "trtllm-mxfp8-activation",
            with(|f| {
                f.axes.moe_backend = MoeBackend::TrtllmMxfp8;
                f.axes.activation = Activation::Bf16;
            }),
            Docker,
            None,
            None,
        ),
        (
            "mxfp8-implies-trtllm-mxfp8",
            with(|f| {
                f.axes.moe_backend = MoeBackend::Marlin;
                f.axes.activation = Activation::Mxfp8;
            }),
            Docker,
            None,
            None,
        ),
        (
            "sinks-sm121-crash",
            with(|f| f.axes.sinks = Sinks::On),
            Docker,
            Some("sm121"),
            Some("sm120"),
        ),
        (
            "cuda-graphs-mxfp4-sm121",
            with(|f| f.axes.moe_backend = MoeBackend::Cutlass),
            Docker,
            Some("sm_121"),
            Some("sm90"),
        ),
        (
            "eagle3-flashinfer-needs-fork",
            with(|f| {
                f.axes.speculative = Speculative::Eagle3Short;
                f.axes.attention_backend = AttentionBackend::Flashinfer;
            }),
            Docker,
            None,
            None,
        ),
        (
            "ngram-async-scheduling",
            with(|f| {
                f.axes.speculative = Speculative::Ngram;
                f.serving.async_scheduling = Some(true);
            }),
            Docker,
            None,
            None,
        ),
        (
            "rdma-needs-host-network",
            with(|f| {
                f.container.rdma = true;
                f.container.network = NetworkMode::Bridge;
            }),
            Docker,
            None,
            None,
        ),
        (
            "flashinfer-sm12x-needs-fork",
            with(|f| {
                f.container.vllm = VllmFlavor::Upstream;
                f.axes.moe_backend = MoeBackend::Cutlass;
            }),
            Docker,
            Some("sm121"),
            Some("sm100"),
        ),
        (
            "cold-jit-cache",
            with(|f| {
                f.axes.moe_backend = MoeBackend::Cutlass;
                f.container.jit_cache = None;
            }),
            Docker,
            None,
            None,
        ),
        (
            "mounted-sources-need-install",
            with(|f| f.container.flashinfer_src = Some("/src/flashinfer".into())),
            Docker,
            None,
            None,
        ),
        (
            "cpu-has-no-cuda-paths",
            with(|f| {
                f.engine.device = Device::Cpu;
                f.axes.moe_backend = MoeBackend::Grouped;
            }),
            Engine,
            None,
            None,
        ),
        (
            "upstream-bf16-cutlass-sm90-only",
            with(|f| {
                f.container.vllm = VllmFlavor::Upstream;
                f.axes.moe_backend = MoeBackend::Cutlass;
                f.axes.activation = Activation::Bf16;
            }),
            Docker,
            Some("sm121"),
            Some("9.0"),
        ),
        (
            "not-in-upstream-dialect",
            with(|f| {
                f.container.vllm = VllmFlavor::Upstream;
                f.axes.tile = Tile::T64x128;
            }),
            Docker,
            None,
            None,
        ),
        (
            "value-not-on-target",
            with(|f| f.axes.activation = Activation::Q8),
            Docker,
            None,
            None,
        ),
        (
            "value-not-on-target",
            with(|f| f.axes.moe_backend = MoeBackend::Marlin),
            Engine,
            None,
            None,
        ),
    ];
    let mut covered: Vec<&str> = Vec::new();
    for (id, fs, target, yes_arch, no_arch) in &cases {
        covered.push(id);
        assert_eq!(
            rule_fires(id, fs, *target, *yes_arch),
            Some(Applies::Yes),
            "{id} should fire"
        );
        assert_eq!(
            rule_fires(id, &base, *target, *yes_arch),
            None,
            "{id} must not fire on defaults"
        );
        if let Some(no) = no_arch {
            assert_eq!(
                rule_fires(id, fs, *target, Some(no)),
                None,
                "{id} must not fire on {no}"
            );
            assert_eq!(
                rule_fires(id, fs, *target, None),
                Some(Applies::MayApply),
                "{id} unknown GPU"
            );
        }
    }
    for r in RULES {
        assert!(covered.contains(&r.id), "rule {} has no test case", r.id);
    }
    // Rules are target-specific.
    let eagle = with(|f| f.axes.speculative = Speculative::Eagle3Long);
    assert_eq!(
        rule_fires(
            "eagle3-cuda-graphs-sm121",
            &eagle,
            TargetKind::Engine,
            Some("sm121")
        ),
        None
    );
    // Errors come first; blocking needs certainty.
    let f = evaluate(
        &with(|f| f.axes.moe_backend = MoeBackend::Trtllm),
        TargetKind::Docker,
        None,
    );
    assert_eq!(f[0].severity, Severity::Error);
    assert!(
        !f[0].blocks(),
        "an arch-dependent error with an unknown GPU asks, not blocks"
    );
    let known = evaluate(
        &with(|f| f.axes.moe_backend = MoeBackend::Trtllm),
        TargetKind::Docker,
        Some("sm121".parse().unwrap()),
    );
    assert!(known.iter().any(|f| f.blocks()));
}

#[test]
fn gpu_arch_parses() {
    for (s, maj, min) in [
        ("sm121", 12, 1),
        ("SM_100", 10, 0),
        ("12.1", 12, 1),
        ("sm90", 9, 0),
    ] {
        let a: GpuArch = s.parse().unwrap();
        assert_eq!((a.major, a.minor), (maj, min), "{s}");
    }
    assert!("gb10".parse::<GpuArch>().is_err());
}

#[test]
fn flags_docs_match_the_tables() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(super::docs::DOCS_PATH);
    let want = super::docs::markdown();
    if std::env::var_os("MXTUNE_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is stale: regenerate with `MXTUNE_BLESS=1 cargo test flags_docs` or `mxtune presets docs > docs/flags.md`",
        path.display()
    );
}

#[test]
fn every_axis_is_settable_by_name() {
    let mut fs = FlagSet::default();
    for a in all_axes() {
        for (value, _, _) in &a.values {
            fs.set_axis(a.key, value).unwrap();
            assert_eq!(fs.axis_value(a.key), Some(*value), "{}", a.key);
        }
    }
    assert_eq!(fs.engine.device, Device::Cuda);
    let err = fs.set_axis("moe_kernel", "gemv").unwrap_err();
    assert!(err.contains("moe_backend"), "{err}");
    let err = fs.set_axis("tile", "32x32").unwrap_err();
    assert!(err.contains("64x128"), "{err}");
    assert_eq!(fs.axis_value("nope"), None);
}

#[test]
fn docker_cluster_renders_vllm_over_ray_on_two_gpus() {
    let fs = with(|fs| {
        fs.target = TargetKind::DockerCluster;
        fs.cluster.head = "spark1".into();
        fs.cluster.worker = "spark2".into();
        fs.cluster.nccl.socket_ifname = Some("enp1s0f1np1".into());
    });
    let spec = render_with(&fs, TargetKind::DockerCluster, &ctx()).expect("cluster render");
    assert_eq!(&spec.argv[..2], ["vllm", "serve"]);
    assert!(has_pair(&spec.argv, "--tensor-parallel-size", "2"));
    assert!(has_pair(
        &spec.argv,
        "--distributed-executor-backend",
        "ray"
    ));
    assert_eq!(spec.env["NCCL_DEBUG"], "INFO");
    let c = spec.cluster.as_ref().expect("a cluster section");
    assert_eq!((c.head.as_str(), c.worker.as_str()), ("spark1", "spark2"));
    assert_eq!(c.ray_port, DEFAULT_RAY_PORT);
    assert_eq!(c.nccl_env["NCCL_SOCKET_IFNAME"], "enp1s0f1np1");
    let check = spec
        .checks
        .iter()
        .find(|c| c.flag == "nccl_transport")
        .expect("a transport check");
    assert_eq!(check.value, "rdma");
    let re = |p: &str| regex::Regex::new(p).unwrap();
    let ib = "spark0:100:100 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:192.168.200.11<0>";
    let sock = "(RayWorkerWrapper pid=201, ip=192.168.200.12) spark1:101:101 [0] NCCL INFO Using network Socket";
    assert!(re(&check.must_see[0]).is_match(ib));
    assert!(!re(&check.must_see[0]).is_match(sock));
    assert!(re(&check.must_not_see[0]).is_match(sock));
    assert!(!re(&check.must_not_see[0]).is_match(ib));

    let pp = with(|f| {
        *f = fs.clone();
        f.cluster.parallel = Parallel::Pipeline;
    });
    let spec = render_with(&pp, TargetKind::DockerCluster, &ctx()).unwrap();
    assert!(has_pair(&spec.argv, "--pipeline-parallel-size", "2"));
    assert!(!spec.argv.iter().any(|a| a == "--tensor-parallel-size"));

    // The section is left out of a saved preset unless set.
    let saved = toml::to_string(&FlagSet::default()).unwrap();
    assert!(!saved.contains("[cluster]"), "{saved}");
}

#[test]
fn docker_cluster_errors_name_the_key_and_what_to_do() {
    let base = |f: &mut FlagSet| {
        f.target = TargetKind::DockerCluster;
        f.cluster.head = "spark1".into();
        f.cluster.worker = "spark2".into();
    };
    type Change = Box<dyn Fn(&mut FlagSet)>;
    let cases: Vec<(Change, &str)> = vec![
        (
            Box::new(|f| f.cluster.head.clear()),
            "cluster.head is not set",
        ),
        (
            Box::new(|f| f.cluster.worker = "a b".into()),
            "cluster.worker = \"a b\" is not a host name",
        ),
        (
            Box::new(|f| f.cluster.worker = "spark1".into()),
            "cluster.head and cluster.worker are both \"spark1\"",
        ),
        (
            Box::new(|f| f.container.network = NetworkMode::Bridge),
            "needs network = \"host\"",
        ),
        (
            Box::new(|f| f.serving.tensor_parallel_size = Some(2)),
            "serving.tensor_parallel_size = 2: a docker-cluster target sets the split itself",
        ),
        (
            Box::new(|f| f.cluster.ray_port = f.serving.port),
            "cluster.ray_port and serving.port are both",
        ),
        (
            Box::new(|f| f.cluster.join_limit_s = 0),
            "cluster.join_limit_s is 0",
        ),
    ];
    for (change, want) in cases {
        let fs = with(|f| {
            base(f);
            change(f);
        });
        let e = render_with(&fs, TargetKind::DockerCluster, &ctx())
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
    }
    // Both nodes on this machine is allowed: it tries the target on one host.
    let fs = with(|f| {
        base(f);
        f.cluster.head = "local".into();
        f.cluster.worker = "local".into();
    });
    assert!(render_with(&fs, TargetKind::DockerCluster, &ctx()).is_ok());
}
