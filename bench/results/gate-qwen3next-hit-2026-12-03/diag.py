"""Is the qwen3-next "prefix hit 1536+100" gate row a restore bug or the tail of the statistic?

For each seed: met on the gate's hit prompts with prefix caching (as the gate runs them) and
without (the same prompts cold), both judged against transformers-float32 with the gate's own
code; plus met-hit against met-cold directly. Run from the repository root on the GPU machine:
    python3 bench/results/gate-qwen3next-hit-2026-12-03/diag.py --met gpu-bundle/met --seeds 11-22
"""
import argparse, json, os, sys
sys.path.insert(0, "gpu-bundle")
import torch
import gpu_gate as g

ap = argparse.ArgumentParser()
ap.add_argument("--met", required=True)
ap.add_argument("--seeds", default="11-22")
ap.add_argument("--shape", default="qwen3-next")
ap.add_argument("--work", default="/tmp/met-diag")
ap.add_argument("--out", default="diag.json")
args = ap.parse_args()
lo, hi = map(int, args.seeds.split("-"))
os.makedirs(args.work, exist_ok=True)
torch.backends.cuda.matmul.allow_tf32 = False
name, raw, long = next(s for s in g.SHAPES if s[0] == args.shape)
met = os.path.abspath(args.met)
variants = {"hit": ["--max-num-seqs", "1"], "cold": ["--max-num-seqs", "1", "--no-prefix-caching"]}
pooled = {v: {} for v in variants}
per_seed = []
for seed in range(lo, hi + 1):
    path = g.build(name, raw, args.work, seed)
    _, hits = g.prompts_for(seed, long)
    m32 = g.load(path, torch.float32, "cuda")
    mb = g.load(path, torch.bfloat16, "cuda")
    outs = {}
    row = {"seed": seed}
    for v, extra in variants.items():
        o = g.run_met(met, path, hits, args.work, "cuda", extra, {})
        if v == "hit":
            g.check_hits(hits, o, f"seed {seed}")
        outs[v] = o
        r32 = [g.teacher_forced(m32, p, x["generated_ids"], "cuda") for (_, p), x in zip(hits, o)]
        rb = [g.teacher_forced(mb, p, x["generated_ids"], "cuda") for (_, p), x in zip(hits, o)]
        cases = {}
        g.judge(cases, hits, o, r32, rb)
        g.judge(pooled[v], hits, o, r32, rb)
        for case, c in cases.items():
            s = c.summary()
            row[f"{v} {case}"] = (round(s["met_p99"], 4), round(s["bf16_p99"], 4), round(s["p99_ratio"], 2),
                                  round(s["mean_ratio"], 2))
    # met hit against met cold, where both generated the same tokens
    for (case, _), a, b in zip(hits, outs["hit"], outs["cold"]):
        same = 0
        d = []
        for step in range(g.NEW_TOKENS):
            if a["generated_ids"][:step + 1] != b["generated_ids"][:step + 1]:
                break
            same += 1
            lb = dict((t, lp) for t, lp in b["top_logprobs"][step])
            d += [abs(lp - lb[t]) for t, lp in a["top_logprobs"][step] if t in lb]
        row[f"hit-vs-cold {case}"] = (same, round(max(d, default=0), 4), round(sum(d) / max(len(d), 1), 4))
    per_seed.append(row)
    print(json.dumps(row), flush=True)
    del m32, mb
    torch.cuda.empty_cache()

summary = {v: {case: c.summary() for case, c in cs.items()} for v, cs in pooled.items()}
print("\npooled over seeds", args.seeds)
for v, cs in summary.items():
    for case, s in cs.items():
        print(f"{v:5} {case:22} rows {s['rows']:4} mean {s['met_mean']:.4f}/{s['bf16_mean']:.4f} = {s['mean_ratio']:.2f}"
              f"  p99 {s['met_p99']:.4f}/{s['bf16_p99']:.4f} = {s['p99_ratio']:.2f}  departs {s['met_departures']}"
              f"/{s['bf16_departures']}  {'PASS' if s['pass'] else 'FAIL'}")
json.dump({"per_seed": per_seed, "pooled": summary}, open(args.out, "w"), indent=1)
