"""Whether the FP8 gate sees `fp8-wrong-scale`, on the CPU, where the fault does nothing:
the pattern the CUDA upload applies (odd columns of the 128 x 128 scale grid doubled, or odd
rows of a per-tensor weight, met's per-row grid) is written into a float32 checkpoint of the
dequantized weights, which met runs exactly; the gate's first draw of each FP8 shape judges
it against the correct float32 reference and the emulated floor.
Usage (from the repository): python bench/results/gate-fp8-cpu-2026-12-04/broken_probe.py MET WORK
"""
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../scripts"))
import gpu_gate as g  # noqa: E402
import gpu_gate_fp8 as fp8  # noqa: E402

met, work, seed = os.path.abspath(sys.argv[1]), sys.argv[2], g.SEEDS[0]
os.makedirs(work, exist_ok=True)
for name, raw, long, layout in g.FP8_SHAPES:
    path, ref = g.build_fp8(name, raw, layout, work, seed)
    codes, state = load_file(f"{path}/model.safetensors"), load_file(f"{ref}/model.safetensors")
    for key, q in codes.items():
        if q.dtype != torch.float8_e4m3fn:
            continue
        scale = codes[key + ("_scale_inv" if layout == "block" else "_scale")].clone()
        if layout == "block":
            scale[:, 1::2] *= 2
            state[key] = fp8.dequantize(q, scale, layout)
        else:
            state[key] = fp8.dequantize(q, scale, layout)
            state[key][1::2] *= 2
    broken = f"{ref}-wrong-scale"
    os.makedirs(broken, exist_ok=True)
    save_file(state, f"{broken}/model.safetensors", metadata={"format": "pt"})
    shutil.copy(f"{ref}/config.json", broken)
    m32 = g.load(ref, torch.float32, "cpu")
    floor = fp8.emulated(g.load(ref, torch.bfloat16, "cpu"), path, layout, "cpu")
    batch, hits = g.prompts_for(seed, long)
    cases = {}
    for prompts, extra in ((batch, ["--max-prefill-chunk", str(g.CHUNK)]), (hits, ["--max-num-seqs", "1"])):
        outs, _ = g.run_met(met, broken, prompts, work, "cpu", extra, {})
        forced = lambda m: [g.teacher_forced(m, p, o["generated_ids"], "cpu") for (_, p), o in zip(prompts, outs)]  # noqa: E731
        g.judge(cases, prompts, outs, forced(m32), forced(floor))
    print(g.table(f"{name}, seed {seed}: met on the wrongly scaled weights (must FAIL)",
                  {name: {c: v.summary() for c, v in cases.items()}}), flush=True)
