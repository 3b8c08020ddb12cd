//! The CPU reference backend against logits recorded from HF transformers
//! (tests/fixtures/oracle, made by tools/make_oracle.py), plus the loader's error paths.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mxtune::engine::backend::{ModelBackend, SeqStep};
use mxtune::engine::cpu::CpuBackend;
use mxtune::engine::cpu::ops::Rope;
use mxtune::engine::loader;
use safetensors::{Dtype, SafeTensors};

const MODELS: [&str; 2] = ["tiny-a", "tiny-b"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oracle")
}

/// The reference file of one model: prompts, logits at every prompt position, greedy tokens.
struct Reference {
    tensors: HashMap<String, (Vec<usize>, Vec<u8>, Dtype)>,
}

impl Reference {
    fn load(model: &str) -> Reference {
        let bytes =
            std::fs::read(fixtures().join(format!("{model}.reference.safetensors"))).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let tensors = st
            .tensors()
            .into_iter()
            .map(|(n, t)| (n, (t.shape().to_vec(), t.data().to_vec(), t.dtype())))
            .collect();
        Reference { tensors }
    }

    fn f32s(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let (shape, data, dtype) = &self.tensors[name];
        assert_eq!(*dtype, Dtype::F32, "{name}");
        (
            shape.clone(),
            data.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        )
    }

    fn ids(&self, name: &str) -> Vec<u32> {
        let (_, data, dtype) = &self.tensors[name];
        assert_eq!(*dtype, Dtype::I64, "{name}");
        data.chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect()
    }

    fn prompts(&self) -> usize {
        (0..)
            .take_while(|i| self.tensors.contains_key(&format!("prompt{i}.tokens")))
            .count()
    }
}

fn backend(model: &str) -> CpuBackend {
    let w = loader::load(&fixtures().join(model)).unwrap();
    CpuBackend::new(w, 4096)
}

/// max |Δ| divided by the reference row's logit range.
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let range = want.iter().copied().fold(f32::MIN, f32::max)
        - want.iter().copied().fold(f32::MAX, f32::min);
    let d = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    d / range
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn rope_tables_match_transformers() {
    for model in MODELS {
        let r = Reference::load(model);
        let be = backend(model);
        let rope = Rope::new(be.config());
        let (_, inv) = r.f32s("rope_inv_freq");
        let (_, scale) = r.f32s("rope_attention_scaling");
        assert_eq!(rope.inv_freq.len(), inv.len());
        for (a, b) in rope.inv_freq.iter().zip(&inv) {
            assert!(
                (a - b).abs() <= 2e-6 * b.abs(),
                "{model}: inv_freq {a} vs {b}"
            );
        }
        assert!((rope.attention_scaling - scale[0]).abs() < 1e-6);
    }
}

#[test]
fn prefill_logits_match_transformers() {
    for model in MODELS {
        let r = Reference::load(model);
        let mut be = backend(model);
        let mut worst = 0.0f32;
        for p in 0..r.prompts() {
            let tokens = r.ids(&format!("prompt{p}.tokens"));
            let (shape, logits) = r.f32s(&format!("prompt{p}.logits"));
            let v = shape[1];
            let seq = be.alloc_seq(tokens.len()).unwrap();
            let out = be
                .forward(&[SeqStep {
                    seq,
                    tokens: &tokens,
                }])
                .unwrap();
            let e = rel_err(&out[0], &logits[(tokens.len() - 1) * v..]);
            worst = worst.max(e);
            be.free_seq(seq);
        }
        eprintln!("{model}: batched prefill, max |Δ| / range = {worst:.2e}");
        assert!(worst <= 1e-3, "{model}: {worst}");
    }
}

#[test]
fn decode_logits_match_at_every_position() {
    for model in MODELS {
        let r = Reference::load(model);
        let mut be = backend(model);
        let p = r.prompts() - 1; // the longest prompt, past the sliding window
        let tokens = r.ids(&format!("prompt{p}.tokens"));
        let (shape, logits) = r.f32s(&format!("prompt{p}.logits"));
        let v = shape[1];
        let seq = be.alloc_seq(tokens.len()).unwrap();
        // Prefill a few tokens, then one at a time through the KV cache.
        let first = be
            .forward(&[SeqStep {
                seq,
                tokens: &tokens[..3],
            }])
            .unwrap();
        let mut worst = rel_err(&first[0], &logits[2 * v..3 * v]);
        for (i, t) in tokens.iter().enumerate().skip(3) {
            let out = be
                .forward(&[SeqStep {
                    seq,
                    tokens: std::slice::from_ref(t),
                }])
                .unwrap();
            worst = worst.max(rel_err(&out[0], &logits[i * v..(i + 1) * v]));
        }
        eprintln!(
            "{model}: decode over {} positions, max |Δ| / range = {worst:.2e}",
            tokens.len()
        );
        assert!(worst <= 1e-3, "{model}: {worst}");
        assert_eq!(be.seq_len(seq), Some(tokens.len()));
    }
}

