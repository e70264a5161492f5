#!/usr/bin/env python3
"""Batch-1 decode speed of gpt-fast on random weights: the side-by-side anchor of
`met bench latency` on the GPU.

gpt-fast (pytorch-labs/gpt-fast) is not part of met: pass a checkout of it with --gpt-fast
(the published figures used commit 32971d3). The model is built from gpt-fast's own config
for --model with random bf16 weights on the GPU; its decode step is compiled the way
gpt-fast's `generate.py --compile` does (torch.compile, mode="reduce-overhead", so CUDA
graphs), the prompt prefilled eagerly, and the decode loop timed alone: --new-tokens minus
one decode steps after the prefill's token, greedy (temperature 0), median of --runs runs
after one warm-up run that also compiles. Prints one JSON line.
"""

import argparse
import json
import statistics
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpt-fast", required=True, help="a gpt-fast checkout")
    ap.add_argument("--model", default="llama-3.1-8b", help="a name gpt-fast's ModelArgs knows")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, args.gpt_fast)
    import generate as gf  # noqa: E402  (gpt-fast's module; sets its inductor options)
    from model import Transformer  # noqa: E402

    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Transformer.from_name(args.model)
    model = model.eval()
    vocab = model.config.vocab_size
    total = args.prompt_len + args.new_tokens
    decode = torch.compile(gf.decode_one_token, mode="reduce-overhead", fullgraph=True)
    gf.decode_one_token = decode
    prompt = torch.randint(0, vocab, (1, args.prompt_len), device="cuda", dtype=torch.int)
    times = []
    compile_s = None
    for run in range(args.runs + 1):
        with torch.device("cuda"):
            model.setup_caches(max_batch_size=1, max_seq_length=total)
        input_pos = torch.arange(0, args.prompt_len, device="cuda")
        with torch.no_grad():
            token = gf.prefill(model, prompt, input_pos, temperature=0.0).clone()
            torch.cuda.synchronize()
            start = time.perf_counter()
            pos = torch.tensor([args.prompt_len], device="cuda", dtype=torch.int)
            gf.decode_n_tokens(model, token.view(1, -1), pos, args.new_tokens - 1, temperature=0.0)
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if run == 0:
            compile_s = elapsed
        else:
            times.append(elapsed)
    median = statistics.median(times)
    steps = args.new_tokens - 1
    print(json.dumps({
        "anchor": "gpt-fast",
        "model": args.model,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "decode_steps": steps,
        "decode_s": times,
        "median_decode_tokens_per_s": steps / median,
        "median_step_ms": 1e3 * median / steps,
        "first_run_s_with_compile": compile_s,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
    }))


if __name__ == "__main__":
    main()
