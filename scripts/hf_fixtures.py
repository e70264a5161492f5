#!/usr/bin/env python3
"""Generate tiny random Hugging Face checkpoints plus float32 reference outputs.

What it makes
-------------
Eleven fixture directories under ``crates/model-layers/tests/fixtures/hf/<name>/``:

    llama       GQA, llama3 rope scaling (all three bands exercised), untied
                embeddings, sharded safetensors, classic config layout
    mistral     GQA, sliding window 8, explicit head_dim != hidden/heads
    qwen2       q/k/v biases, tied embeddings, linear rope scaling, classic
                config layout
    qwen3       q/k norm, explicit head_dim, sliding window on layers >= 1
    qwen3_moe   8 experts top-2 with normalised top-k probabilities, a dense
                MLP layer in the middle, per-expert (hub style) weight names
    llama_tied  MHA, tied embeddings, attention and MLP biases, no rope scaling
    gemma2      (1+w) sandwich norms, GELU-tanh, embeddings x sqrt(hidden),
                attention and final logit soft-capping, query_pre_attn_scalar,
                even layers sliding with a window of 8 (shorter than the
                prompts), tied embeddings
    gemma3      Gemma 2's layer without soft-capping plus (1+w) q/k norm,
                sliding_window_pattern 2 (classic hub layout), local rope base
                10k and global 1M with linear x4 scaling on global layers only
    qwen3_next  hybrid: Gated DeltaNet (fused in_proj_qkvz / in_proj_ba, 2 key
                and 4 value heads) on layers 0, 2, gated full attention with
                partial rope (8 of 32) on 1, 3, MoE 8 experts top-2 plus
                sigmoid-gated shared expert, per-expert names, hub layout
    qwen3_5     Qwen3_5ForConditionalGeneration (tiny vision tower): split
                in_proj_qkv / z / b / a, dense MLP, mrope fields
    qwen3_5_moe the same wrapper with MoE, fused experts.gate_up_proj /
                down_proj as hub checkpoints hold them, rotary 8 of 16

Each directory holds the checkpoint as written by ``save_pretrained`` in
bfloat16 (``config.json``, ``generation_config.json``, ``model.safetensors``
or shards + ``model.safetensors.index.json``), plus

    reference.safetensors   float32 ``logits.{i}``, one per prompt, [prompt_len, vocab]
    reference.json          prompts, 16-token greedy continuations, minimum
                            top-1/top-2 logit margin, seed, coverage tags and
                            library versions

The hybrid families (``hf_fixtures_hybrid.py``: weight draws, which norms are
(1 + w), expert layout) also get ``tensors.txt`` (name, shape, dtype of every
checkpoint tensor), prompts of 1, 6, 23, 64, 65 and 160 tokens (across the
64-token chunks of transformers' torch delta rule, the path the reference must
come from), and in reference.json the check that the longest prompt run as two
halves through a cache gives the one-pass logits (``chunk_consistency``).

Why
---
The Rust tests load these checkpoints with ``met`` and assert that it computes
the same logits and greedy tokens as ``transformers``. All references are
computed from the saved bf16 weights upcast to float32 (eager attention, CPU,
batch size 1, no padding), so ``met`` running in f32 over the same bf16 weights
should agree to ~1e-5. Seeds are searched deterministically until every argmax
has a top-1/top-2 margin of at least 1e-3, so argmax comparisons are stable.

How to regenerate (from the repository root)
--------------------------------------------
    pip install torch transformers safetensors numpy      # in any virtualenv
    /path/to/venv/bin/python scripts/hf_fixtures.py              # every fixture
    /path/to/venv/bin/python scripts/hf_fixtures.py gemma2 ...   # only these

This is a developer tool only; nothing in the build or CI depends on torch.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import safetensors
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

import hf_fixtures_hybrid as hybrid
from hf_fixture_specs import FIXTURES, VOCAB

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "crates" / "model-layers" / "tests" / "fixtures" / "hf"

PROMPT_LENS = (1, 6, 23, 60)
GREEDY_STEPS = 16
MIN_MARGIN = 1e-3
MAX_SEED_TRIES = 64
# Scale of the output projection relative to 1/sqrt(hidden): logits get a
# standard deviation of a few units instead of the near-flat default init.
LM_HEAD_GAIN = 4.0
ROUTER_GAIN = 2.0
BIAS_STD = 0.3
NORM_STD = 0.1
QK_NORM_STD = 0.2
MAX_HYBRID_BYTES = 1536 * 1024


def fail(msg: str) -> None:
    print(f"FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


# Gemma norms multiply by (1 + w): their weights are drawn around 0, except the
# post-branch norms, drawn around GEMMA_POST_NORM_MEAN so that the branches are not
# drowned by the token's own embedding in the residual stream (the LM head is that
# embedding), the final norm, around GEMMA_FINAL_NORM_MEAN, which gives the tied
# head logits of a few units that the final soft-cap bends, and the q/k norms,
# around GEMMA_QK_NORM_MEAN, which makes attention sharp (score std ~4).
GEMMA_POST_NORM_MEAN = 3.0
GEMMA_FINAL_NORM_MEAN = 7.0
GEMMA_QK_NORM_MEAN = 1.0
# Gemma 2 has no q/k norm: its q and k projections are scaled up for sharp scores
# that the attention soft-cap bends.
GEMMA_QK_GAIN = 2.5


# --------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------


def randomize(model: torch.nn.Module, gen: torch.Generator, residual_gain: float = 1.0,
              gemma: bool = False, hybrid_rules: bool = False) -> None:
    """Re-draw every parameter from `gen` with scales that give O(1) activations.

    `residual_gain` multiplies the projections that write into the residual
    stream (o_proj, down_proj: weights and biases). Tied-embedding models need
    it: with unit-scale branches the token's own embedding dominates the final
    hidden state and, since the LM head is that same embedding matrix, every
    position simply predicts its input token. `hybrid_rules` draws the hybrid
    families' own parameters and norms as `hf_fixtures_hybrid.init_value` says."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            shape = tuple(p.shape)

            def normal(std: float, mean: float = 0.0) -> torch.Tensor:
                return torch.randn(shape, generator=gen) * std + mean

            val = hybrid.init_value(name, shape, gen) if hybrid_rules else None
            if val is not None:
                pass
            elif gemma and name == "model.embed_tokens.weight":
                # sqrt(hidden) brings the rows to unit scale in the residual stream.
                val = normal(1.0 / math.sqrt(shape[1]))
            elif gemma and name == "model.norm.weight":
                val = normal(NORM_STD, GEMMA_FINAL_NORM_MEAN)
            elif gemma and name.endswith("norm.weight"):
                if ".post_" in name:
                    val = normal(NORM_STD, GEMMA_POST_NORM_MEAN)
                elif name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
                    val = normal(QK_NORM_STD, GEMMA_QK_NORM_MEAN)
                else:
                    val = normal(NORM_STD)
            elif gemma and (".q_proj." in name or ".k_proj." in name):
                val = normal(GEMMA_QK_GAIN / math.sqrt(shape[1]))
            elif name.endswith("embed_tokens.weight"):
                val = normal(1.0)
            elif name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
                val = normal(QK_NORM_STD, 1.0)
            elif name.endswith("norm.weight"):
                val = normal(NORM_STD, 1.0)
            elif name.endswith(".bias"):
                val = normal(BIAS_STD)
            elif name == "lm_head.weight":
                val = normal(LM_HEAD_GAIN / math.sqrt(shape[1]))
            elif name.endswith("mlp.gate.weight"):  # MoE router [E, H]
                val = normal(ROUTER_GAIN / math.sqrt(shape[1]))
            elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                val = normal(1.0 / math.sqrt(shape[2]))  # [E, out, in]
            elif name.endswith(".weight") and p.dim() == 2:
                val = normal(1.0 / math.sqrt(shape[1]))  # nn.Linear [out, in]
            else:
                fail(f"no init rule for parameter {name} {shape}")
            if residual_gain != 1.0 and (".o_proj." in name or ".down_proj." in name):
                val = val * residual_gain
            p.copy_(val)
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


