"""What ``hf_fixtures.py`` does differently for the hybrid linear-attention families
(``qwen3_next``, ``qwen3_5``, ``qwen3_5_moe``): their weight draws, the vision-language
wrapper's nested modules, the expert layout real checkpoints use, the tensor list written
beside each checkpoint, and the checks that the reference is the torch fallback path and
is consistent across a cache split. Kept apart so that the generator stays readable and the
older fixtures' code path is untouched.

Norms (read from transformers 5.17 ``modeling_qwen3_next.py`` / ``modeling_qwen3_5*.py``):

    (1 + w), weight initialised to 0    input_layernorm, post_attention_layernorm,
                                        model norm, self_attn.q_norm, self_attn.k_norm
    plain w, weight initialised to 1    linear_attn.norm (the gated RMSNorm: normalise,
                                        multiply by w, then by silu(z))

Every weight is drawn around its centre: the zero-centred norms around 0 (q/k norms around 1,
so the effective scale is about 2 and attention is sharp, score std ~4), the gated norm around
1. ``A_log`` and ``dt_bias`` are drawn away from their init constants so that the per-head
decays ``exp(-exp(A_log) * softplus(a + dt_bias))`` spread from ~0.99 (state carried across
several 64-token chunks) to ~0.4 (mostly local). The depthwise conv taps are random.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import math
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

NORM_STD = 0.1
QK_NORM_STD = 0.2
# (1 + w) q/k norms drawn around 1: an effective scale of ~2 makes the scores sharp.
QK_NORM_MEAN = 1.0
BIAS_STD = 0.3
# A = exp(A_log) is drawn log-uniform in [A_MIN, A_MAX]; dt_bias around DT_BIAS_MEAN puts
# softplus(a + dt_bias) near 0.4 for the unit-scale `a` the projection gives.
A_MIN, A_MAX = 0.02, 2.0
DT_BIAS_MEAN, DT_BIAS_STD = -1.0, 0.5
# The recorded reference must be chunk-consistent well inside the 2e-4 the tests allow: moving the
# chunk boundaries reorders float32 sums, which costs ~1e-5 on logits of a few units.
CHUNK_CONSISTENCY_TOL = 1e-4
# ...and dropping the conv or the delta-rule state at the split must move them far past it.
DROPPED_STATE_MIN_DIFF = 0.1

FALLBACK_FUNCS = ("chunk_gated_delta_rule", "causal_conv1d_fn")


def text_model(model):
    """The decoder stack: `model.model` for a causal LM, its `language_model` for a VL wrapper."""
    inner = model.model
    return getattr(inner, "language_model", inner)


def init_value(name: str, shape: tuple, gen: torch.Generator):
    """The draw for a hybrid-only parameter, or None where the generator's common rule holds."""

    def normal(std: float, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * std + mean

    if name.startswith("model.visual."):
        return vision_value(name, shape, normal)
    if name.endswith("linear_attn.A_log"):
        u = torch.rand(shape, generator=gen)
        return (math.log(A_MIN) + u * (math.log(A_MAX) - math.log(A_MIN)))
    if name.endswith("linear_attn.dt_bias"):
        return normal(DT_BIAS_STD, DT_BIAS_MEAN)
    if name.endswith("linear_attn.conv1d.weight"):  # depthwise [C, 1, K]
        return normal(1.0 / math.sqrt(shape[-1]))
    if name.endswith("linear_attn.norm.weight"):  # gated norm, plain w
        return normal(NORM_STD, 1.0)
    if name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):  # (1 + w)
        return normal(QK_NORM_STD, QK_NORM_MEAN)
    if name.endswith("norm.weight"):  # (1 + w)
        return normal(NORM_STD)
    return None


def vision_value(name: str, shape: tuple, normal) -> torch.Tensor:
    """The vision tower is never run by text prompts; its weights only need to be random
    and of sensible scale, so that a loader that reads them reads real values."""
    if len(shape) == 1:
        return normal(BIAS_STD) if name.endswith(".bias") else normal(NORM_STD, 1.0)
    if name.endswith("pos_embed.weight"):
        return normal(1.0)
    return normal(1.0 / math.sqrt(math.prod(shape[1:])))


# --------------------------------------------------------------------------
# Expert layout
# --------------------------------------------------------------------------


