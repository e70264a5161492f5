#!/usr/bin/env python3
"""The GPU precision gate: met in bf16 against transformers in float32, judged by the
distance transformers' own bf16 keeps from float32 on the same weights and positions.

Why this exists: random models with transformers' default init (std 0.02) attend almost
uniformly, so a wrong score, softmax or block-table walk barely moves their output. The
gate draws *sharp* weights instead, so that attention picks out a few keys:

- q/k projections with std sqrt(SCORE_STD / hidden), which gives pre-softmax scores of
  std ~SCORE_STD (4) for models without q/k norms; for Qwen3's q/k RMSNorms the norm
  weights are drawn around QK_NORM_GAIN (2), which gives the same score spread;
- every other matrix and bias std 0.03; norm weights uniform in 1 +- 0.1.

The report shows the sharpness measured on each model (the mean largest attention weight of
a query and the mean effective number of keys, exp(entropy), at 512 tokens, eager float32
transformers).

Eight shapes unlike the shipped configs, one per supported architecture (tied Llama with
llama3 rope scaling, Mistral with a sliding window shorter than the prompts, Qwen2 with
q/k/v biases, Qwen3 with head_dim 128 and 5 layers, Qwen3-MoE with 16 experts, and the
hybrids Qwen3-Next, Qwen3.5 dense and Qwen3.5-MoE, whose Gated DeltaNet layers carry a
recurrent state that prefix hits restore from snapshots), each with SEEDS independent weight
draws. For each model:

- run A: prompts of 16 to 2,048 random tokens (4,096 for the Qwen3 and hybrid shapes) in one batch,
  prefill chunks of CHUNK tokens (`--max-prefill-chunk`), KV blocks of 16;
- run B: prefix-cache hits: a base prompt, then prompts that share 1,024 and 1,536 of its
  tokens, one at a time (`--max-num-seqs 1`) so the later ones read the earlier one's
  cached blocks; the hit is checked through met's `cached_prompt_tokens`.

Each run generates NEW_TOKENS greedy tokens with the top-20 logprobs of every step. The
references are teacher-forced on met's own continuation (one forward over prompt +
continuation), so the last prompt position (prefill attention) and every decode step
(decode attention) are compared at the same positions and contexts.

Measures, per (architecture, case), over the rows of every seed:
- met's |dlogprob|: |met's logprob - float32's| of met's top-20 tokens at each row;
- the noise floor: the same for transformers-bf16's top-20 tokens against float32;
- greedy departures: rows where met's token is not float32's argmax, with float32's
  logprob margin between the two.

The gate (exit status 1 when broken):
- mean and p99 of met's |dlogprob| at most RATIO (1.5) x the noise floor's, per case;
- every greedy departure at a margin of at most twice the largest noise |dlogprob| of that
  case (a flip needs the two logprobs to move by the margin between them).

FP8 weights (`--shapes qwen3-fp8-block,llama-fp8-tensor`; not in the default set): two
shapes whose decoder matrices met keeps e4m3 on the GPU (rows a multiple of 16, columns of
128), a Qwen3 with transformers' block-wise `fp8` (128 x 128 scales) and a Llama with AutoFP8's
static per-tensor `fp8`. `gpu_gate_fp8.py` quantizes each draw as a checkpoint would and
writes its float32 dequantized twin; the float32 reference runs on the twin (the values met
computes with), the noise floor is transformers' bf16 with FP8 linears (its own where it runs
them, else an emulation of their arithmetic: that file's docstring says why and what), and
transformers-bf16 on the dequantized weights is recorded beside it (`dequant_bf16_*`). The
same bound holds; the broken variant for them is `fp8-wrong-scale` (every other scale
doubled on upload). `--seeds N` runs the first N draws only, to check the script on a CPU.

FP8 KV cache (`--kv-cache-dtype fp8`, any shapes): each draw gets per-layer KV scales, the
largest |key| and |value| of a calibration prompt over 448 (`kv_fp8_checkpoint`), which met
reads as `self_attn.k_scale` / `v_scale` beside the weights and runs e4m3 KV pools with; both
references see what such a cache holds: every attention layer's keys and values, after
rotary and q/k norms and for the current tokens too, rounded to e4m3 under those scales
(`kv_fp8_patch`, eager attention), in float32 and in bf16, so the floor is bf16's distance
with the same cache. met's startup line must name the e4m3 pools. The same bound holds; the
broken variants `drop-last-kv-block` (compiled into the e4m3 kernels too) and
`fp8-kv-wrong-scale` (values read under the keys' scale) must fail.

`--broken FAULT` also runs met with `MET_TEST_FAULT=FAULT` (a deliberately wrong kernel,
compiled in only when that variable is set) on the first seed of every shape, and requires
that variant to FAIL the gate: the test of the test. The exit status is 0 only when met
passes and the broken variant fails.

Runs on the GPU machine from the gpu-bundle runner:
    python3 gpu_gate.py --met ./met --work /tmp/gate --out gate.json --broken drop-last-kv-block
Needs torch, transformers, safetensors (no downloads: weights are random). `--device cpu`
runs the same on the CPU (met's f32 backend, float32 transformers), to check the script.
"""

