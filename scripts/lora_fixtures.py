#!/usr/bin/env python3
"""Generate random PEFT LoRA adapters for the tiny llama fixture, plus float32
reference logits computed by transformers + peft.

What it makes
-------------
Under ``crates/model-layers/tests/fixtures/lora/``:

    r8/         adapter_config.json + adapter_model.safetensors: rank 8,
                lora_alpha 16 (scale 2), all seven projections (q, k, v, o,
                gate, up, down) of both layers
    r16_rslora/ rank 16, lora_alpha 8, use_rslora (scale 8 / sqrt(16) = 2),
                q, v, o, gate and down only, so k and up keep the base weights
    reference.safetensors   float32 ``{adapter}.logits.{i}``: logits at every
                            position of the base fixture's prompts 1 and 2
                            (6 and 23 tokens) through each adapter
    reference.json          the adapters' 16-token greedy continuations of all
                            four base prompts, the smallest top-1/top-2 margin,
                            seed and library versions

The base model is ``../hf/llama`` (its prompts and base logits are in its own
reference files). Both A and B are drawn at random (PEFT initialises B to zero,
which would make an adapter a no-op that no test could catch), with a scale
large enough that every adapter moves the logits by far more than the tests'
tolerance. Adapter weights are saved in float32, as ``save_pretrained`` keeps
them, and the references run in float32 with eager attention, batch size 1.

Why
---
``met`` must apply each row's adapter (and only that adapter) inside a mixed
batch; the Rust tests compare its logits and greedy tokens with these.

How to regenerate (from the repository root)
--------------------------------------------
    pip install torch transformers peft safetensors   # in any virtualenv
    /path/to/venv/bin/python scripts/lora_fixtures.py

Seeds are searched deterministically until every greedy argmax has a margin of
at least 1e-3. This is a developer tool only; nothing in the build depends on it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates/model-layers/tests/fixtures"
BASE = FIXTURES / "hf/llama"
OUT = FIXTURES / "lora"
GREEDY_STEPS = 16
LOGIT_PROMPTS = [1, 2]
MIN_MARGIN = 1e-3
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = {
    "r8": dict(r=8, lora_alpha=16, use_rslora=False, target_modules=ALL),
    "r16_rslora": dict(r=16, lora_alpha=8, use_rslora=True,
                       target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]),
}
# Standard deviation of the random A and B entries: each adapter's delta is then
# of the order of the base projections' outputs.
STD = 0.06


def load_base():
    m = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32, attn_implementation="eager")
    return m.eval()


def make_adapter(name: str, spec: dict, gen: torch.Generator) -> Path:
    """Saves a random adapter of `spec` under OUT/name and returns its directory."""
    model = get_peft_model(load_base(), LoraConfig(lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", **spec))
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "lora_" in pname:
                p.copy_(torch.randn(p.shape, generator=gen) * STD)
    out = OUT / name
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    # The absolute path of this checkout means nothing elsewhere.
    config = json.loads((out / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "../hf/llama"
    # PEFT keeps the modules as a set; a sorted list makes the file repeat.
    config["target_modules"] = sorted(config["target_modules"])
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


@torch.no_grad()
def last_logits(model, ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


def margin(x: torch.Tensor) -> float:
    v = torch.topk(x, 2, dim=-1).values
    return float((v[..., 0] - v[..., 1]).min())


@torch.no_grad()
def references(path: Path, prompts: list[list[int]]):
    """Logits of LOGIT_PROMPTS and greedy continuations of every prompt through the
    adapter saved at `path`, loaded back the way a user would load it."""
    model = PeftModel.from_pretrained(load_base(), path).eval()
    return adapted_references(model, load_base(), prompts)


@torch.no_grad()
def adapted_references(model, base, prompts: list[list[int]]):
    """Through PEFT `model`: the logits of LOGIT_PROMPTS, GREEDY_STEPS greedy tokens of
    every prompt, the smallest top-1/top-2 margin seen, and the least the adapter moved
    a logit from `base`'s."""
    logits = {i: last_logits(model, prompts[i]).contiguous() for i in LOGIT_PROMPTS}
    margins = [margin(l) for l in logits.values()]
    greedy = []
    for ids in prompts:
        seq, gen = list(ids), []
        for _ in range(GREEDY_STEPS):
            last = last_logits(model, seq)[-1]
            margins.append(margin(last))
            gen.append(int(torch.argmax(last)))
            seq.append(gen[-1])
        greedy.append(gen)
    moved = min(float((logits[i] - last_logits(base, prompts[i])).abs().max()) for i in LOGIT_PROMPTS)
    return logits, greedy, min(margins), moved


def main() -> None:
    prompts = json.loads((BASE / "reference.json").read_text())["prompts"]
    for seed in range(2000, 2100):
        gen = torch.Generator().manual_seed(seed)
        tensors, record, ok = {}, {}, True
        for name, spec in ADAPTERS.items():
            logits, greedy, m, moved = references(make_adapter(name, spec, gen), prompts)
            print(f"seed {seed} {name}: min margin {m:.2e}, logits moved by at least {moved:.3f}")
            ok &= m >= MIN_MARGIN and moved > 0.1
            tensors.update({f"{name}.logits.{i}": l for i, l in logits.items()})
            record[name] = {"greedy": greedy, "min_margin": m, "config": spec}
        if ok:
            break
    else:
        raise SystemExit("no seed gave margins of at least 1e-3")
    save_file(tensors, OUT / "reference.safetensors")
    meta = {"base": "hf/llama", "seed": seed, "logit_prompts": LOGIT_PROMPTS, "adapters": record,
            "transformers": transformers.__version__, "peft": peft.__version__, "torch": torch.__version__}
    (OUT / "reference.json").write_text(json.dumps(meta, indent=1) + "\n")
    for name in ADAPTERS:
        (OUT / name / "README.md").unlink(missing_ok=True)
    print(f"wrote {OUT} with seed {seed}")


if __name__ == "__main__":
    main()