#[test]
fn hidden_states_match_at_every_layer() {
    for model in MODELS {
        let r = Reference::load(model);
        let mut be = backend(model);
        let p = r.prompts() - 1;
        let tokens = r.ids(&format!("prompt{p}.tokens"));
        let trace = be.trace_prompt(&tokens).unwrap();
        assert_eq!(trace.len(), be.config().num_hidden_layers + 1);
        for (i, got) in trace.iter().enumerate() {
            let (_, want) = r.f32s(&format!("prompt{p}.hidden{i}"));
            let e = rel_err(got, &want);
            assert!(e <= 1e-4, "{model} hidden state {i}: {e}");
        }
        assert_eq!(
            be.seq_len(mxtune::engine::backend::SeqId(0)),
            None,
            "trace frees its slot"
        );
    }
}

#[test]
fn greedy_continuations_match_token_for_token() {
    for model in MODELS {
        let r = Reference::load(model);
        let mut be = backend(model);
        for p in 0..r.prompts() {
            let tokens = r.ids(&format!("prompt{p}.tokens"));
            let want = r.ids(&format!("prompt{p}.greedy"));
            let seq = be.alloc_seq(tokens.len() + want.len()).unwrap();
            let mut logits = be
                .forward(&[SeqStep {
                    seq,
                    tokens: &tokens,
                }])
                .unwrap()
                .remove(0);
            let mut got = Vec::new();
            for _ in 0..want.len() {
                let t = argmax(&logits);
                got.push(t);
                logits = be
                    .forward(&[SeqStep { seq, tokens: &[t] }])
                    .unwrap()
                    .remove(0);
            }
            assert_eq!(got, want, "{model} prompt {p}");
            be.free_seq(seq);
        }
    }
}

#[test]
fn mixed_batch_of_prefills_and_decodes_matches_single_runs() {
    let model = "tiny-a";
    let r = Reference::load(model);
    let mut be = backend(model);
    let n = r.prompts();
    let prompts: Vec<Vec<u32>> = (0..n)
        .map(|p| r.ids(&format!("prompt{p}.tokens")))
        .collect();
    let seqs: Vec<_> = prompts
        .iter()
        .map(|t| be.alloc_seq(t.len() + 1).unwrap())
        .collect();
    // Step 1: the first prompt alone; step 2: its decode together with every other prefill.
    let out = be
        .forward(&[SeqStep {
            seq: seqs[0],
            tokens: &prompts[0],
        }])
        .unwrap();
    let next0 = argmax(&out[0]);
    let mut batch = vec![SeqStep {
        seq: seqs[0],
        tokens: std::slice::from_ref(&next0),
    }];
    for p in 1..n {
        batch.push(SeqStep {
            seq: seqs[p],
            tokens: &prompts[p],
        });
    }
    let out = be.forward(&batch).unwrap();
    assert_eq!(out.len(), n);
    for p in 1..n {
        let (shape, logits) = r.f32s(&format!("prompt{p}.logits"));
        let v = shape[1];
        let e = rel_err(&out[p], &logits[(prompts[p].len() - 1) * v..]);
        assert!(e <= 1e-3, "prompt {p} in a mixed batch: {e}");
    }
    // The decoded token of sequence 0 is the first greedy token, and its next argmax the second.
    let greedy = r.ids("prompt0.greedy");
    assert_eq!(next0, greedy[0]);
    assert_eq!(argmax(&out[0]), greedy[1]);
}

#[test]
fn kv_budget_and_bad_steps_are_errors_not_panics() {
    let mut be = backend("tiny-b");
    let a = be.alloc_seq(3000).unwrap();
    assert!(
        be.alloc_seq(2000).is_none(),
        "budget of 4096 positions exceeded"
    );
    be.free_seq(a);
    let b = be.alloc_seq(2).unwrap();
    assert!(
        be.forward(&[SeqStep {
            seq: b,
            tokens: &[1, 2, 3]
        }])
        .is_err(),
        "over capacity"
    );
    assert!(
        be.forward(&[SeqStep {
            seq: b,
            tokens: &[]
        }])
        .is_err(),
        "empty step"
    );
    assert!(
        be.forward(&[SeqStep {
            seq: b,
            tokens: &[100_000]
        }])
        .is_err(),
        "token out of vocab"
    );
    be.free_seq(b);
    assert!(
        be.forward(&[SeqStep {
            seq: b,
            tokens: &[1]
        }])
        .is_err(),
        "freed sequence"
    );
}

// ---- loader error paths: broken copies of a fixture in a temp dir ----

type RawTensors = std::collections::BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>;

