//! CUDA backend pieces that need no GPU: the no-driver path (an error, never a panic), the
//! per-kernel CPU references against the gpt-oss facts, the test-input streams, and the byte
//! count of the decode roofline.

use mxtune::engine::cuda::gates::Fp4Layers;
use mxtune::engine::cuda::reference as r;
use mxtune::engine::cuda::{libs, roofline, synthetic};

#[test]
fn cuda_open_without_a_driver_is_an_error_not_a_panic() {
    let res = std::panic::catch_unwind(|| mxtune::engine::cuda::device::Gpu::open(0).map(|_| ()));
    let res = res.expect("Gpu::open panicked");
    if libs::ensure_driver().is_err() {
        let msg = format!("{:#}", res.unwrap_err());
        assert!(msg.contains("CUDA driver library was not found"), "{msg}");
    } else {
        eprintln!(
            "driver present: Gpu::open returned {:?}",
            res.as_ref().err()
        );
    }
}

#[test]
fn cuda_selftest_binary_fails_cleanly_without_a_gpu() {
    if libs::ensure_driver().is_ok() {
        eprintln!("SKIPPED: a CUDA driver is present; run `mxtune engine selftest` on the GPU");
        return;
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(["engine", "selftest", "--device", "cuda"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("CUDA driver library was not found"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn cuda_profile_checks_max_model_len_before_opening_the_gpu() {
    // Checked before the GPU is opened (and the 120b weights generated), so the message is
    // the same with or without a GPU.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args([
            "engine",
            "profile",
            "--depth",
            "100",
            "--steps",
            "48",
            "--max-model-len",
            "64",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--max-model-len 64 is shorter than the 156 positions"),
        "{err}"
    );
    assert!(!err.contains("CUDA driver"), "{err}");
}

#[test]
fn cuda_selftest_rejects_other_devices() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(["engine", "selftest", "--device", "cpu"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--device cuda"), "{err}");
}

#[test]
fn cuda_reference_mxfp4_nibble_order_and_scale() {
    // Byte 0x2F: element 0 (low nibble 0xF) = -6, element 1 (high nibble 0x2) = 1.0; scale 128 = ×2.
    let mut blocks = vec![0u8; 16];
    blocks[0] = 0x2f;
    blocks[15] = 0x70;
    let row = r::mxfp4_row(&blocks, &[128], 32);
    assert_eq!(row[0], -12.0);
    assert_eq!(row[1], 2.0);
    assert_eq!(row[30], 0.0);
    assert_eq!(row[31], 12.0);
}

#[test]
fn cuda_reference_swiglu_clamps_asymmetrically() {
    let s = |x: f64| 1.0 / (1.0 + (-1.702 * x).exp());
    // gate clamped above only, lin clamped both ways, lin + 1.
    assert!((r::swiglu(10.0, -10.0, 7.0, 1.702) - 7.0 * s(7.0) * -6.0).abs() < 1e-12);
    assert!((r::swiglu(-10.0, 10.0, 7.0, 1.702) - -10.0 * s(-10.0) * 8.0).abs() < 1e-12);
}

#[test]
fn cuda_reference_router_ties_and_softmax_over_top_k() {
    let (idx, w) = r::router_topk(&[1.0, 3.0, 3.0, 0.5, 2.0], 3);
    assert_eq!(idx, vec![1, 2, 4]);
    let e = [1.0, 1.0, (-1.0f64).exp()];
    let s: f64 = e.iter().sum();
    for (a, b) in w.iter().zip(e) {
        assert!((a - b / s).abs() < 1e-12);
    }
}

#[test]
fn cuda_reference_attention_counts_the_sink_once() {
    // One head, d = 2, two keys with score 0 and equal values: out = 2v / (2 + e^S).
    let k = [0u16; 4];
    let one = r::to_bf(1.0);
    let v = [one, one, one, one];
    let sink = r::to_bf(0.5);
    let out = r::attention(&[0.0, 0.0], &k, &v, 1, 1, 1, 2, 0, Some(&[sink]), 1.0);
    let want = 2.0 / (2.0 + 0.5f64.exp());
    assert!((out[0] - want).abs() < 1e-12, "{} vs {want}", out[0]);
    // Window 1: only the key at the query's own position.
    let out = r::attention(&[0.0, 0.0], &k, &v, 1, 1, 1, 2, 1, Some(&[sink]), 1.0);
    assert!((out[0] - 1.0 / (1.0 + 0.5f64.exp())).abs() < 1e-12);
}

#[test]
fn cuda_synthetic_streams_are_deterministic_and_in_range() {
    let a = synthetic::bf16_vec(42, 10_000, 0.5, 1.0);
    assert_eq!(a, synthetic::bf16_vec(42, 10_000, 0.5, 1.0));
    assert_ne!(a, synthetic::bf16_vec(43, 10_000, 0.5, 1.0));
    for &b in &a {
        let v = r::bf(b);
        assert!((0.5..=1.5).contains(&v), "{v}");
    }
    let bytes = synthetic::u8_vec(7, 100_000, 119, 126);
    assert!(bytes.iter().all(|b| (119..=126).contains(b)));
    for want in 119..=126u8 {
        assert!(bytes.contains(&want), "value {want} never drawn");
    }
}

#[test]
fn cuda_bytes_per_token_matches_the_roofline_table() {
    // docs BENCHMARKING "The physical limit": 5.003 GB (120b) and 3.708 GB (20b) as released.
    for (name, want) in [("gpt-oss-120b", 5.003e9), ("gpt-oss-20b", 3.708e9)] {
        let cfg = mxtune::engine::synthetic::config(name).unwrap();
        let got = roofline::batch_one_bytes(&cfg, Fp4Layers::Moe, 2, 0).unwrap() as f64;
        assert!((got / want - 1.0).abs() < 0.005, "{name}: {got} vs {want}");
    }
}

#[test]
fn cuda_bytes_per_token_counts_mxfp4_layers_at_4_25_bits() {
    for name in ["gpt-oss-120b", "gpt-oss-20b"] {
        let c = mxtune::engine::synthetic::config(name).unwrap();
        let at = |fp4| roofline::batch_one_bytes(&c, fp4, 2, 1000).unwrap() as i64;
        // bf16 (16 bits) → MXFP4 (4.25 bits): 15/32 bytes saved per weight.
        let qkv_o = ((c.q_dim() + 2 * c.kv_dim()) * c.hidden_size + c.hidden_size * c.q_dim())
            * c.num_hidden_layers;
        let lm_head = c.vocab_size * c.hidden_size;
        let saved = |w: usize| (2 * w - w / 32 * 17) as i64;
        assert_eq!(at(Fp4Layers::Moe) - at(Fp4Layers::MoeQkvO), saved(qkv_o));
        assert_eq!(at(Fp4Layers::MoeQkvO) - at(Fp4Layers::All), saved(lm_head));
    }
    // 120b: 5.003 GB as released; with qkv, o and the lm_head in MXFP4, 2.25 GB less.
    let c = mxtune::engine::synthetic::config("gpt-oss-120b").unwrap();
    let all = roofline::batch_one_bytes(&c, Fp4Layers::All, 2, 0).unwrap() as f64;
    assert!((all / 2.749e9 - 1.0).abs() < 0.005, "{all}");
}
