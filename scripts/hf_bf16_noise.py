"""How far transformers itself moves from its float32 reference in bfloat16, per HF fixture.

For each fixture of `crates/model-layers/tests/fixtures/hf/`, runs the checkpoint in
transformers at bfloat16 (eager attention, on the CPU or `--device cuda`) over the fixture's prompts and
prints the worst max |bf16 logit - f32 reference logit| of a position, relative to the
largest |logit| of that reference row: the measure `crates/scheduler/tests/gpu_hf_fixtures.rs`
bounds met's CUDA logits by. It is the noise floor that bound is stated against.

Usage: python3 scripts/hf_bf16_noise.py [--device cpu|cuda] [--root DIR] [FIXTURE ...]
(needs torch, transformers, safetensors)
"""

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent / "crates/model-layers/tests/fixtures/hf"


def deviation(fixture: Path, device: str) -> float:
    reference = json.loads((fixture / "reference.json").read_text())
    logits = load_file(fixture / "reference.safetensors")
    model = AutoModelForCausalLM.from_pretrained(fixture, dtype=torch.bfloat16, attn_implementation="eager")
    model = model.to(device).eval()
    worst = 0.0
    for i, prompt in enumerate(reference["prompts"]):
        with torch.no_grad():
            got = model(torch.tensor([prompt], device=device)).logits[0].float().cpu()
        want = logits[f"logits.{i}"].float().reshape(got.shape)
        rel = (got - want).abs().max(-1).values / want.abs().max(-1).values
        worst = max(worst, rel.max().item())
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("fixtures", nargs="*")
    args = ap.parse_args()
    names = args.fixtures or sorted(p.name for p in args.root.iterdir() if (p / "reference.json").exists())
    for name in names:
        worst = deviation(args.root / name, args.device)
        print(f"{name:12} transformers bf16 vs f32 ({args.device}): {100 * worst:.2f}% of the row's max |logit|")


if __name__ == "__main__":
    main()
