#!/usr/bin/env python3
"""Float32 transformers references for the FP8 KV cache (`--kv-cache-dtype fp8`).

For each fixture below (`crates/model-layers/tests/fixtures/hf/<name>/`, made by
`hf_fixtures.py`), the fixture's prompts through float32 transformers (eager attention,
no cache, as the fixtures' own references) with every attention layer's keys and values
replaced by what an e4m3 cache holds: `e4m3(clamp(x / s, ±448)) · s`, after rotary and any
q/k norm, for the current tokens too (met writes a step's keys before it attends). Two
sets of scales:

    unit        1.0 for every layer (a checkpoint without KV scales)
    calibrated  per layer, the largest |key| and |value| of these prompts over 448

Writes `fp8_kv.safetensors` (float32 `unit.logits.{i}` and `calibrated.logits.{i}`, one
per prompt, [prompt_len, vocab]) and `fp8_kv.json` (the calibrated scales of each
attention layer in layer order, as float32 values, the noise floor below, and library
versions) beside each fixture.

The noise floor (`unit_bf16_noise`): the same model in bf16 over the same unit-scale e4m3
keys and values, its largest |logit - float32 logit| relative to the row's largest float32
|logit|. An e4m3 cache amplifies bf16's roundings: a key one bf16 step from an e4m3
rounding midpoint moves by a whole e4m3 step (2^-3 of its binade) when it crosses it, so
an engine computing in bf16 over an e4m3 cache sits that far from the float32 reference,
not bf16's usual distance; the GPU fixtures hold met to 1.5 times it. Run once, where torch and transformers are installed (not in CI):

    python3 scripts/fp8_kv_reference.py
"""

import importlib
import json
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent / "crates/model-layers/tests/fixtures/hf"
FIXTURES = {"llama": "llama", "qwen3": "qwen3", "gemma2": "gemma2", "qwen3_next": "qwen3_next"}
E4M3_MAX = 448.0

# The scales in use: layer index -> (k, v), or None to record the largest |k|, |v| instead.
STATE = {"scales": None, "amax": {}}


def fake_quant(x: torch.Tensor, s: float) -> torch.Tensor:
    s = torch.tensor(s, dtype=torch.float32)
    return ((x / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32) * s).to(x.dtype)


def wrap(original):
    def attention(module, query, key, value, *args, **kwargs):
        layer = module.layer_idx
        if STATE["scales"] is None:
            k, v = STATE["amax"].get(layer, (0.0, 0.0))
            STATE["amax"][layer] = (max(k, float(key.abs().max())), max(v, float(value.abs().max())))
        else:
            ks, vs = STATE["scales"][layer]
            key, value = fake_quant(key, ks), fake_quant(value, vs)
        return original(module, query, key, value, *args, **kwargs)

    return attention


def patch(model_type: str):
    mod = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    mod.eager_attention_forward = wrap(mod.eager_attention_forward)


@torch.no_grad()
def logits(model, prompts):
    return [model(input_ids=torch.tensor([p]), use_cache=False).logits[0].float().contiguous() for p in prompts]


def main():
    for name, model_type in FIXTURES.items():
        patch(model_type)
    for name in FIXTURES:
        d = ROOT / name
        prompts = json.loads((d / "reference.json").read_text())["prompts"]
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        STATE["scales"], STATE["amax"] = None, {}
        logits(model, prompts)
        layers = sorted(STATE["amax"])
        calibrated = {
            l: tuple(float(np.float32(a / E4M3_MAX)) for a in STATE["amax"][l]) for l in layers
        }
        out = {}
        unit = {l: (1.0, 1.0) for l in layers}
        for tag, scales in [("unit", unit), ("calibrated", calibrated)]:
            STATE["scales"] = scales
            for i, lg in enumerate(logits(model, prompts)):
                out[f"{tag}.logits.{i}"] = lg
        save_file(out, str(d / "fp8_kv.safetensors"))
        STATE["scales"] = unit
        half = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, attn_implementation="eager").eval()
        noise = 0.0
        for i, lg in enumerate(logits(half, prompts)):
            ref = out[f"unit.logits.{i}"]
            rel = (lg - ref).abs().amax(dim=-1) / ref.abs().amax(dim=-1)
            noise = max(noise, float(rel.max()))
        meta = {
            "attention_layers": layers,
            "calibrated_scales": [list(calibrated[l]) for l in layers],
            "unit_bf16_noise": round(noise, 4),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        }
        (d / "fp8_kv.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(name, "attention layers", layers, "calibrated", meta["calibrated_scales"])


if __name__ == "__main__":
    main()
