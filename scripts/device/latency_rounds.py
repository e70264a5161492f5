#!/usr/bin/env python3
"""Batch-1 decode A/B on one machine: `met bench latency` for every run, in interleaved rounds
(run 1, run 2, ..., then again), each run's JSON kept, and a table of the decode step p50 per
round, the median over rounds as tok/s, and its ratio to the first run's (the baseline). Meant for a GPU lease, where
the machine is noisy from call to call but steady within one: compare only runs of one call.

    scripts/device/latency_rounds.py --out DIR --rounds 2 --deadline 300 \\
        "tag=main bin=gpu-bundle/met-main model=configs/Qwen3.6-35B-A3B" \\
        "tag=new bin=gpu-bundle/met model=configs/Qwen3.6-35B-A3B" \\
        "tag=fp8-f16silu bin=gpu-bundle/met model=configs/Meta-Llama-3-8B-Instruct-FP8 env=MET_FP8_ONE=f16silu"

A run is `key=value` words: `tag`, `bin` and `model` (required), `format` (`--load-format`,
default `dummy`), `env=NAME=VALUE` (repeatable), `arg=...` (repeatable, passed to met as is).
A run that would start past `--deadline` seconds is skipped, so a lease's call ends in time.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def parse_run(text):
    run = {"format": "dummy", "env": {}, "args": []}
    for word in text.split():
        key, sep, value = word.partition("=")
        if not sep:
            sys.exit(f"latency_rounds: `{word}` in run `{text}` is not key=value")
        if key == "env":
            name, sep, val = value.partition("=")
            if not sep:
                sys.exit(f"latency_rounds: env `{value}` in run `{text}` is not NAME=VALUE")
            run["env"][name] = val
        elif key == "arg":
            run["args"].append(value)
        elif key in ("tag", "bin", "model", "format"):
            run[key] = value
        else:
            sys.exit(f"latency_rounds: unknown key `{key}` in run `{text}`")
    for key in ("tag", "bin", "model"):
        if key not in run:
            sys.exit(f"latency_rounds: run `{text}` has no {key}=")
    return run


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--deadline", type=float, default=540, help="seconds from the start after which no run starts")
    p.add_argument("--timeout", type=float, default=120, help="seconds a run may take")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--num-iters", type=int, default=3)
    p.add_argument("runs", nargs="+")
    a = p.parse_args()
    runs = [parse_run(r) for r in a.runs]
    tags = [r["tag"] for r in runs]
    if len(set(tags)) != len(tags):
        sys.exit(f"latency_rounds: tags repeat: {tags}")
    os.makedirs(a.out, exist_ok=True)
    start = time.monotonic()
    p50 = {t: [] for t in tags}
    for rnd in range(1, a.rounds + 1):
        for run in runs:
            tag = run["tag"]
            if time.monotonic() - start > a.deadline:
                print(f"skip {tag} round {rnd}: past the deadline", flush=True)
                continue
            stem = os.path.join(a.out, f"lat-{tag}-r{rnd}")
            cmd = [run["bin"], "bench", "latency", "--model", run["model"], "--load-format", run["format"],
                   "--batch-size", "1", "--input-len", str(a.input_len), "--output-len", str(a.output_len),
                   "--num-iters", str(a.num_iters), "--output", stem + ".json", *run["args"]]
            env = {**os.environ, **run["env"]}
            with open(stem + ".log", "w") as log:
                try:
                    rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=a.timeout).returncode
                except subprocess.TimeoutExpired:
                    rc = "timeout"
            value = None
            if rc == 0:
                with open(stem + ".json") as f:
                    value = json.load(f)["decode_step_ms"]["p50"]
                p50[tag].append(value)
            shown = f"{value:.3f} ms" if value is not None else f"failed ({rc}; see {stem}.log)"
            print(f"{tag} round {rnd}: decode step p50 {shown} [{time.monotonic() - start:.0f} s]", flush=True)
    base = statistics.median(p50[tags[0]]) if p50[tags[0]] else None
    print(f"\n| run | {' | '.join(f'round {i}' for i in range(1, a.rounds + 1))} | tok/s (median) | vs {tags[0]} |")
    print(f"|---|{'---:|' * a.rounds}---:|---:|")
    for tag in tags:
        vals = p50[tag]
        cells = [f"{v:.3f} ms" for v in vals] + ["-"] * (a.rounds - len(vals))
        mid = statistics.median(vals) if vals else None
        tps = f"{1000 / mid:.1f}" if mid else "-"
        ratio = f"{base / mid:.3f}x" if mid and base else "-"
        print(f"| {tag} | {' | '.join(cells)} | {tps} | {ratio} |")
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump({"decode_step_p50_ms": p50, "baseline": tags[0]}, f, indent=1)


if __name__ == "__main__":
    main()
