#!/usr/bin/env python3
"""CPU speed of met next to llama.cpp on the same GGUF, measured in alternating runs.

For each engine and round: process a 128-token prompt (prompt tokens/s), then generate
128 tokens greedily one at a time (decode tokens/s), with 2 threads each. llama.cpp runs
through the `llama-cpp-python` package (which builds llama.cpp from source; install it
once in a virtualenv outside the repository, it is not a dependency of met or its CI):

    python3 -m venv ~/venvs/lcpp && ~/venvs/lcpp/bin/pip install llama-cpp-python
    ~/venvs/lcpp/bin/python scripts/bench_cpu_llamacpp.py --met target/release/met

`--quant-dots exact,int8` runs met once per mode in every round, and `--met A,B` each binary (an
A/B of two builds against the same llama.cpp rounds). llama.cpp's figures are the wall time of `Llama.eval` over the prompt and over each
generated token (its greedy pick is an argmax over the returned logits); met's come from
`met generate --timing` (wall time of the engine steps before and after the first token).
Model loading is excluded for both. Medians over the rounds are printed as JSON.
"""

import argparse
import json
import os
import statistics
import subprocess
import time


def prompt_ids(n):
    # Ordinary tokens of SmolLM2's vocabulary, away from the special ids at the start.
    return [100 + (i * 37) % 20000 for i in range(n)]


def bench_llamacpp(path, ids, gen, threads):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=512,
                          n_batch=512, verbose=False)
    llm.reset()
    start = time.perf_counter()
    llm.eval(ids)
    prefill_wall = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(gen):
        token = int(llm.scores[llm.n_tokens - 1].argmax())
        llm.eval([token])
    decode_wall = time.perf_counter() - start
    out = {"prompt_tokens_per_s": len(ids) / prefill_wall, "decode_tokens_per_s": gen / decode_wall}
    del llm
    return out


def bench_met(met, path, ids, gen, threads, dots):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), MET_LOG="off")
    cmd = [met, "generate", "--model", path, "--prompt-ids", ",".join(map(str, ids)),
           "--max-tokens", str(gen + 1), "--ignore-eos", "--timing", "--quant-dots", dots]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    timing = json.loads(done.stderr.strip().splitlines()[-1])
    return {"prompt_tokens_per_s": timing["prompt_tokens_per_s"],
            "decode_tokens_per_s": timing["decode_tokens_per_s"]}


def main():
    home = os.environ.get("MET_HOME", os.path.expanduser("~/.cache/met"))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.path.join(home, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--met", default="target/release/met",
                   help="met binaries, comma-separated (each is its own engine: an A/B of two builds)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quant-dots", default="exact",
                   help="met's --quant-dots values to run, comma-separated (each is its own engine)")
    args = p.parse_args()
    ids = prompt_ids(args.prompt)
    dots = args.quant_dots.split(",")
    bins = args.met.split(",")
    tag = (lambda b: f"met[{os.path.basename(b)}]") if len(bins) > 1 else (lambda b: "met")
    mets = {(b, d): f"{tag(b)} ({d})" for b in bins for d in dots}
    runs = {"llama.cpp": [], **{name: [] for name in mets.values()}}
    for _ in range(args.rounds):
        runs["llama.cpp"].append(bench_llamacpp(args.model, ids, args.gen, args.threads))
        for (b, d), name in mets.items():
            runs[name].append(bench_met(b, args.model, ids, args.gen, args.threads, d))
    summary = {
        engine: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for engine, rs in runs.items()
    }
    for name in mets.values():
        summary[f"{name}/llama.cpp"] = {
            key: summary[name][key] / summary["llama.cpp"][key] for key in summary[name]
        }
    print(json.dumps({"rounds": args.rounds, "threads": args.threads, "prompt": args.prompt, "gen": args.gen,
                      "median": summary, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