import argparse
import importlib
import json
import math
import os
import re
import subprocess
import sys
import time

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

import gpu_gate_fp8 as fp8

# Eight draws: a case's p99 pools 8 x 16 rows. The rows' 20 |dlogprob|s move together (one
# shifted log-sum-exp moves them all), so a p99 of three draws rests on about one row: on
# qwen3-next "prefix hit 1536+100" per-draw p99 ratios of bit-identical runs (with and
# without the prefix cache) spread from 0.64 to 2.11 over seeds 11-18, while twelve draws
# pooled gave 1.02 (bench/results/gate-qwen3next-hit-2026-12-03).
SEEDS = list(range(11, 19))
LENS = [16, 64, 200, 513, 1024, 2048]
LONG = 4096  # for the shape marked long
NEW_TOKENS = 16
TOP = 20
CHUNK = 256
BLOCK = 16
RATIO = 1.5
SCORE_STD = 4.0
QK_NORM_GAIN = 2.0
VOCAB = 32000

COMMON = {"vocab_size": VOCAB, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "hidden_act": "silu",
          "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}
HYBRID_COMMON = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
                 "head_dim": 64, "full_attention_interval": 2, "layer_types": ["linear_attention", "full_attention"] * 2,
                 "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 64,
                 "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4, "tie_word_embeddings": False,
                 "attention_bias": False}
HYBRID_ROPE = {"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25,
               "mrope_section": [4, 2, 2], "mrope_interleaved": True}