# --------------------------------------------------------------------------
# Config layout handling
# --------------------------------------------------------------------------


def rewrite_config_classic(path: Path) -> None:
    """Turn a transformers-5 config.json into the layout hub checkpoints use:
    top-level rope_theta, `rope_scaling` (with rope_type) or null, torch_dtype."""
    cfg = json.loads(path.read_text())
    rope = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rope.pop("rope_theta")
    rope_type = rope.get("rope_type", "default")
    cfg["rope_scaling"] = None if rope_type == "default" else rope
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    path.write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")


def rewrite_config_classic_gemma3(path: Path) -> None:
    """Gemma 3 as hub checkpoints write it: top-level `rope_theta` (global layers),
    `rope_local_base_freq` (sliding layers), `rope_scaling` (global layers only) and
    `sliding_window_pattern` in place of `layer_types`."""
    cfg = json.loads(path.read_text())
    rope = cfg.pop("rope_parameters")
    full, local = dict(rope["full_attention"]), dict(rope["sliding_attention"])
    cfg["rope_theta"] = full.pop("rope_theta")
    cfg["rope_local_base_freq"] = local.pop("rope_theta")
    if local.get("rope_type", "default") != "default":
        fail("gemma3: the classic layout cannot say a scaling of the local rope")
    cfg["rope_scaling"] = None if full.get("rope_type", "default") == "default" else full
    types = cfg.pop("layer_types")
    pattern = 2
    if types != ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(len(types))]:
        fail(f"gemma3: layer_types {types} are not sliding_window_pattern {pattern}")
    cfg["sliding_window_pattern"] = pattern
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    path.write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")


