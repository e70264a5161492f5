#!/usr/bin/env python3
"""met on the GPU against Hugging Face transformers on the same GPU, in bf16.

Builds random-weight bf16 models with transformers from real `config.json` files
(Qwen3-0.6B as is, Llama-3.1-8B reduced to 4 layers; copies in `configs/`), saves them as
safetensors, and compares, on several prompts of 16 to 512 random token ids:

- last-position logprobs, teacher-forced: met's top-20 tokens (the first step of
  `met generate --top-logprobs 20`, through the engine with all prompts batched and
  prefill chunks of 128) against transformers' logprobs of the same tokens;
- 32-token greedy continuations: each token met drew against transformers' argmax on met's
  own prefix (one teacher-forced forward over met's continuation), so every step is
  compared, and met's free-running continuation against transformers' for the first
  departure.

The bf16 noise is measured the same way between transformers in bf16 and transformers in
float32 with the same weights (upcast): |Δlogprob| of the bf16 model's top-20 tokens at
the last prompt position and at every greedy step, and |Δlogit| over the same tokens.

Bounds (exit status 1 when broken):
- greedy: wherever met's token differs from transformers' argmax, transformers' top-2
  logit margin at that step must be at most the measured noise (max |Δlogit|);
- p99 |Δlogprob| of met against transformers-bf16 at most 2 x the p99 noise (floored at
  0.01): two independent bf16 evaluations of one function each sit about one noise away
  from the exact value.

Runs on the GPU machine from the gpu-bundle runner:
    python3 gpu_compare.py --met ./met --configs configs --work /tmp/cmp --out results.json
Needs torch, transformers, safetensors (no downloads: weights are random).
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

PROMPT_LENS = [16, 37, 64, 128, 200, 512]
NEW_TOKENS = 32
TOP = 20
MODELS = [
    # (name, config dir, overrides)
    ("qwen3-0.6b", "Qwen3-0.6B", {}),
    ("llama-3.1-8b-4layers", "Llama-3.1-8B-Instruct", {"num_hidden_layers": 4}),
]


def build(config_dir, overrides, out_dir, seed):
    """Random bf16 weights from the real config, saved as safetensors with that config."""
    with open(os.path.join(config_dir, "config.json")) as f:
        raw = json.load(f)
    raw.update(overrides)
    cfg = AutoConfig.for_model(raw["model_type"], **{k: v for k, v in raw.items() if k != "model_type"})
    torch.manual_seed(seed)
    with torch.device("cuda"):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        except TypeError:
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.eval()
    os.makedirs(out_dir, exist_ok=True)
    try:
        model.save_pretrained(out_dir, safe_serialization=True)
    except TypeError:  # transformers versions that always write safetensors
        model.save_pretrained(out_dir)
    # met reads the hub's config layout, as a user's checkpoint has it.
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(raw, f, indent=2)
    gen = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    return model, raw


def prompts_for(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    # Ids from the first 100k avoid the special tokens at the top of both vocabularies.
    return [torch.randint(0, min(vocab, 100_000), (n,), generator=g).tolist() for n in PROMPT_LENS]


@torch.no_grad()
def logits_of(model, ids):
    """Float32 logits at every position of one sequence."""
    x = torch.tensor([ids], device="cuda")
    return model(input_ids=x).logits[0].float()


@torch.no_grad()
def greedy(model, prompt, n):
    """Transformers' own greedy continuation (KV cache), and its top-2 margin per step."""
    x = torch.tensor([prompt], device="cuda")
    out = model(input_ids=x, use_cache=True)
    past, toks = out.past_key_values, []
    logits = out.logits[0, -1].float()
    for _ in range(n):
        tok = int(torch.argmax(logits))
        toks.append(tok)
        out = model(input_ids=torch.tensor([[tok]], device="cuda"), past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[0, -1].float()
    return toks


def run_met(met, model_dir, prompts, work):
    path = os.path.join(work, "prompts.jsonl")
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt_ids": p}) + "\n")
    cmd = [met, "generate", "--model", model_dir, "--device", "cuda", "--prompts-file", path,
           "--max-tokens", str(NEW_TOKENS), "--temperature", "0", "--top-logprobs", str(TOP),
           "--ignore-eos", "--max-prefill-chunk", "128", "--json", "--timing"]
    start = time.time()
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "MET_LOG": "info"})
    sys.stderr.write(res.stderr)
    if res.returncode != 0:
        raise SystemExit(f"met generate failed ({res.returncode})")
    lines = [json.loads(l) for l in res.stdout.splitlines() if l.strip()]
    lines.sort(key=lambda o: o["prompt"])
    return lines, time.time() - start


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def compare(name, config_dir, overrides, met, work, seed):
    model_dir = os.path.join(work, name)
    t0 = time.time()
    model, raw = build(config_dir, overrides, model_dir, seed)
    build_s = time.time() - t0
    prompts = prompts_for(raw["vocab_size"], seed + 1)
    ref32 = copy.deepcopy(model).float()

    # transformers bf16 vs float32: the noise. Last positions and transformers' greedy path.
    noise_lp, noise_logit, hf_greedy = [], [], []
    for p in prompts:
        cont = greedy(model, p, NEW_TOKENS)
        hf_greedy.append(cont)
        seq = p + cont[:-1]
        lb, lf = logits_of(model, seq)[len(p) - 1:], logits_of(ref32, seq)[len(p) - 1:]
        for row_b, row_f in zip(lb, lf):
            top = torch.topk(row_b, TOP).indices
            noise_lp += (torch.log_softmax(row_b, -1)[top] - torch.log_softmax(row_f, -1)[top]).abs().tolist()
            noise_logit.append(float((row_b[top] - row_f[top]).abs().max()))
    del ref32
    torch.cuda.empty_cache()
    noise = max(noise_logit)

    lines, met_s = run_met(met, model_dir, prompts, work)
    dlp, agree, steps, violations, first_departures = [], 0, 0, [], []
    for p, out, hf_cont in zip(prompts, lines, hf_greedy):
        assert out["prompt_ids"] == p
        met_toks = out["generated_ids"]
        assert len(met_toks) == NEW_TOKENS, f"met generated {len(met_toks)} tokens"
        # Last position, teacher-forced: met's top-20 against transformers' logprobs.
        hf_last = torch.log_softmax(logits_of(model, p)[-1], -1)
        for tok, lp in out["top_logprobs"][0]:
            dlp.append(abs(lp - float(hf_last[tok])))
        # Every greedy step of met against transformers' argmax on met's prefix.
        rows = logits_of(model, p + met_toks[:-1])[len(p) - 1:]
        for step, (tok, row) in enumerate(zip(met_toks, rows)):
            top2 = torch.topk(row, 2)
            hf_tok, margin = int(top2.indices[0]), float(top2.values[0] - top2.values[1])
            steps += 1
            if tok == hf_tok:
                agree += 1
            elif margin > noise:
                violations.append({"prompt_len": len(p), "step": step, "met": tok, "hf": hf_tok, "margin": margin})
        first_departures.append(next((i for i, (a, b) in enumerate(zip(met_toks, hf_cont)) if a != b), None))
    del model
    torch.cuda.empty_cache()

    p99_noise = percentile(noise_lp, 0.99)
    lp_bound = 2 * max(p99_noise, 0.01)
    result = {
        "model": name,
        "prompt_lens": PROMPT_LENS,
        "mean_abs_dlogprob_top20": sum(dlp) / len(dlp),
        "p99_abs_dlogprob_top20": percentile(dlp, 0.99),
        "max_abs_dlogprob_top20": max(dlp),
        "greedy_steps_agreeing": agree,
        "greedy_steps": steps,
        "greedy_agreement": agree / steps,
        "greedy_violations": violations,
        "free_running_first_departure": first_departures,
        "noise_mean_abs_dlogprob_top20": sum(noise_lp) / len(noise_lp),
        "noise_p99_abs_dlogprob_top20": p99_noise,
        "noise_max_abs_dlogit_top20": noise,
        "p99_bound": lp_bound,
        "build_s": build_s,
        "met_generate_s": met_s,
    }
    result["pass"] = not violations and result["p99_abs_dlogprob_top20"] <= lp_bound
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--met", required=True)
    ap.add_argument("--configs", required=True)
    ap.add_argument("--work", default="/tmp/met-gpu-compare")
    ap.add_argument("--out", default="gpu_compare.json")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    results = []
    for name, cfg_dir, overrides in MODELS:
        r = compare(name, os.path.join(args.configs, cfg_dir), overrides, os.path.abspath(args.met), args.work, args.seed)
        results.append(r)
        print(json.dumps(r), flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print("\nmodel                     mean|dlp|  p99|dlp|  (bound)  greedy agree    noise p99|dlp|  noise max|dlogit|  pass")
    for r in results:
        print(f"{r['model']:<25} {r['mean_abs_dlogprob_top20']:9.4f} {r['p99_abs_dlogprob_top20']:9.4f} ({r['p99_bound']:.3f}) "
              f"{r['greedy_steps_agreeing']:4}/{r['greedy_steps']:<4} {r['greedy_agreement']:6.1%} "
              f"{r['noise_p99_abs_dlogprob_top20']:14.4f} {r['noise_max_abs_dlogit_top20']:17.4f}  {'PASS' if r['pass'] else 'FAIL'}")
    sys.exit(0 if all(r["pass"] for r in results) else 1)


if __name__ == "__main__":
    main()
