#!/usr/bin/env python3
"""Rounds over several met binaries on the CPU: a 128-token prompt, then 256 greedy tokens.

Usage: alternate.py ROUNDS BASE_MET OTHER_MET... (env MET_ARGS: extra `met generate`
arguments, e.g. `--model FILE`; MAX_TOKENS: tokens to generate, default 256). The order of
the binaries rotates every round (and reverses every len(binaries) rounds), so drift in
the machine's load reaches each alike. Prints one JSON line per run, then per metric the
medians and the paired ratios (other / base, round by round) with their median."""
import json, os, statistics, subprocess, sys
rounds = int(sys.argv[1])
bins = sys.argv[2:]
ids = ",".join(str(100 + 7 * i) for i in range(128))
def run(binary):
    cmd = [binary, "generate", "--device", "cpu", "--prompt-ids", ids, "--max-tokens", os.environ.get("MAX_TOKENS", "256"),
           "--temperature", "0", "--ignore-eos", "--timing", *os.environ.get("MET_ARGS", "").split()]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    for line in out.splitlines():
        if line.startswith('{"prompt'):
            return json.loads(line)
    raise SystemExit("no timing line: " + out[-2000:])
res = {b: [] for b in bins}
for r in range(rounds):
    k = r % len(bins)
    order = bins[k:] + bins[:k]
    if r // len(bins) % 2:
        order = order[::-1]
    for b in order:
        t = run(b)
        t["load1"] = round(os.getloadavg()[0], 2)
        res[b].append(t)
        print(json.dumps({"round": r, "build": b, **t}), flush=True)
base = bins[0]
for key in ["prompt_tokens_per_s", "decode_tokens_per_s"]:
    for b in bins[1:]:
        x = [t[key] for t in res[base]]; y = [t[key] for t in res[b]]
        ratios = [q / p for p, q in zip(x, y)]
        print(json.dumps({"metric": key, "base": base, "build": b, "base_median": round(statistics.median(x), 2),
                          "build_median": round(statistics.median(y), 2),
                          "paired_ratio_median": round(statistics.median(ratios), 4),
                          "faster_rounds": sum(q > 1 for q in ratios), "ratios": [round(q, 3) for q in ratios]}))