def rotary_tables(rot) -> list:
    """The inverse-frequency buffers of a rotary module (one per layer type for Gemma 3)."""
    return [(n, b) for n, b in sorted(rot.named_buffers()) if n.endswith("inv_freq")]


def check_config_roundtrip(orig, saved_dir: Path, model_orig) -> None:
    """Reload config.json with AutoConfig and require identical rope settings."""
    re = AutoConfig.from_pretrained(saved_dir)
    text_orig, text_re = orig.get_text_config(), re.get_text_config()
    if text_re.rope_parameters != text_orig.rope_parameters:
        fail(f"{saved_dir.name}: rope_parameters differ after reload: "
             f"{text_re.rope_parameters} vs {text_orig.rope_parameters}")
    skip = {"transformers_version", "dtype", "torch_dtype", "architectures", "_name_or_path"}
    a = {k: v for k, v in orig.to_dict().items() if k not in skip}
    b = {k: v for k, v in re.to_dict().items() if k not in skip}
    diff = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    if diff:
        fail(f"{saved_dir.name}: config fields differ after reload: "
             + ", ".join(f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(diff)))
    # Rotary tables built from the reloaded config must match bit for bit.
    rot_orig = hybrid.text_model(model_orig).rotary_emb
    rot_re = type(rot_orig)(config=text_re)
    a, b = rotary_tables(rot_orig), rotary_tables(rot_re)
    if [n for n, _ in a] != [n for n, _ in b] or not all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b)):
        fail(f"{saved_dir.name}: rotary inv_freq differ after reload")
    scalings = [k for k in vars(rot_orig) if k.endswith("attention_scaling")]
    if any(getattr(rot_orig, k) != getattr(rot_re, k) for k in scalings):
        fail(f"{saved_dir.name}: rotary attention_scaling differ after reload")


