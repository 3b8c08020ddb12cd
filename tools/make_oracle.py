#!/usr/bin/env python3
"""Build tiny random gpt-oss checkpoints (HF release layout, MXFP4 experts) and reference outputs.

The engine's CPU backend is checked against these files (tests/engine_oracle.rs).
Runs on CPU:  pip install torch transformers accelerate safetensors
Usage:        python3 tools/make_oracle.py --out tests/fixtures/oracle
"""

import argparse
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import GptOssConfig, GptOssForCausalLM

FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]

# Two shapes that differ in every size the engine reads from config.json.
MODELS = {
    "tiny-a": dict(seed=1, layers=4, hidden=128, heads=4, kv_heads=2, head_dim=64,
                   intermediate=96, experts=8, top_k=4, vocab=512, window=8,
                   shards=2, layer_types=None),
    "tiny-b": dict(seed=2, layers=5, hidden=96, heads=6, kv_heads=2, head_dim=32,
                   intermediate=64, experts=12, top_k=4, vocab=384, window=6,
                   shards=1, layer_types=["full_attention", "sliding_attention",
                                          "sliding_attention", "full_attention",
                                          "sliding_attention"]),
}
PROMPT_LENS = [1, 5, 19, 27]
GREEDY_TOKENS = 32


def own_dequant(blocks, scales):
    """Independent MXFP4 decoding: [..., G, 16] u8 + [..., G] u8 -> [..., G*32] f32."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    lo = lut[(blocks & 0x0F).long()]
    hi = lut[(blocks >> 4).long()]
    vals = torch.stack([lo, hi], dim=-1).reshape(*blocks.shape[:-1], 32)
    vals = vals * torch.pow(2.0, scales.to(torch.float32) - 127.0).unsqueeze(-1)
    return vals.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)


def dequant_to_hf(blocks, scales):
    """[E, out, G, 16] -> HF parameter layout [E, in, out] (f32), cross-checked two ways."""
    mine = own_dequant(blocks, scales).transpose(1, 2).contiguous()
    try:
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    except ImportError:
        print("note: convert_moe_packed_tensors unavailable; using own decoder only")
        return mine
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    if theirs.shape != mine.shape:
        sys.exit(f"dequant shape mismatch {theirs.shape} vs {mine.shape}")
    d = (theirs.float() - mine).abs().max().item()
    if d != 0.0:
        sys.exit(f"own MXFP4 decoder differs from transformers by {d}")
    return theirs.float()


def make_config(s):
    layer_types = s["layer_types"] or [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(s["layers"])]
    cfg = GptOssConfig(
        num_hidden_layers=s["layers"], hidden_size=s["hidden"], head_dim=s["head_dim"],
        num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
        intermediate_size=s["intermediate"], num_local_experts=s["experts"],
        num_experts_per_tok=s["top_k"], experts_per_token=s["top_k"],
        vocab_size=s["vocab"], sliding_window=s["window"], layer_types=layer_types,
        rope_theta=150000.0, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                      "beta_slow": 1.0, "truncate": False,
                      "original_max_position_embeddings": 4096},
        swiglu_limit=7.0, tie_word_embeddings=False, attention_bias=True,
        eos_token_id=s["vocab"] - 2, pad_token_id=s["vocab"] - 1,
        router_aux_loss_coef=0.0, output_router_logits=False,
    )
    cfg._attn_implementation = "eager"
    return cfg, layer_types


def bf16(t):
    return t.to(torch.bfloat16)


def build(name, s, out_dir):
    g = torch.Generator().manual_seed(s["seed"])
    cfg, layer_types = make_config(s)
    torch.manual_seed(s["seed"])
    model = GptOssForCausalLM(cfg).eval().float()
    H, E, I = s["hidden"], s["experts"], s["intermediate"]

    def rnd(*shape, scale):
        return torch.randn(*shape, generator=g) * scale

    def ru8(*shape, lo, hi):
        return torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.uint8)

    ckpt = {}  # release-layout tensors written to disk
    params = dict(model.named_parameters())
    for pname, p in params.items():
        if ".mlp.experts." in pname and not pname.endswith("_bias"):
            continue  # set from packed MXFP4 below
        if pname.endswith("norm.weight"):
            val = 1.0 + rnd(*p.shape, scale=0.2)
        elif pname.endswith("sinks"):
            val = rnd(*p.shape, scale=1.0)
        elif pname.endswith("bias"):
            val = rnd(*p.shape, scale=0.1)
        elif pname.endswith("embed_tokens.weight"):
            val = rnd(*p.shape, scale=1.0)
        else:
            val = rnd(*p.shape, scale=1.0 / math.sqrt(p.shape[-1]))
        val = bf16(val)
        ckpt[pname] = val.contiguous()
        with torch.no_grad():
            p.copy_(val.float())

    for li in range(s["layers"]):
        pre = f"model.layers.{li}.mlp.experts."
        exp = model.model.layers[li].mlp.experts
        for proj, rows, cols in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
            blocks = ru8(E, rows, cols // 32, 16, lo=0, hi=255)
            # Scale bytes 119..123 (2^-8..2^-4): mean |w| near 1/sqrt(fan_in).
            scales = ru8(E, rows, cols // 32, lo=119, hi=123)
            w = dequant_to_hf(blocks, scales)
            with torch.no_grad():
                getattr(exp, proj).copy_(w)
            ckpt[pre + proj + "_blocks"] = blocks
            ckpt[pre + proj + "_scales"] = scales

    # Write the release layout.
    mdir = os.path.join(out_dir, name)
    os.makedirs(mdir, exist_ok=True)
    names = sorted(ckpt)
    if s["shards"] == 1:
        save_file(ckpt, os.path.join(mdir, "model.safetensors"), metadata={"format": "pt"})
    else:
        n = s["shards"]
        files = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        weight_map = {}
        parts = [dict() for _ in range(n)]
        for k in names:
            # Layers split across shards; globals in the first; layer 1 straddles by name order.
            if k.startswith("model.layers."):
                li = int(k.split(".")[2])
                idx = min(n - 1, li * n // s["layers"])
            else:
                idx = 0
            parts[idx][k] = ckpt[k]
            weight_map[k] = files[idx]
        total = 0
        for f, part in zip(files, parts):
            save_file(part, os.path.join(mdir, f), metadata={"format": "pt"})
            total += sum(t.numel() * t.element_size() for t in part.values())
        with open(os.path.join(mdir, "model.safetensors.index.json"), "w") as fh:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)

    conf = cfg.to_dict()
    conf["architectures"] = ["GptOssForCausalLM"]
    conf["model_type"] = "gpt_oss"
    conf["torch_dtype"] = "bfloat16"
    conf["layer_types"] = layer_types
    conf["rope_scaling"] = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                            "beta_slow": 1.0, "truncate": False,
                            "original_max_position_embeddings": 4096}
    conf["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"]}
    conf.pop("_attn_implementation_autoset", None)
    with open(os.path.join(mdir, "config.json"), "w") as fh:
        json.dump(conf, fh, indent=2, sort_keys=True, default=str)

    # Reference outputs, fp32 math over the bf16/MXFP4 weights.
    ref = {}
    rot = model.model.rotary_emb
    ref["rope_inv_freq"] = rot.inv_freq.detach().float().contiguous()
    ref["rope_attention_scaling"] = torch.tensor([float(rot.attention_scaling)])
    pg = torch.Generator().manual_seed(100 + s["seed"])
    margins = []
    with torch.no_grad():
        for pi, plen in enumerate(PROMPT_LENS):
            toks = torch.randint(0, s["vocab"], (1, plen), generator=pg)
            outp = model(input_ids=toks, output_hidden_states=True, use_cache=False)
            ref[f"prompt{pi}.tokens"] = toks[0].to(torch.int64).contiguous()
            ref[f"prompt{pi}.logits"] = outp.logits[0].float().contiguous()
            if pi == len(PROMPT_LENS) - 1:
                for hi_, hs in enumerate(outp.hidden_states):
                    ref[f"prompt{pi}.hidden{hi_}"] = hs[0].float().contiguous()
            # Greedy continuation by full recomputation (no cache involved).
            seq = toks
            gen = []
            for _ in range(GREEDY_TOKENS):
                lg = model(input_ids=seq, use_cache=False).logits[0, -1].float()
                top2 = torch.topk(lg, 2).values
                margins.append((top2[0] - top2[1]).item())
                nxt = int(torch.argmax(lg).item())
                gen.append(nxt)
                seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
            ref[f"prompt{pi}.greedy"] = torch.tensor(gen, dtype=torch.int64)
            # Same continuation through HF's KV cache, as a cross-check.
            hfgen = model.generate(toks, max_new_tokens=GREEDY_TOKENS, do_sample=False,
                                   min_new_tokens=GREEDY_TOKENS, pad_token_id=s["vocab"] - 1)
            same = hfgen[0, plen:].tolist() == gen
            print(f"{name} prompt{pi} len {plen}: greedy cached==recomputed {same}; "
                  f"logit range {outp.logits.max().item() - outp.logits.min().item():.3f}")
    save_file(ref, os.path.join(out_dir, f"{name}.reference.safetensors"))
    print(f"{name}: min greedy top-2 margin {min(margins):.5f}")
    print(f"{name}: inv_freq {ref['rope_inv_freq'][:4].tolist()} ... "
          f"scaling {ref['rope_attention_scaling'].item():.7f}")

    # Optional: transformers itself loads the saved MXFP4 checkpoint (dequantizing on CPU).
    try:
        from transformers import Mxfp4Config
        kw = dict(quantization_config=Mxfp4Config(dequantize=True), attn_implementation="eager")
        try:  # transformers 5 names it `dtype`, 4.x `torch_dtype`
            m2 = GptOssForCausalLM.from_pretrained(mdir, dtype=torch.float32, **kw)
        except TypeError:
            m2 = GptOssForCausalLM.from_pretrained(mdir, torch_dtype=torch.float32, **kw)
        m2 = m2.float().eval()
        toks = ref[f"prompt{len(PROMPT_LENS) - 1}.tokens"].unsqueeze(0)
        with torch.no_grad():
            lg2 = m2(input_ids=toks, use_cache=False).logits[0].float()
        d = (lg2 - ref[f"prompt{len(PROMPT_LENS) - 1}.logits"]).abs().max().item()
        print(f"{name}: reload via from_pretrained max|dlogit| = {d:.3e}")
    except Exception as e:  # noqa: BLE001 - a diagnostic only
        print(f"{name}: reload via from_pretrained skipped: {type(e).__name__}: {e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    import transformers
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for name, s in MODELS.items():
        build(name, s, args.out)


if __name__ == "__main__":
    main()
