#!/usr/bin/env python3
"""Speculative modes against each other with `met generate --timing` on the input-grounded
chat prompts (bench/datasets/input_grounded.jsonl), in rounds that alternate the order of
the modes. Prints one JSON line per run (decode tokens/s, the speculative figures of
`--timing`, the load average after it) and one per round saying whether every mode's
generated ids equal the first mode's.

Usage: bench/speculative_generate.py MODES ROUNDS [--prompts N] [--max-tokens T]
         [--max-num-seqs B] [--met PATH]
MODES is a JSON object from a mode's name to its extra flags, e.g.
  '{"off": [], "ngram": ["--speculative", "ngram", "--num-speculative-tokens", "4"]}'
"""
import argparse
import json
import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
GGUF = pathlib.Path(os.environ.get("MET_HOME", pathlib.Path.home() / ".cache/met")) / "models/SmolLM2-135M-Instruct.Q4_1.gguf"


def run(met, flags, prompts, args):
    cmd = [met, "generate", "--device", "cpu", "--model", str(GGUF), "--max-num-seqs", str(args.max_num_seqs),
           "--max-tokens", str(args.max_tokens), "--json", "--timing"]
    for p in prompts:
        cmd += ["--chat", p["prompt"]]
    out = subprocess.run(cmd + flags, capture_output=True, text=True, check=True,
                         env=dict(os.environ, RAYON_NUM_THREADS="2"))
    timing = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")][-1]
    ids = [json.loads(line)["generated_ids"] for line in out.stdout.splitlines()]
    return timing, ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("modes")
    ap.add_argument("rounds", type=int)
    ap.add_argument("--prompts", type=int, default=9)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=1)
    ap.add_argument("--met", default=str(ROOT / "target/release/met"))
    args = ap.parse_args()
    modes = json.loads(args.modes)
    prompts = [json.loads(line) for line in open(ROOT / "bench/datasets/input_grounded.jsonl")][: args.prompts]
    for r in range(args.rounds):
        order = list(modes) if r % 2 == 0 else list(reversed(list(modes)))
        outputs = {}
        for name in order:
            timing, outputs[name] = run(args.met, modes[name], prompts, args)
            print(json.dumps({"B": args.max_num_seqs, "round": r, "mode": name,
                              "decode_tokens_per_s": timing["decode_tokens_per_s"],
                              "decode_tokens": timing["decode_tokens"], "speculative": timing.get("speculative"),
                              "load": open("/proc/loadavg").read().split()[:3]}), flush=True)
        first = outputs[list(modes)[0]]
        print(json.dumps({"B": args.max_num_seqs, "round": r, "identical": all(o == first for o in outputs.values())}),
              flush=True)


if __name__ == "__main__":
    main()