SHAPES = [
    # (name, config, long prompt)
    ("llama-tied-rope3", {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 768,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
        "tie_word_embeddings": True, "rope_theta": 500000.0, "attention_bias": False, "mlp_bias": False,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 1024}}, False),
    ("mistral-window512", {
        "model_type": "mistral", "architectures": ["MistralForCausalLM"], "hidden_size": 256,
        "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 32, "sliding_window": 512, "rope_theta": 10000.0, "tie_word_embeddings": False}, False),
    ("qwen2-bias", {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 384, "intermediate_size": 1024,
        "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2, "rope_theta": 1000000.0,
        "use_sliding_window": False, "tie_word_embeddings": False}, False),
    ("qwen3-hd128", {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 256, "intermediate_size": 768,
        "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
        "rope_theta": 1000000.0, "use_sliding_window": False, "tie_word_embeddings": True,
        "attention_bias": False}, True),
    ("qwen3-moe-16e", {
        "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 256,
        "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 3,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "num_experts": 16,
        "num_experts_per_tok": 4, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
        "rope_theta": 1000000.0, "use_sliding_window": False, "tie_word_embeddings": False,
        "attention_bias": False, "router_aux_loss_coef": 0.001}, False),
    # The hybrids: Gated DeltaNet layers every other layer, gated full attention with partial
    # rotary between them.
    ("qwen3-next", {
        "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], **HYBRID_COMMON,
        "intermediate_size": 768, "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 128, "norm_topk_prob": True, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}, True),
    ("qwen3.5-dense", {
        "model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"], **HYBRID_COMMON,
        "intermediate_size": 768, "attn_output_gate": True, "rope_parameters": HYBRID_ROPE}, True),
    ("qwen3.5-moe", {
        "model_type": "qwen3_5_moe_text", "architectures": ["Qwen3_5MoeForCausalLM"], **HYBRID_COMMON,
        "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 128, "attn_output_gate": True, "rope_parameters": HYBRID_ROPE}, True),
]
# FP8 weights: every decoder matrix a multiple of 16 rows and 128 columns, so that met keeps
# all of them e4m3 on the GPU (others it widens to bf16, and no FP8 kernel would be judged).
FP8_SHAPES = [
    # (name, config, long prompt, scale layout of `gpu_gate_fp8.LAYOUTS`)
    ("qwen3-fp8-block", {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 512, "intermediate_size": 1536,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
        "rope_theta": 1000000.0, "use_sliding_window": False, "tie_word_embeddings": False,
        "attention_bias": False}, True, "block"),
    ("llama-fp8-tensor", {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 512, "intermediate_size": 1536,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
        "tie_word_embeddings": False, "rope_theta": 500000.0, "attention_bias": False, "mlp_bias": False},
     False, "tensor"),
]
HYBRIDS = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"}
# A = exp(A_log) log-uniform in [A_MIN, A_MAX] and dt_bias ~ N(-1, 0.5) spread the per-head
# decays exp(-A softplus(a + dt_bias)) from ~0.99 (a state carried across many chunks) to
# ~0.45, as `hf_fixtures_hybrid.py` draws them.
A_MIN, A_MAX = 0.02, 2.0


def hybrid_draw(name, shape, g):
    """A hybrid's own draw for `name`, or None where the common rule holds. Their RMSNorms
    scale by (1 + w), so w is drawn around gain - 1; the linear-attention layers' gated norm
    is a plain w. The conv taps are unit-scale, so that those layers move the residual
    stream as much as attention does (taps of 0.03 would make them nearly silent)."""
    uniform = lambda lo, hi: lo + (hi - lo) * torch.rand(shape, generator=g)  # noqa: E731
    if name.endswith("linear_attn.A_log"):
        return uniform(math.log(A_MIN), math.log(A_MAX))
    if name.endswith("linear_attn.dt_bias"):
        return torch.randn(shape, generator=g) * 0.5 - 1.0
    if name.endswith("linear_attn.conv1d.weight"):
        return torch.randn(shape, generator=g) / math.sqrt(shape[-1])
    if name.endswith("linear_attn.norm.weight"):
        return uniform(0.9, 1.1)
    if name.endswith("norm.weight"):
        gain = QK_NORM_GAIN if ("q_norm" in name or "k_norm" in name) else 1.0
        return gain * uniform(0.9, 1.1) - 1.0
    return None


def sharpen(model, hidden, seed, hybrid):
    """Redraws every parameter as the module docstring says (`hybrid_draw` first for the
    hybrids)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    qk_std = math.sqrt(SCORE_STD / hidden)
    qk_norm = any("q_norm" in n for n, _ in model.named_parameters())
    with torch.no_grad():
        for name, p in model.named_parameters():
            own = hybrid_draw(name, p.shape, g) if hybrid else None
            if own is not None:
                new = own
            elif name.endswith("norm.weight"):
                gain = QK_NORM_GAIN if ("q_norm" in name or "k_norm" in name) else 1.0
                new = gain * (1.0 + 0.1 * (2 * torch.rand(p.shape, generator=g) - 1))
            elif ("q_proj" in name or "k_proj" in name) and name.endswith("weight") and not qk_norm:
                new = torch.randn(p.shape, generator=g) * qk_std
            else:
                new = torch.randn(p.shape, generator=g) * 0.03
            p.copy_(new.to(p.dtype))


def draw(raw, seed):
    """Sharp random weights for the config `raw` (with COMMON), rounded to bf16."""
    cfg = AutoConfig.for_model(raw["model_type"], **{k: v for k, v in raw.items() if k != "model_type"})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    sharpen(model, raw["hidden_size"], seed, raw["model_type"] in HYBRIDS)
    return model.to(torch.bfloat16)


def build(name, raw, work, seed):
    """Sharp random weights, rounded to bf16 and saved as a checkpoint with the config."""
    out = os.path.join(work, f"{name}-s{seed}")
    raw = {**COMMON, **raw}
    model = draw(raw, seed)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    del model
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(raw, f, indent=2)
    gen = os.path.join(out, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    return out


def build_fp8(name, raw, layout, work, seed):
    """The FP8 checkpoint of a draw (met's) and its float32 dequantized twin (the references'),
    as `gpu_gate_fp8.write` makes them."""
    out = os.path.join(work, f"{name}-s{seed}")
    raw = {**COMMON, **raw}
    fp8.write(draw(raw, seed), raw, layout, out, out + "-dequant", seed)
    return out, out + "-dequant"


# Model types whose eager attention `kv_fp8_patch` has wrapped, and what the wrapper does:
# with `amax` a dict, it records each attention layer's largest |key| and |value|; with
# `scales` a dict, it rounds keys and values to e4m3 under `scales[layer]` (k, v); with
# neither, nothing (the sharpness probe of a new draw).
KV_FP8_PATCHED = set()
KV_FP8 = {"amax": None, "scales": None}
E4M3_MAX = 448.0


def e4m3(x, scale):
    """`x` as an e4m3 cache with `scale` holds it (x / scale rounded to e4m3, saturated, times
    scale), in x's dtype."""
    q = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).to(x.dtype)


def kv_fp8_patch(model_type):
    """Wraps the eager attention of `model_type`'s modeling module as `KV_FP8` says (its
    arguments come after rotary and q/k norms, before the heads repeat)."""
    module = model_type.removesuffix("_text")
    if module in KV_FP8_PATCHED:
        return
    mod = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    original = mod.eager_attention_forward

    def attention(layer, query, key, value, *args, **kwargs):
        i = layer.layer_idx
        if KV_FP8["amax"] is not None:
            k, v = KV_FP8["amax"].get(i, (0.0, 0.0))
            KV_FP8["amax"][i] = (max(k, float(key.abs().max())), max(v, float(value.abs().max())))
            return original(layer, query, key, value, *args, **kwargs)
        if KV_FP8["scales"] is None:
            return original(layer, query, key, value, *args, **kwargs)
        ks, vs = KV_FP8["scales"][i]
        return original(layer, query, e4m3(key, ks), e4m3(value, vs), *args, **kwargs)

    mod.eager_attention_forward = attention
    KV_FP8_PATCHED.add(module)


@torch.no_grad()
def kv_fp8_checkpoint(path, model, device, seed):
    """Calibrates per-layer KV scales on `model` (float32, patched), as FP8 checkpoints with a
    KV-cache scheme carry them: the largest |key| and |value| of a 1,024-token prompt over
    448, and writes met's view of `path` with them (`self_attn.k_scale` and `v_scale` of each
    attention layer, beside the checkpoint's own tensors through an index). Returns that
    directory; the references round with the same scales from here on."""
    g = torch.Generator().manual_seed(seed * 104729)
    ids = torch.randint(3, VOCAB, (1, 1024), generator=g).to(device)
    KV_FP8["amax"] = {}
    model(input_ids=ids)
    amax, KV_FP8["amax"] = KV_FP8["amax"], None
    KV_FP8["scales"] = {i: (max(k, 1e-6) / E4M3_MAX, max(v, 1e-6) / E4M3_MAX) for i, (k, v) in amax.items()}
    out = path + "-kv"
    os.makedirs(out, exist_ok=True)
    # The weights under another name: a `model.safetensors` would be read alone.
    links = {"config.json": "config.json", "model.safetensors": "weights.safetensors"}
    for src, dst in links.items():
        if not os.path.lexists(os.path.join(out, dst)):
            os.symlink(os.path.abspath(os.path.join(path, src)), os.path.join(out, dst))
    scales = {}
    for i, (k, v) in KV_FP8["scales"].items():
        scales[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(k, dtype=torch.float32)
        scales[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(v, dtype=torch.float32)
    save_file(scales, os.path.join(out, "kv_scales.safetensors"))
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        weight_map = {name: "weights.safetensors" for name in f.keys()}
    weight_map.update({name: "kv_scales.safetensors" for name in scales})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return out, {i: list(s) for i, s in KV_FP8["scales"].items()}


def load(path, dtype, device, attn=None):
    kw = {"dtype": dtype}
    if attn:
        kw["attn_implementation"] = attn
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, **kw)
    bad = {k: list(v) for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:  # a reference with re-initialised tensors would judge met against another model
        raise SystemExit(f"{path}: transformers did not load the checkpoint cleanly: {bad}")
    return model.to(device).eval()


@torch.no_grad()
def sharpness(path, device, seed):
    """Mean largest attention weight and mean effective keys at 512 tokens (rows past 256)."""
    model = load(path, torch.float32, device, attn="eager")
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (1, 512), generator=g).to(device)
    att = model(input_ids=ids, output_attentions=True).attentions
    top, eff = [], []
    for a in (a for a in att if a is not None):  # [1, h, q, k]; None for a linear-attention layer
        a = a[0, :, 256:, :].float()
        top.append(float(a.max(-1).values.mean()))
        ent = -(a.clamp_min(1e-30).log() * a).sum(-1)
        eff.append(float(ent.exp().mean()))
    del model
    return sum(top) / len(top), sum(eff) / len(eff)


def prompts_for(seed, long):
    g = torch.Generator().manual_seed(seed * 7919)
    draw = lambda n: torch.randint(3, VOCAB, (n,), generator=g).tolist()  # noqa: E731
    lens = LENS + ([LONG] if long else [])
    batch = [(str(n), draw(n)) for n in lens]
    base = draw(1600)
    hits = [("prefix base 1600", base), ("prefix hit 1024+500", base[:1024] + draw(500)),
            ("prefix hit 1536+100", base[:1536] + draw(100))]
    return batch, hits


def run_met(met, model_dir, prompts, work, device, extra, env_extra):
    path = os.path.join(work, "prompts.jsonl")
    with open(path, "w") as f:
        for _, p in prompts:
            f.write(json.dumps({"prompt_ids": p}) + "\n")
    cmd = [met, "generate", "--model", model_dir, "--device", device, "--prompts-file", path,
           "--max-tokens", str(NEW_TOKENS), "--temperature", "0", "--top-logprobs", str(TOP), "--ignore-eos",
           "--block-size", str(BLOCK), "--json"] + extra
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "MET_LOG": "warn", **env_extra})
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        raise SystemExit(f"met generate failed ({res.returncode}): {' '.join(cmd)}")
    lines = sorted((json.loads(l) for l in res.stdout.splitlines() if l.strip()), key=lambda o: o["prompt"])
    assert len(lines) == len(prompts), f"{len(lines)} outputs for {len(prompts)} prompts"
    for (_, p), out in zip(prompts, lines):
        assert out["prompt_ids"] == p
        assert len(out["generated_ids"]) == NEW_TOKENS, f"met generated {len(out['generated_ids'])} tokens"
    return lines, res.stderr


@torch.no_grad()
def teacher_forced(model, prompt, cont, device):
    """Float32 log-softmax rows at the last prompt position and every decode step."""
    ids = torch.tensor([prompt + cont[:-1]], device=device)
    logits = model(input_ids=ids, logits_to_keep=len(cont)).logits[0].float()
    return torch.log_softmax(logits, -1)


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


class Case:
    """Everything measured for one (shape, case) over the seeds."""

    def __init__(self):
        self.met, self.noise, self.departures, self.hf_departures, self.rows = [], [], [], [], 0
        self.info = []

    def summary(self):
        mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
        noise_max = max(self.noise, default=0.0)
        allowed = 2 * noise_max
        bad = [d for d in self.departures if d > allowed]
        s = {
            "rows": self.rows,
            "met_mean": mean(self.met), "met_p99": percentile(self.met, 0.99), "met_max": max(self.met, default=0),
            "bf16_mean": mean(self.noise), "bf16_p99": percentile(self.noise, 0.99), "bf16_max": noise_max,
            "met_departures": len(self.departures), "met_departure_max_margin": max(self.departures, default=0.0),
            "bf16_departures": len(self.hf_departures), "allowed_margin": allowed, "departures_outside_noise": bad,
        }
        s["mean_ratio"] = s["met_mean"] / max(s["bf16_mean"], 1e-12)
        s["p99_ratio"] = s["met_p99"] / max(s["bf16_p99"], 1e-12)
        s["pass"] = s["mean_ratio"] <= RATIO and s["p99_ratio"] <= RATIO and not bad
        if self.info:
            s["dequant_bf16_mean"], s["dequant_bf16_p99"] = mean(self.info), percentile(self.info, 0.99)
        return s


def judge(cases, prompts, outs, ref32, refs_bf16, refs_info=None):
    """Adds met's rows of one run to `cases[label-of-prompt]`; `refs_info` (FP8 shapes:
    transformers-bf16 on the dequantized weights) is measured as the floor is, not judged."""
    for k, ((case, p), out, r32, rb) in enumerate(zip(prompts, outs, ref32, refs_bf16)):
        c = cases.setdefault(case, Case())
        toks = out["generated_ids"]
        for step, tok in enumerate(toks):
            row32, rowb = r32[step], rb[step]
            for t, lp in out["top_logprobs"][step]:
                c.met.append(abs(lp - float(row32[t])))
            top = torch.topk(rowb, TOP).indices
            c.noise += (rowb[top] - row32[top]).abs().tolist()
            if refs_info is not None:
                rowi = refs_info[k][step]
                top_i = torch.topk(rowi, TOP).indices
                c.info += (rowi[top_i] - row32[top_i]).abs().tolist()
            best = int(torch.argmax(row32))
            if tok != best:
                c.departures.append(float(row32[best] - row32[tok]))
            if int(top[0]) != best:
                c.hf_departures.append(float(row32[best] - row32[int(top[0])]))
            c.rows += 1


def check_hits(prompts, outs, label):
    want = {"prefix hit 1024+500": 1024, "prefix hit 1536+100": 1536}
    for (case, _), out in zip(prompts, outs):
        if case in want and out["cached_prompt_tokens"] < want[case]:
            raise SystemExit(f"{label}: {case} read {out['cached_prompt_tokens']} cached tokens, "
                             f"expected at least {want[case]}: the prefix cache was not hit")


def checkpoint(name, raw, layout, args, seed):
    """The checkpoint met loads and the one the references load (the same one, or for FP8 its
    float32 dequantized twin)."""
    if layout is None:
        path = build(name, raw, args.work, seed)
        return path, path
    return build_fp8(name, raw, layout, args.work, seed)


def references(name, path, ref_path, layout, device, floors, kv_fp8=False):
    """float32, the noise floor's model, and for FP8 transformers-bf16 on the dequantized
    weights. An FP8 floor is transformers' own FP8 model while it runs here, else the emulated
    one; `floors[name]` records which, and why. With `kv_fp8` both attend over e4m3 keys and
    values (eager attention, patched)."""
    if kv_fp8:
        if layout is not None:
            raise SystemExit(f"{name}: --kv-cache-dtype fp8 takes the bf16 shapes")
        with open(os.path.join(path, "config.json")) as f:
            kv_fp8_patch(json.load(f)["model_type"])
        return load(path, torch.float32, device, attn="eager"), load(path, torch.bfloat16, device, attn="eager"), None
    m32 = load(ref_path, torch.float32, device)
    if layout is None:
        return m32, load(path, torch.bfloat16, device), None
    floor = None
    if floors.get(name, {}).get("native", True):
        floor, why = fp8.native(path, device)
        floors[name] = {"native": floor is not None, "reference": why if floor is not None else
                        "transformers-bf16 with gpu_gate_fp8.EmulatedFp8Linear", "why_not_native": why}
        if floor is None:
            print(f"gate: {name}: no native FP8 floor ({why}); emulating transformers' FP8Linear", file=sys.stderr)
    if floor is None:
        floor = fp8.emulated(load(ref_path, torch.bfloat16, device), path, layout, device)
    return m32, floor, load(ref_path, torch.bfloat16, device)


def check_fp8_log(stderr, name, results):
    """met's startup line about FP8 weights, kept in the report: without it met did not read
    the checkpoint as FP8."""
    line = next((l for l in stderr.splitlines() if "weights stay e4m3" in l), None)
    if line is None:
        raise SystemExit(f"{name}: met did not log FP8 weights staying e4m3:\n{stderr[-2000:]}")
    results.setdefault("met_fp8_log", {})[name] = re.sub(r"\x1b\[[0-9;]*m", "", line).strip()


def check_kv_log(stderr, name, results):
    """met's KV-cache startup line, kept in the report: it must name e4m3 pools."""
    line = next((l for l in stderr.splitlines() if "blocks of" in l), None)
    if line is None or "f8_e4m3" not in line:
        raise SystemExit(f"{name}: met did not log an e4m3 KV cache:\n{stderr[-2000:]}")
    results.setdefault("met_kv_log", {})[name] = re.sub(r"\x1b\[[0-9;]*m", "", line).strip()


def gate_shape(name, raw, long, layout, args, results, broken_results):
    device = args.device
    torch_device = "cuda" if device == "cuda" else "cpu"
    for i, seed in enumerate(SEEDS[: args.seeds]):
        t0 = time.time()
        path, ref_path = checkpoint(name, raw, layout, args, seed)
        KV_FP8["scales"] = None  # until this draw's are calibrated
        if i == 0:
            top, eff = sharpness(ref_path, torch_device, seed)
            results.setdefault("sharpness", {})[name] = {"mean_max_weight": top, "mean_effective_keys": eff}
        batch, hits = prompts_for(seed, long)
        runs = [(batch, ["--max-prefill-chunk", str(CHUNK)]), (hits, ["--max-num-seqs", "1"])]
        kv_fp8 = args.kv_cache_dtype == "fp8"
        floors = results.setdefault("noise_floor", {})
        m32, mb, mi = references(name, path, ref_path, layout, torch_device, floors, kv_fp8)
        met_path = path
        if kv_fp8:
            met_path, scales = kv_fp8_checkpoint(path, m32, torch_device, seed)
            results.setdefault("kv_scales", {}).setdefault(name, {})[seed] = scales
        log = {"MET_LOG": "info"} if layout or kv_fp8 else {}
        variants = [("met", log, results)]
        if args.broken and i == 0:
            variants.append(("broken", {**log, "MET_TEST_FAULT": args.broken}, broken_results))
        for label, env, into in variants:
            cases = into.setdefault("cases", {}).setdefault(name, {})
            for prompts, extra in runs:
                backend = ["--attention-backend", args.attention_backend] if args.attention_backend else []
                kv = ["--kv-cache-dtype", args.kv_cache_dtype] if args.kv_cache_dtype else []
                outs, stderr = run_met(args.met, met_path, prompts, args.work, device, extra + backend + kv, env)
                if layout:
                    check_fp8_log(stderr, name, results)
                if kv_fp8:
                    check_kv_log(stderr, name, results)
                check_hits(prompts, outs, f"{label} {name} seed {seed}")
                forced = lambda m: [teacher_forced(m, p, o["generated_ids"], torch_device)  # noqa: E731
                                    for (_, p), o in zip(prompts, outs)]
                judge(cases, prompts, outs, forced(m32), forced(mb), forced(mi) if mi is not None else None)
        del m32, mb, mi
        if torch_device == "cuda":
            torch.cuda.empty_cache()
        print(f"gate: {name} seed {seed} done in {time.time() - t0:.1f} s", file=sys.stderr, flush=True)


def table(title, summaries):
    lines = [title, f"{'shape':<18} {'case':<20} {'rows':>4} {'met mean':>9} {'bf16 mean':>9} {'ratio':>5} "
             f"{'met p99':>8} {'bf16 p99':>8} {'ratio':>5} {'depart':>6} {'bf16 dep':>8} {'max margin':>10} "
             f"{'allowed':>7}  result"]
    for shape, cases in summaries.items():
        for case, s in cases.items():
            lines.append(f"{shape:<18} {case:<20} {s['rows']:4} {s['met_mean']:9.4f} {s['bf16_mean']:9.4f} "
                         f"{s['mean_ratio']:5.2f} {s['met_p99']:8.4f} {s['bf16_p99']:8.4f} {s['p99_ratio']:5.2f} "
                         f"{s['met_departures']:6} {s['bf16_departures']:8} {s['met_departure_max_margin']:10.4f} "
                         f"{s['allowed_margin']:7.4f}  {'PASS' if s['pass'] else 'FAIL'}")
    return "\n".join(lines)


def summarize(raw):
    return {shape: {case: c.summary() for case, c in cases.items()} for shape, cases in raw.get("cases", {}).items()}


def fp8_floors(report):
    """The FP8 shapes' floors: what each is, and its distance from float32 beside that of
    transformers-bf16 on the dequantized weights."""
    lines = ["FP8 noise floors against float32 on the dequantized weights: the gate's floor (transformers' FP8 "
             "linear), and transformers-bf16 on the dequantized weights"]
    for name, f in report["noise_floor"].items():
        lines.append(f"  {name}: {f['reference']}" + ("" if f["native"] else f" (not native: {f['why_not_native']})"))
    lines.append(f"{'shape':<18} {'case':<20} {'floor mean':>10} {'floor p99':>9} {'dq-bf16 mean':>12} {'dq-bf16 p99':>11}")
    for shape in report["noise_floor"]:
        for case, s in report["met"].get(shape, {}).items():
            lines.append(f"{shape:<18} {case:<20} {s['bf16_mean']:10.4f} {s['bf16_p99']:9.4f} "
                         f"{s['dequant_bf16_mean']:12.4f} {s['dequant_bf16_p99']:11.4f}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--met", required=True)
    ap.add_argument("--work", default="/tmp/met-gate")
    ap.add_argument("--out", default="gate.json")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--broken", help="a MET_TEST_FAULT value whose variant must fail the gate")
    ap.add_argument("--shapes", help="comma-separated shape names (default: every shape but the FP8 ones)")
    ap.add_argument("--seeds", type=int, default=len(SEEDS), help="the first N draws only (to check the script)")
    ap.add_argument("--attention-backend", help="met's --attention-backend (default: met's own default)")
    ap.add_argument("--kv-cache-dtype", choices=["auto", "fp8"],
                    help="met's --kv-cache-dtype; fp8 also rounds the references' keys and values to e4m3")
    args = ap.parse_args()
    if not 1 <= args.seeds <= len(SEEDS):
        raise SystemExit(f"--seeds takes 1 to {len(SEEDS)}")
    args.met = os.path.abspath(args.met)
    os.makedirs(args.work, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    every = [(name, raw, long, None) for name, raw, long in SHAPES] + FP8_SHAPES
    wanted = args.shapes.split(",") if args.shapes else [name for name, _, _ in SHAPES]
    unknown = set(wanted) - {name for name, *_ in every}
    if unknown:
        raise SystemExit(f"unknown shapes {sorted(unknown)}; the shapes are {[name for name, *_ in every]}")
    results, broken = {}, {}
    for name, raw, long, layout in every:
        if name in wanted:
            gate_shape(name, raw, long, layout, args, results, broken)
    met_s, broken_s = summarize(results), summarize(broken)
    passed = all(s["pass"] for cases in met_s.values() for s in cases.values())
    broken_failed = any(not s["pass"] for cases in broken_s.values() for s in cases.values())
    report = {"settings": {"seeds": SEEDS[: args.seeds], "lens": LENS, "long": LONG, "new_tokens": NEW_TOKENS,
                           "top": TOP, "chunk": CHUNK, "block": BLOCK, "ratio": RATIO, "score_std": SCORE_STD,
                           "qk_norm_gain": QK_NORM_GAIN, "device": args.device, "broken": args.broken,
                           "kv_cache_dtype": args.kv_cache_dtype or "auto",
                           "fp8": {name: fp8.LAYOUTS[layout] for name, _, _, layout in FP8_SHAPES if name in wanted}},
              "sharpness": results.get("sharpness", {}), "noise_floor": results.get("noise_floor", {}),
              "met_fp8_log": results.get("met_fp8_log", {}), "met_kv_log": results.get("met_kv_log", {}),
              "kv_scales": results.get("kv_scales", {}),
              "met": met_s, "broken": broken_s,
              "pass": passed, "broken_failed": broken_failed if args.broken else None}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print("\nattention sharpness (float32, 512 tokens, rows past 256): mean largest weight, mean effective keys")
    for name, s in report["sharpness"].items():
        print(f"  {name:<18} {s['mean_max_weight']:.3f}  {s['mean_effective_keys']:.1f}")
    print()
    print(table(f"met vs transformers-float32, noise floor = transformers-bf16 vs float32 "
                f"(bound: ratios <= {RATIO}; departures within 2x the largest noise)", met_s))
    if report["noise_floor"]:
        print()
        print(fp8_floors(report))
    if args.broken:
        print()
        print(table(f"broken variant MET_TEST_FAULT={args.broken} (must FAIL)", broken_s))
    print()
    print(f"gate: {'PASS' if passed else 'FAIL'}" + (
        f"; broken variant {'FAILED the gate, as it must' if broken_failed else 'PASSED the gate: the gate is blind'}"
        if args.broken else ""))
    ok = passed and (broken_failed if args.broken else True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
