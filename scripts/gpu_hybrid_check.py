#!/usr/bin/env python3
"""The hybrid fixtures (Qwen3-Next, Qwen3.5, Qwen3.5-MoE) through `met generate` on a GPU.

For each fixture, every prompt of `reference.json` is generated greedily twice: once all
prompts in one batch, and once again in the same process after the first pass, so the
second pass resumes from the prefix cache's state snapshots (`cached_prompt_tokens` > 0)
and, with `--max-prefill-chunk 5`, runs many short prefill steps. The script prints, per
fixture and pass, how many of the 16 greedy tokens equal transformers' float32 ones (met
computes in bf16 on CUDA, so a late near-tie may flip; the first tokens must agree) and
whether the two passes agree with each other.

Usage: gpu_hybrid_check.py --met PATH --fixtures DIR --out FILE.json [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HYBRIDS = ["qwen3_next", "qwen3_5", "qwen3_5_moe"]


def run(met: str, device: str, fixture: Path, prompts: list[list[int]], extra: list[str]) -> list[dict]:
    """Generates every prompt twice over (two copies in one file) and returns the outputs."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for p in prompts + prompts:
            f.write(json.dumps({"prompt_ids": p, "max_tokens": 16}) + "\n")
        path = f.name
    cmd = [met, "generate", "--device", device, "--model", str(fixture), "--prompts-file", path,
           "--temperature", "0", "--json", "--max-num-seqs", str(len(prompts)),
           "--state-snapshot-interval", "1"] + extra
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{out.stderr[-3000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--met", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    report, ok = {}, True
    for name in HYBRIDS:
        fixture = Path(args.fixtures) / name
        ref = json.loads((fixture / "reference.json").read_text())
        prompts, want = ref["prompts"], ref["greedy"]
        for mode, extra in [("batch", []), ("chunk5", ["--max-prefill-chunk", "5"])]:
            try:
                outs = run(args.met, args.device, fixture, prompts, extra)
            except Exception as e:  # noqa: BLE001 - reported, not raised
                print(f"HYBRID {name} {mode}: FAILED {e}")
                report[f"{name}/{mode}"] = {"error": str(e)}
                ok = False
                continue
            outs.sort(key=lambda o: o["prompt"])
            n = len(prompts)
            firsts, seconds = outs[:n], outs[n:]
            agree = [sum(a == b for a, b in zip(o["generated_ids"], w)) for o, w in zip(firsts, want)]
            lead = [next((i for i, (a, b) in enumerate(zip(o["generated_ids"], w)) if a != b), 16)
                    for o, w in zip(firsts, want)]
            same = all(a["generated_ids"] == b["generated_ids"] for a, b in zip(firsts, seconds))
            hits = [o["cached_prompt_tokens"] for o in seconds]
            report[f"{name}/{mode}"] = {"tokens_equal": agree, "leading_equal": lead,
                                        "second_pass_same": same, "second_pass_cached": hits}
            print(f"HYBRID {name} {mode}: leading tokens equal to transformers {lead} of 16; "
                  f"second pass same={same}, cached_prompt_tokens={hits}")
            ok &= all(x >= 1 for x in lead)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
