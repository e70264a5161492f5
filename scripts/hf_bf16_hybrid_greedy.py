#!/usr/bin/env python3
"""How far transformers' own bfloat16 greedy continuations of the hybrid fixtures drift from
its float32 reference: the noise `scripts/gpu_hybrid_check.py`'s token counts are read
against. For each fixture and prompt, prints the leading tokens of the bf16 continuation
that equal `reference.json`'s float32 ones, and (given that script's JSON) met's.

Usage: hf_bf16_hybrid_greedy.py --fixtures DIR [--met-json FILE] [--device cuda]
(needs torch and transformers with qwen3_next / qwen3_5 / qwen3_5_moe)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import transformers

HYBRIDS = ["qwen3_next", "qwen3_5", "qwen3_5_moe"]


def leading(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--met-json")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    met = json.loads(Path(args.met_json).read_text()) if args.met_json else {}
    for name in HYBRIDS:
        fixture = Path(args.fixtures) / name
        ref = json.loads((fixture / "reference.json").read_text())
        arch = json.loads((fixture / "config.json").read_text())["architectures"][0]
        model = getattr(transformers, arch).from_pretrained(fixture, dtype=torch.bfloat16).to(args.device).eval()
        bf16 = []
        for prompt in ref["prompts"]:
            ids = torch.tensor([prompt], device=args.device)
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                                     min_new_tokens=16)
            bf16.append(out[0, len(prompt):].tolist())
        lead = [leading(g, w) for g, w in zip(bf16, ref["greedy"])]
        print(f"BF16 {name}: transformers-bf16 leading tokens equal to its float32: {lead} of 16")
        if f"{name}/batch" in met:
            print(f"BF16 {name}: met-bf16 (CUDA) leading tokens equal to float32:     {met[f'{name}/batch']['leading_equal']}")
        (fixture.parent / f"{name}.bf16.json").write_text(json.dumps(bf16))


if __name__ == "__main__":
    main()