def fuse_experts(saved_dir: Path, n_experts: int) -> None:
    """Rewrite per-expert tensors into the fused `experts.gate_up_proj` [E, 2I, H] (gate rows
    first) and `experts.down_proj` [E, H, I] that Qwen3.5-MoE hub checkpoints hold.
    transformers 5.17 writes per-expert names for this class, so the layout is set here."""
    path = saved_dir / "model.safetensors"
    out, parts = {}, {}
    with safe_open(path, "pt") as f:
        meta = f.metadata()
        for k in f.keys():
            head, sep, tail = k.partition(".mlp.experts.")
            if not sep:
                out[k] = f.get_tensor(k)
                continue
            e, proj, _ = tail.split(".")
            parts.setdefault(head, {}).setdefault(proj, {})[int(e)] = f.get_tensor(k)
    for head, proj in parts.items():
        order = range(n_experts)
        gate, up, down = (torch.stack([proj[p][e] for e in order]) for p in ("gate_proj", "up_proj", "down_proj"))
        out[f"{head}.mlp.experts.gate_up_proj"] = torch.cat([gate, up], dim=1).contiguous()
        out[f"{head}.mlp.experts.down_proj"] = down.contiguous()
    save_file(out, str(path), metadata=meta)
    print("  rewrote per-expert tensors to fused gate_up_proj / down_proj")


