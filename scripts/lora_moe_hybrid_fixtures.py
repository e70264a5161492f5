#!/usr/bin/env python3
"""Generate random PEFT LoRA adapters for the tiny mixture-of-experts and hybrid
fixtures, plus float32 reference logits computed by transformers + peft.

What it makes
-------------
Under ``crates/model-layers/tests/fixtures/``, for each base, a directory of two
adapters with ``reference.safetensors`` (float32 ``{adapter}.logits.{i}`` at every
position of the base fixture's prompts 1 and 2) and ``reference.json`` (16-token
greedy continuations of all four base prompts through each adapter, the smallest
top-1/top-2 logit margin and router margin (k-th against (k+1)-th router logit),
seed and library versions):

    lora_moe/ (qwen3_moe)
      params/   PEFT's own output for ``target_modules`` = all seven projections on
                transformers 5's fused experts: q/k/v/o of every layer, gate/up/down
                of the dense layer 1, and the experts of layers 0 and 2 as wrapped
                parameters (``mlp.experts[.base_layer].lora_{A,B}``), gate_up at
                twice the rank and alpha through ``rank_pattern`` / ``alpha_pattern``.
                Rank 8, lora_alpha 16.
      modules/  the per-expert layout adapters trained on transformers 4 have
                (``mlp.experts.{e}.{gate,down}_proj.lora_{A,B}``), rank 4,
                lora_alpha 8, use_rslora, on v_proj and the experts' gate and down
                only (up keeps its base weights). Its references come from the same
                weights written as PEFT's wrapped parameters (gate's block of the
                fused B, zeros in up's), loaded back by PEFT.
    lora_qwen3_5/, lora_qwen3_5_moe/, lora_qwen3_next/ (the hybrids: Gated DeltaNet
    layers beside gated attention)
      all/      PEFT's output for all seven projections, rank 8, lora_alpha 16: the
                attention layers' doubled (gated) q_proj and k/v/o, the dense MLP or
                the shared expert, and the routed experts as wrapped parameters
      linear/   rank 4, lora_alpha 8, use_rslora, PEFT's "all-linear": every linear
                layer, the Gated DeltaNet projections (Qwen3-Next's grouped
                in_proj_qkvz and in_proj_ba), the shared expert's gate and Qwen3-Next's
                router included

Both A and B are random and large enough that each adapter moves the logits by far
more than the tests' tolerance. Seeds are searched until every greedy argmax has a
margin of at least 1e-3 and every routing decision one of at least 1e-3.

How to regenerate (from the repository root)
--------------------------------------------
    pip install torch transformers peft safetensors   # in any virtualenv
    /path/to/venv/bin/python scripts/lora_moe_hybrid_fixtures.py [BASE ...]

A developer tool only; nothing in the build depends on it.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from lora_fixtures import LOGIT_PROMPTS, adapted_references

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates/model-layers/tests/fixtures"
MIN_MARGIN = 1e-3
MIN_ROUTER_MARGIN = 1e-3
STD = 0.08
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PREFIX = "base_model.model.model.layers"


def load_base(base: Path):
    m = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="eager")
    return m.eval()


def randomize(model, gen: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * STD)


def portable(out: Path, base: Path) -> None:
    """The saved config without this checkout's absolute path, its lists in a fixed order."""
    config = json.loads((out / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = f"../hf/{base.name}"
    # PEFT keeps both as sets (it nests the wrapped parameters by name, in any order);
    # sorted lists make the file repeat.
    for key in ("target_modules", "target_parameters"):
        if isinstance(config.get(key), list):
            config[key] = sorted(config[key])
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "README.md").unlink(missing_ok=True)


def peft_adapter(**spec):
    """An adapter PEFT makes of `spec` and saves; it is its own reference."""

    def make(base: Path, out: Path, gen: torch.Generator, _scratch: Path) -> Path:
        config = LoraConfig(lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", **spec)
        model = get_peft_model(load_base(base), config)
        randomize(model, gen)
        shutil.rmtree(out, ignore_errors=True)
        model.save_pretrained(out)
        portable(out, base)
        return out

    return make


def make_modules(base: Path, out: Path, gen: torch.Generator, scratch: Path) -> Path:
    """A per-expert adapter (the fixture) and, returned, the same weights as PEFT's
    wrapped parameters (the reference PEFT loads)."""
    r, alpha = 4, 8
    cfg = json.loads((base / "config.json").read_text())
    e, h, i = cfg["num_local_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"]
    sparse = [l for l in range(cfg["num_hidden_layers"]) if l not in cfg["mlp_only_layers"]]
    spec = dict(r=r, lora_alpha=alpha, use_rslora=True, target_modules=["v_proj"],
                target_parameters=["gate_up_proj", "down_proj"])
    model = get_peft_model(load_base(base), LoraConfig(lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", **spec))
    randomize(model, gen)
    tensors = {}
    with torch.no_grad():
        for l in sparse:
            wrap = model.base_model.model.model.layers[l].mlp.experts
            # The outer wrapper holds down_proj, its base_layer gate_up_proj.
            down, gate_up = wrap, wrap.base_layer
            assert down.parameter_name == "down_proj" and gate_up.parameter_name == "gate_up_proj"
            gb = gate_up.lora_B["default"].weight  # [2i, r·e], column j·e + x
            gb[i:, :] = 0.0  # up keeps its base weights
            ga = gate_up.lora_A["default"].weight  # [e·r, h]
            da, db = down.lora_A["default"].weight, down.lora_B["default"].weight
            for x in range(e):
                cols = [j * e + x for j in range(r)]
                name = f"{PREFIX}.{l}.mlp.experts.{x}"
                tensors[f"{name}.gate_proj.lora_A.weight"] = ga[x * r:(x + 1) * r].clone()
                tensors[f"{name}.gate_proj.lora_B.weight"] = gb[:i, cols].clone()
                tensors[f"{name}.down_proj.lora_A.weight"] = da[x * r:(x + 1) * r].clone()
                tensors[f"{name}.down_proj.lora_B.weight"] = db[:, cols].clone()
    reference = scratch / "modules-as-params"
    model.save_pretrained(reference)
    for k, v in model.state_dict().items():
        if "v_proj.lora_" in k:
            tensors[k.replace(".default", "")] = v.clone()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "adapter_model.safetensors")
    config = json.loads((reference / "adapter_config.json").read_text())
    config.update(target_modules=["v_proj", "gate_proj", "down_proj"], target_parameters=None,
                  rank_pattern={}, alpha_pattern={})
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    portable(out, base)
    return reference


EVERY = peft_adapter(r=8, lora_alpha=16, target_modules=ALL)
LINEAR = peft_adapter(r=4, lora_alpha=8, use_rslora=True, target_modules="all-linear")
# Per base: the directory its adapters go to, and how each is made, by name.
FAMILIES = {
    "qwen3_moe": ("lora_moe", {"params": EVERY, "modules": make_modules}),
    "qwen3_5": ("lora_qwen3_5", {"all": EVERY, "linear": LINEAR}),
    "qwen3_5_moe": ("lora_qwen3_5_moe", {"all": EVERY, "linear": LINEAR}),
    "qwen3_next": ("lora_qwen3_next", {"all": EVERY, "linear": LINEAR}),
}


class RouterMargins:
    """The smallest gap between the k-th and (k+1)-th router logit of any token at any
    sparse layer, over the forwards it sees."""

    def __init__(self, model, k: int):
        self.k, self.min = k, float("inf")
        for layer in model.base_model.model.model.layers if isinstance(model, PeftModel) else model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.register_forward_hook(self.hook)

    def hook(self, _module, _inputs, output):
        logits = (output[0] if isinstance(output, tuple) else output).float()
        top = torch.topk(logits, self.k + 1, dim=-1).values
        self.min = min(self.min, float((top[..., self.k - 1] - top[..., self.k]).min()))


@torch.no_grad()
def references(base: Path, path: Path, prompts: list[list[int]], k: int):
    model = PeftModel.from_pretrained(load_base(base), path).eval()
    router = RouterMargins(model, k)
    logits, greedy, least, moved = adapted_references(model, load_base(base), prompts)
    return logits, greedy, least, router.min, moved


def family(name: str) -> None:
    """Makes the adapters of base `name` and their references."""
    base = FIXTURES / "hf" / name
    folder, adapters = FAMILIES[name]
    out = FIXTURES / folder
    prompts = json.loads((base / "reference.json").read_text())["prompts"]
    k = json.loads((base / "config.json").read_text()).get("num_experts_per_tok", 1)
    with tempfile.TemporaryDirectory() as scratch:
        for seed in range(3000, 3100):
            gen = torch.Generator().manual_seed(seed)
            tensors, record, ok = {}, {}, True
            for adapter, make in adapters.items():
                ref = make(base, out / adapter, gen, Path(scratch))
                logits, greedy, m, rm, moved = references(base, ref, prompts, k)
                print(f"{name} seed {seed} {adapter}: min margin {m:.2e}, router margin {rm:.2e}, logits moved {moved:.3f}")
                ok &= m >= MIN_MARGIN and rm >= MIN_ROUTER_MARGIN and moved > 0.1
                tensors.update({f"{adapter}.logits.{i}": l for i, l in logits.items()})
                record[adapter] = {"greedy": greedy, "min_margin": m, "min_router_margin": rm if rm != float("inf") else None}
            if ok:
                break
        else:
            raise SystemExit(f"{name}: no seed gave the margins asked for")
    save_file(tensors, out / "reference.safetensors")
    meta = {"base": f"hf/{name}", "seed": seed, "logit_prompts": LOGIT_PROMPTS, "adapters": record,
            "transformers": transformers.__version__, "peft": peft.__version__, "torch": torch.__version__}
    (out / "reference.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {out} with seed {seed}")


def main() -> None:
    for name in sys.argv[1:] or FAMILIES:
        family(name)


if __name__ == "__main__":
    main()