/// Copy fixture `model` into a temp dir, letting `edit` change the tensors of `file`.
fn broken_copy(model: &str, file: &str, edit: impl FnOnce(&mut RawTensors)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixtures().join(model)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    let path = dir.path().join(file);
    let bytes = std::fs::read(&path).unwrap();
    let mut raw: RawTensors = SafeTensors::deserialize(&bytes)
        .unwrap()
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, (t.dtype(), t.shape().to_vec(), t.data().to_vec())))
        .collect();
    edit(&mut raw);
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = raw
        .iter()
        .map(|(n, (d, s, b))| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    std::fs::write(&path, safetensors::tensor::serialize(views, None).unwrap()).unwrap();
    dir
}

fn load_err(dir: &Path) -> String {
    match loader::load(dir) {
        Ok(_) => panic!("{} loaded although it is broken", dir.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn unchanged_copy_loads_and_maps_tensors() {
    let dir = broken_copy("tiny-b", "model.safetensors", |_| {});
    let w = loader::load(dir.path()).unwrap();
    assert_eq!(w.layers.len(), 5);
    assert!(w.lm_head.is_mapped() && w.layers[4].down.blocks.is_mapped());
    assert_eq!(w.layers[0].gate_up.rows, 2 * w.config.intermediate_size);
}

#[test]
fn missing_tensor_is_named() {
    let name = "model.layers.3.mlp.router.bias";
    let dir = broken_copy("tiny-b", "model.safetensors", |t| {
        t.remove(name).unwrap();
    });
    let e = load_err(dir.path());
    assert!(e.contains(name) && e.contains("missing"), "{e}");
}

#[test]
fn wrong_shape_names_file_and_tensor() {
    let name = "model.layers.1.self_attn.k_proj.weight";
    let dir = broken_copy("tiny-b", "model.safetensors", |t| {
        t.get_mut(name).unwrap().1.reverse();
    });
    let e = load_err(dir.path());
    assert!(
        e.contains(name) && e.contains("model.safetensors") && e.contains("shape"),
        "{e}"
    );
}

#[test]
fn wrong_dtype_is_named() {
    let name = "model.layers.0.mlp.experts.down_proj_scales";
    let dir = broken_copy("tiny-b", "model.safetensors", |t| {
        t.get_mut(name).unwrap().0 = Dtype::I8;
    });
    let e = load_err(dir.path());
    assert!(e.contains(name) && e.contains("dtype"), "{e}");
}

#[test]
fn truncated_file_is_named() {
    let dir = broken_copy("tiny-a", "model-00002-of-00002.safetensors", |_| {});
    let path = dir.path().join("model-00002-of-00002.safetensors");
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 1000)
        .unwrap();
    let e = load_err(dir.path());
    assert!(
        e.contains("model-00002-of-00002.safetensors") && e.contains("truncated"),
        "{e}"
    );
}

#[test]
fn missing_shard_is_named() {
    let dir = broken_copy("tiny-a", "model-00001-of-00002.safetensors", |_| {});
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let e = load_err(dir.path());
    assert!(
        e.contains("model-00002-of-00002.safetensors") && e.contains("does not exist"),
        "{e}"
    );
}

#[test]
fn non_gpt_oss_configs_are_refused() {
    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit); 3] = [
        ("gpt_oss", |c| c["model_type"] = "llama".into()),
        ("mxfp4", |c| {
            c.as_object_mut().unwrap().remove("quantization_config");
        }),
        ("num_key_value_heads", |c| {
            c["num_key_value_heads"] = 4.into()
        }),
    ];
    for (needle, edit) in edits {
        let dir = broken_copy("tiny-b", "model.safetensors", |_| {});
        let path = dir.path().join("config.json");
        let mut c: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        edit(&mut c);
        std::fs::write(&path, c.to_string()).unwrap();
        let e = load_err(dir.path());
        assert!(
            e.contains("config.json") && e.contains(needle),
            "{needle}: {e}"
        );
    }
}

#[test]
fn synthetic_tiny_serves_real_token_ids_deterministically() {
    use mxtune::engine::synthetic;
    let mut be = CpuBackend::new(synthetic::build("tiny", 0).unwrap(), 64);
    assert_eq!(be.weights().source, "synthetic:tiny");
    // <|start|>user<|message|>Hi… : harmony special ids need the full 201088 vocabulary.
    let prompt = [200_006, 1428, 200_008, 12_194, 200_007, 200_006, 173_781];
    let (a, b) = (be.alloc_seq(16).unwrap(), be.alloc_seq(16).unwrap());
    let first = be
        .forward(&[SeqStep {
            seq: a,
            tokens: &prompt,
        }])
        .unwrap()
        .remove(0);
    assert_eq!(first.len(), 201_088);
    assert!(first.iter().all(|v| v.is_finite()));
    // The same prompt in another sequence, batched with a decode of the first: same logits.
    let next = argmax(&first);
    let out = be
        .forward(&[
            SeqStep {
                seq: a,
                tokens: &[next],
            },
            SeqStep {
                seq: b,
                tokens: &prompt,
            },
        ])
        .unwrap();
    assert_eq!(out[1], first);
    assert_ne!(out[0], first);
}