def check_experts(name: str, model, saved_dir: Path, fused: bool) -> None:
    """The saved experts must be the in-memory fused parameters, in the layout asked for."""
    prefix = "model.language_model.layers" if hasattr(model.model, "language_model") else "model.layers"
    with safe_open(saved_dir / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        for li, layer in enumerate(text_model(model).layers):
            experts = getattr(layer.mlp, "experts", None)
            if experts is None:
                continue
            gu, dn = experts.gate_up_proj.detach(), experts.down_proj.detach()
            pre = f"{prefix}.{li}.mlp.experts"
            if fused:
                saved_gu, saved_dn = f.get_tensor(f"{pre}.gate_up_proj"), f.get_tensor(f"{pre}.down_proj")
            else:
                i = gu.shape[1] // 2
                saved_gu = torch.stack([torch.cat([f.get_tensor(f"{pre}.{e}.gate_proj.weight"),
                                                   f.get_tensor(f"{pre}.{e}.up_proj.weight")])
                                        for e in range(gu.shape[0])])
                saved_dn = torch.stack([f.get_tensor(f"{pre}.{e}.down_proj.weight") for e in range(gu.shape[0])])
                assert saved_gu.shape[1] == 2 * i
            if not (torch.equal(saved_gu, gu.to(saved_gu.dtype)) and torch.equal(saved_dn, dn.to(saved_dn.dtype))):
                raise SystemExit(f"FAILED: {name}: experts of layer {li} differ from the model")
    fused_keys = any(k.endswith("experts.gate_up_proj") for k in keys)
    if fused_keys != fused:
        raise SystemExit(f"FAILED: {name}: expected {'fused' if fused else 'per-expert'} expert names")


def write_tensor_list(saved_dir: Path) -> None:
    """`tensors.txt`: every checkpoint tensor as `name  shape  dtype`, sorted by name."""
    rows = []
    for shard in sorted(saved_dir.glob("model*.safetensors")):
        with safe_open(shard, "pt") as f:
            for k in f.keys():
                sl = f.get_slice(k)
                rows.append((k, "[" + ", ".join(map(str, sl.get_shape())) + "]", sl.get_dtype()))
    width = max(len(r[0]) for r in rows)
    lines = [f"{n:<{width}}  {s:<16}  {d}" for n, s, d in sorted(rows)]
    (saved_dir / "tensors.txt").write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------
# Reference checks
# --------------------------------------------------------------------------


class FallbackWatch(logging.Handler):
    """Records transformers' warnings that a kernel fell back to its PyTorch reference.
    They are `warning_once`, so one watch spans the whole run."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.seen = set()
        logging.getLogger("transformers").addHandler(self)

    def emit(self, record):
        msg = record.getMessage()
        if "falling back to its reference PyTorch implementation" in msg:
            self.seen.add(msg.split("`")[1])


FALLBACK_WATCH = FallbackWatch()


def check_torch_path(name: str) -> str:
    """The reference must come from transformers' torch path: no fla, no causal-conv1d,
    and transformers must have said it fell back for the chunked rule and the conv."""
    for pkg in ("fla", "causal_conv1d"):
        if importlib.util.find_spec(pkg) is not None:
            raise SystemExit(f"FAILED: {name}: {pkg} is installed; the reference must be the torch path")
    missing = [f for f in FALLBACK_FUNCS if f not in FALLBACK_WATCH.seen]
    if missing:
        raise SystemExit(f"FAILED: {name}: no fallback warning for {missing}")
    return "torch reference path (transformers warned that " + ", ".join(sorted(FALLBACK_WATCH.seen)) \
        + " fell back: fla and causal-conv1d not installed)"


@torch.no_grad()
def chunk_consistency(name: str, model, index: int, ids: list[int], full: torch.Tensor) -> dict:
    """Run prompt `index`, `ids`, as two halves through one transformers cache and compare every position's
    logits with the single pass `full`: the recorded reference must not depend on where a
    prompt is cut, since met is tested against it with chunked prefill and prefix hits."""
    cut = len(ids) // 2
    t = torch.tensor([ids], dtype=torch.long)
    first = model(input_ids=t[:, :cut], use_cache=True)
    second = model(input_ids=t[:, cut:], past_key_values=first.past_key_values, use_cache=True)
    split = torch.cat([first.logits[0], second.logits[0]]).float()
    diff = float((split - full).abs().max())
    last = float((split[-1] - full[-1]).abs().max())
    print(f"  cache split {cut}+{len(ids) - cut}: max |diff| {diff:.3g} (last position {last:.3g})")
    if diff > CHUNK_CONSISTENCY_TOL or not torch.equal(split.argmax(-1), full.argmax(-1)):
        raise SystemExit(f"FAILED: {name}: the cache-split pass differs from one pass by {diff:.3g}")
    dropped = {kind: dropped_state_diff(model, first.past_key_values, t[:, cut:], full[cut:], kind)
               for kind in ("conv_states", "recurrent_states")}
    print("  state dropped at the split: " + ", ".join(f"{k} max |diff| {v:.3g}" for k, v in dropped.items()))
    if min(dropped.values()) < DROPPED_STATE_MIN_DIFF:
        raise SystemExit(f"FAILED: {name}: dropping a state at the split barely moves the logits: {dropped}")
    return {"prompt": index, "split": [cut, len(ids) - cut], "max_abs_diff": diff,
            "last_position_max_abs_diff": last,
            "dropped_conv_state_max_abs_diff": dropped["conv_states"],
            "dropped_recurrent_state_max_abs_diff": dropped["recurrent_states"]}


@torch.no_grad()
def dropped_state_diff(model, cache, tail: torch.Tensor, full_tail: torch.Tensor, kind: str) -> float:
    """How far the tail's logits move when every GDN layer's `kind` state is zeroed at the
    split: the fixture can only catch an engine that drops that state if this is large."""
    cache = copy.deepcopy(cache)
    for layer in cache.layers:
        states = getattr(layer, kind, None)
        if states is not None:
            states[0].zero_()
    out = model(input_ids=tail, past_key_values=cache, use_cache=True)
    return float((out.logits[0].float() - full_tail).abs().max())


# --------------------------------------------------------------------------
# Config layout
# --------------------------------------------------------------------------


def rewrite_config_qwen3_next(path: Path) -> None:
    """Qwen3-Next as hub checkpoints write it: top-level `rope_theta` and
    `partial_rotary_factor`, `rope_scaling` null, `full_attention_interval` in place of
    `layer_types`, `torch_dtype`."""
    cfg = json.loads(path.read_text())
    rope = dict(cfg.pop("rope_parameters"))
    if rope.pop("rope_type", "default") != "default":
        raise SystemExit("FAILED: qwen3_next: the hub layout says no rope scaling")
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["partial_rotary_factor"] = rope.pop("partial_rotary_factor")
    cfg["rope_scaling"] = None
    types = cfg.pop("layer_types")
    interval = types.index("full_attention") + 1
    if types != ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(len(types))]:
        raise SystemExit(f"FAILED: qwen3_next: layer_types {types} are not an interval pattern")
    cfg["full_attention_interval"] = interval
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    path.write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")


def rewrite_config_qwen3_5(path: Path) -> None:
    """Drop the top-level `text_config.partial_rotary_factor`: transformers writes its
    backward-compatible default (0.25) there even when `rope_parameters` says otherwise, and
    hub Qwen3.5 configs keep the factor only inside `rope_parameters`."""
    cfg = json.loads(path.read_text())
    cfg["text_config"].pop("partial_rotary_factor", None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