def check_llama3_bands(config, model) -> dict:
    """Recompute llama3 inv_freq independently and report which band each index is in."""
    rp = config.rope_parameters
    dim = config.head_dim
    base = rp["rope_theta"]
    factor, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    old = rp["original_max_position_embeddings"]
    high_wl, low_wl = old / hi, old / lo
    bands = {"kept": [], "interpolated": [], "scaled": []}
    expect = []
    for i in range(dim // 2):
        f = 1.0 / base ** (2 * i / dim)
        wl = 2 * math.pi / f
        if wl < high_wl:
            bands["kept"].append(i)
            expect.append(f)
        elif wl > low_wl:
            bands["scaled"].append(i)
            expect.append(f / factor)
        else:
            bands["interpolated"].append(i)
            s = (old / wl - lo) / (hi - lo)
            expect.append((1 - s) * f / factor + s * f)
    print(f"  llama3 bands (high_freq_wavelen={high_wl}, low_freq_wavelen={low_wl}): "
          f"kept (wavelen<{high_wl}) {bands['kept']}, interpolated {bands['interpolated']}, "
          f"scaled (wavelen>{low_wl}) {bands['scaled']}")
    for band, idx in bands.items():
        if not idx:
            fail(f"llama3 band '{band}' has no frequency")
    got = model.model.rotary_emb.inv_freq.double()
    if not torch.allclose(got, torch.tensor(expect, dtype=torch.float64), rtol=1e-6, atol=0):
        fail(f"llama3 inv_freq mismatch: {got.tolist()} vs {expect}")
    return bands


# --------------------------------------------------------------------------
# MoE checkpoint naming
# --------------------------------------------------------------------------


def check_moe_hub_names(model, saved_dir: Path) -> None:
    """The saved file must use per-expert hub names, with gate = first I rows
    of the fused gate_up_proj (the modeling code does `.chunk(2, dim=-1)` and
    treats the first chunk as gate)."""
    cfg = model.config
    E, I = cfg.num_experts, cfg.moe_intermediate_size
    with safe_open(saved_dir / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        if any("gate_up_proj" in k or k.endswith("experts.down_proj") for k in keys):
            rewrite_moe_per_expert(saved_dir, E, I)
    with safe_open(saved_dir / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        for li, layer in enumerate(model.model.layers):
            pre = f"model.layers.{li}.mlp"
            if li in cfg.mlp_only_layers:
                for n in ("gate_proj", "up_proj", "down_proj"):
                    if f"{pre}.{n}.weight" not in keys:
                        fail(f"qwen3_moe: missing dense {pre}.{n}.weight")
                continue
            fused_gu = layer.mlp.experts.gate_up_proj.detach()
            fused_dn = layer.mlp.experts.down_proj.detach()
            if not torch.equal(f.get_tensor(f"{pre}.gate.weight"), layer.mlp.gate.weight.detach()):
                fail(f"qwen3_moe: router {pre}.gate.weight mismatch")
            for e in range(E):
                g = f.get_tensor(f"{pre}.experts.{e}.gate_proj.weight")
                u = f.get_tensor(f"{pre}.experts.{e}.up_proj.weight")
                d = f.get_tensor(f"{pre}.experts.{e}.down_proj.weight")
                if g.shape != (I, cfg.hidden_size) or u.shape != (I, cfg.hidden_size) \
                        or d.shape != (cfg.hidden_size, I):
                    fail(f"qwen3_moe: bad expert shapes in layer {li} expert {e}")
                if not (torch.equal(g, fused_gu[e, :I]) and torch.equal(u, fused_gu[e, I:])
                        and torch.equal(d, fused_dn[e])):
                    fail(f"qwen3_moe: expert {e} of layer {li} does not match fused weights")
        if any("gate_up_proj" in k for k in keys):
            fail("qwen3_moe: fused names remain in the checkpoint")


def rewrite_moe_per_expert(saved_dir: Path, E: int, I: int) -> None:
    path = saved_dir / "model.safetensors"
    out = {}
    with safe_open(path, "pt") as f:
        meta = f.metadata()
        for k in f.keys():
            t = f.get_tensor(k)
            if k.endswith("mlp.experts.gate_up_proj"):
                pre = k[: -len("gate_up_proj")]
                for e in range(E):
                    out[f"{pre}{e}.gate_proj.weight"] = t[e, :I].contiguous()
                    out[f"{pre}{e}.up_proj.weight"] = t[e, I:].contiguous()
            elif k.endswith("mlp.experts.down_proj"):
                pre = k[: -len("down_proj")]
                for e in range(E):
                    out[f"{pre}{e}.down_proj.weight"] = t[e].contiguous()
            else:
                out[k] = t
    save_file(out, str(path), metadata=meta)
    print("  rewrote fused expert tensors to per-expert names")


# --------------------------------------------------------------------------
# References
# --------------------------------------------------------------------------


def top2_gap(x: torch.Tensor) -> torch.Tensor:
    v = torch.topk(x, 2, dim=-1).values
    return v[..., 0] - v[..., 1]


class RouterWatch:
    """Records the smallest gap between the k-th and (k+1)-th router logit, so
    that expert selection is not a near tie."""

    def __init__(self, model):
        self.min_gap = math.inf
        self.handles = []
        for layer in hybrid.text_model(model).layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(gate, "top_k"):
                self.handles.append(gate.register_forward_hook(self.hook))

    def hook(self, module, inputs, output):
        logits = output[0].float()
        k = module.top_k
        v = torch.topk(logits, k + 1, dim=-1).values
        self.min_gap = min(self.min_gap, float((v[:, k - 1] - v[:, k]).min()))

    def close(self):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def forward_logits(model, ids: list[int]) -> torch.Tensor:
    out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].float()


@torch.no_grad()
def compute_references(model, prompts):
    logits, greedy, margins = [], [], []
    for ids in prompts:
        lg = forward_logits(model, ids)
        assert lg.shape == (len(ids), VOCAB) and lg.dtype == torch.float32
        logits.append(lg.contiguous())
        margins.append(float(top2_gap(lg).min()))
        seq = list(ids)
        gen = []
        for _ in range(GREEDY_STEPS):
            last = forward_logits(model, seq)[-1]
            margins.append(float(top2_gap(last)))
            tok = int(torch.argmax(last))
            gen.append(tok)
            seq.append(tok)
        greedy.append(gen)
    return logits, greedy, min(margins)


def load_f32(path: Path, model_class=AutoModelForCausalLM):
    m = model_class.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    for n, p in m.named_parameters():
        if p.dtype != torch.float32:
            fail(f"{path.name}: {n} not float32 after load")
    return m


def build(spec: dict, seed: int, out: Path):
    """Build one fixture with `seed`, leaving the checkpoint in `out`.
    Returns (min_margin, logits, greedy, prompts, extra)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    config = spec["config"]()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model_class = spec.get("model_class", AutoModelForCausalLM)
    if model_class is AutoModelForCausalLM:
        model = model_class.from_config(config, attn_implementation="eager")
    else:
        model = model_class._from_config(config, attn_implementation="eager")
    randomize(model, gen, spec.get("residual_gain", 1.0), spec.get("gemma", False),
              spec.get("hybrid", False))
    model = model.to(torch.bfloat16)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist()
               for n in spec.get("prompt_lens", PROMPT_LENS)]

    save_kwargs = {}
    if "shard" in spec:
        save_kwargs["max_shard_size"] = spec["shard"]
    model.save_pretrained(out, **save_kwargs)

    # The in-memory model, upcast, is what the saved bf16 checkpoint must reproduce.
    # `.to(bfloat16)` also rounded the non-persistent rotary buffers; rebuild
    # them in float32 as a fresh load does.
    model = model.float().eval()
    text = hybrid.text_model(model)
    text.rotary_emb = type(text.rotary_emb)(config=text.config)

    if "rewrite_config" in spec:
        spec["rewrite_config"](out / "config.json")
    elif spec["classic"] and spec["name"] == "gemma3":
        rewrite_config_classic_gemma3(out / "config.json")
    elif spec["classic"]:
        rewrite_config_classic(out / "config.json")
    check_config_roundtrip(config, out, model)

    extra = {}
    if spec["name"] == "llama":
        extra["bands"] = check_llama3_bands(config, model)
    if "shard" in spec:
        shards = sorted(out.glob("model-*-of-*.safetensors"))
        if len(shards) < 2 or not (out / "model.safetensors.index.json").exists():
            fail(f"{spec['name']}: expected >=2 shards and an index, got {[s.name for s in shards]}")
        extra["shards"] = len(shards)
    if spec["name"] == "qwen3_moe":
        check_moe_hub_names(model, out)
    if "experts" in spec:
        if spec["experts"] == "fused":
            hybrid.fuse_experts(out, config.get_text_config().num_experts)
        hybrid.check_experts(spec["name"], model, out, fused=spec["experts"] == "fused")

    ref_model = load_f32(out, model_class)

    # Loading the saved checkpoint must give exactly the in-memory weights.
    sd_mem, sd_ref = model.state_dict(), ref_model.state_dict()
    if sd_mem.keys() != sd_ref.keys():
        fail(f"{spec['name']}: state dict keys differ after reload")
    for k in sd_mem:
        if not torch.equal(sd_mem[k], sd_ref[k]):
            fail(f"{spec['name']}: tensor {k} differs after reload")

    watch = RouterWatch(ref_model)
    logits, greedy, margin = compute_references(ref_model, prompts)
    watch.close()
    if watch.handles:
        extra["min_router_margin"] = watch.min_gap
        # The per-expert checkpoint must reproduce the fused in-memory model's logits.
        for ids, lg in zip(prompts, logits):
            if not torch.equal(forward_logits(model, ids), lg):
                fail(f"{spec['name']}: reloaded checkpoint does not reproduce logits")
    if spec.get("hybrid"):
        extra["reference_path"] = hybrid.check_torch_path(spec["name"])
        longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
        extra["chunk_consistency"] = hybrid.chunk_consistency(
            spec["name"], ref_model, longest, prompts[longest], logits[longest])

    return margin, logits, greedy, prompts, extra


def dump_json(obj: dict) -> str:
    """One top-level key per line; lists of token ids stay one line each."""
    def val(v):
        if isinstance(v, list) and v and isinstance(v[0], list):
            return "[\n" + ",\n".join("    " + json.dumps(x) for x in v) + "\n  ]"
        return json.dumps(v)
    return "{\n" + ",\n".join(f"  {json.dumps(k)}: {val(v)}" for k, v in obj.items()) + "\n}\n"


def make_fixture(spec: dict) -> dict:
    name = spec["name"]
    out = OUT_DIR / name
    for seed in range(spec["base_seed"], spec["base_seed"] + MAX_SEED_TRIES):
        print(f"[{name}] seed {seed}")
        margin, logits, greedy, prompts, extra = build(spec, seed, out)
        router = extra.get("min_router_margin", math.inf)
        if margin >= MIN_MARGIN and router >= MIN_MARGIN:
            break
        print(f"  margin {margin:.3g}, router margin {router:.3g} < {MIN_MARGIN}: next seed")
    else:
        fail(f"{name}: no seed in {MAX_SEED_TRIES} tries reached margin {MIN_MARGIN}")

    # Degeneracy guard: a model whose argmax mostly copies the input token
    # tests little beyond the embedding lookup.
    copies = sum(int((lg.argmax(-1) == torch.tensor(ids)).sum()) for lg, ids in zip(logits, prompts))
    positions = sum(len(ids) for ids in prompts)
    if copies > 0.25 * positions:
        fail(f"{name}: {copies} of {positions} positions predict their own input token")

    save_file({f"logits.{i}": lg for i, lg in enumerate(logits)}, str(out / "reference.safetensors"))
    cfg = json.loads((out / "config.json").read_text())
    ref = {
        "name": name,
        "model_type": cfg["model_type"],
        "prompts": prompts,
        "greedy": greedy,
        "min_margin": margin,
        "seed": seed,
        "covers": spec["covers"],
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    for key in ("min_router_margin", "chunk_consistency", "reference_path"):
        if key in extra:
            ref[key] = extra[key]
    (out / "reference.json").write_text(dump_json(ref))
    if spec.get("hybrid"):
        hybrid.write_tensor_list(out)
        size = sum(p.stat().st_size for p in out.iterdir())
        if size > MAX_HYBRID_BYTES:
            fail(f"{name}: {size} bytes, over {MAX_HYBRID_BYTES}")
    spread = float(torch.cat(logits).std())
    print(f"  ok: min margin {margin:.4g}, logit std {spread:.3g}, "
          + ", ".join(f"{k}={v}" for k, v in extra.items() if k != "bands"))
    return ref


def main() -> None:
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"safetensors {safetensors.__version__}, numpy {np.__version__}")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    names = sys.argv[1:]
    unknown = set(names) - {spec["name"] for spec in FIXTURES}
    if unknown:
        fail(f"unknown fixtures {sorted(unknown)}")
    summary = [make_fixture(spec) for spec in FIXTURES if not names or spec["name"] in names]
    print("\nsummary:")
    for r in summary:
        print(f"  {r['name']:<11} seed {r['seed']:<5} min_margin {r['min_margin']:.4g}  "
              f"covers {', '.join(r['covers'])}")
    total = sum(p.stat().st_size for p in OUT_DIR.rglob("*") if p.is_file())
    print(f"fixtures total: {total / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
