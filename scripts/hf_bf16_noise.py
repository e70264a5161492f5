"""How far transformers itself moves from its float32 reference in bfloat16, per HF fixture.

For each fixture of `crates/model-layers/tests/fixtures/hf/`, runs the checkpoint in
transformers at bfloat16 (eager attention, on the CPU) over the fixture's prompts and
prints the worst max |bf16 logit - f32 reference logit| of a position, relative to the
largest |logit| of that reference row: the measure `crates/scheduler/tests/gpu_hf_fixtures.rs`
bounds met's CUDA logits by. It is the noise floor that bound is stated against.

Usage: python3 scripts/hf_bf16_noise.py [FIXTURE ...]   (needs torch, transformers, safetensors)
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent / "crates/model-layers/tests/fixtures/hf"


def deviation(fixture: Path) -> float:
    reference = json.loads((fixture / "reference.json").read_text())
    logits = load_file(fixture / "reference.safetensors")
    model = AutoModelForCausalLM.from_pretrained(fixture, dtype=torch.bfloat16, attn_implementation="eager").eval()
    worst = 0.0
    for i, prompt in enumerate(reference["prompts"]):
        with torch.no_grad():
            got = model(torch.tensor([prompt])).logits[0].float()
        want = logits[f"logits.{i}"].float().reshape(got.shape)
        rel = (got - want).abs().max(-1).values / want.abs().max(-1).values
        worst = max(worst, rel.max().item())
    return worst


def main() -> None:
    names = sys.argv[1:] or sorted(p.name for p in ROOT.iterdir() if (p / "reference.json").exists())
    for name in names:
        print(f"{name:12} transformers bf16 vs f32: {100 * deviation(ROOT / name):.2f}% of the row's max |logit|")


if __name__ == "__main__":
    main()
