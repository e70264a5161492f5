#!/usr/bin/env python3
"""FP8 versions of the `qwen3` HF fixture, one per scale layout met reads, with float32
references computed on the dequantized weights.

Each projection weight of the attention and MLP blocks (q/k/v/o, gate/up/down) is cast to
`torch.float8_e4m3fn` after dividing by its scale (the absolute maximum of its tensor,
row or block over 448, e4m3's largest value); embeddings, norms and the head stay as they
are, as real FP8 checkpoints leave them. Three fixtures, each a `config.json` with the
`quantization_config` its publishers write:

    qwen3_fp8_block    transformers `fp8`, `weight_block_size` [24, 40] (blocks cut short
                       at the edges of every weight), `weight_scale_inv`
    qwen3_fp8_channel  `compressed-tensors` float8 weights, one scale per output row,
                       `weight_scale` [n, 1]
    qwen3_fp8_tensor   transformers `fp8` per-tensor with static activations:
                       `weight_scale` and `input_scale` scalars

The reference is the qwen3 fixture's model in float32 with every quantized weight replaced
by its dequantized values (fp8 value x scale, what met and transformers both compute), so
met's CPU run must equal it as the float fixtures do. Usage: fp8_fixtures.py (torch,
transformers, safetensors; run from the repository; writes into the fixtures directory).
"""

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).parent))
import hf_fixtures as hf  # noqa: E402

SOURCE = hf.OUT_DIR / "qwen3"
E4M3_MAX = 448.0
HEADROOMS = (1.0, 1.03, 1.07, 1.13, 1.19, 1.25)
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LAYOUTS = {
    "qwen3_fp8_block": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                        "weight_block_size": [24, 40], "modules_to_not_convert": ["lm_head"]},
    "qwen3_fp8_channel": {
        "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}}},
    "qwen3_fp8_tensor": {"quant_method": "fp8", "activation_scheme": "static"},
}


def scales_of(w: torch.Tensor, name: str, headroom: float) -> torch.Tensor:
    """The scale grid of `w` [n, k] for fixture `name`: [n/br, k/bc], [n, 1] or [];
    `headroom` >= 1 leaves that much of e4m3's range unused (another rounding of the same
    weights, tried when a fixture's top-2 margins come out too small)."""
    n, k = w.shape
    if name == "qwen3_fp8_block":
        br, bc = LAYOUTS[name]["weight_block_size"]
        grid = torch.zeros((n + br - 1) // br, (k + bc - 1) // bc)
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                grid[i, j] = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc].abs().max()
        return grid * headroom / E4M3_MAX
    if name == "qwen3_fp8_channel":
        return w.abs().amax(dim=1, keepdim=True) * headroom / E4M3_MAX
    return w.abs().max() * headroom / E4M3_MAX


def expand(scale: torch.Tensor, shape, name: str) -> torch.Tensor:
    """`scale` broadcast over a weight of `shape`."""
    if name == "qwen3_fp8_block":
        br, bc = LAYOUTS[name]["weight_block_size"]
        return scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)[: shape[0], : shape[1]]
    return scale.expand(shape) if scale.dim() else scale * torch.ones(shape)


def quantize(tensors: dict, name: str, headroom: float):
    """The checkpoint's tensors with the targets in FP8, and the dequantized targets."""
    out, dequantized = {}, {}
    for key, t in tensors.items():
        if not (key.endswith(".weight") and key.split(".")[-2] in TARGETS):
            out[key] = t
            continue
        w = t.float()
        scale = scales_of(w, name, headroom)
        q = (w / expand(scale, w.shape, name)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        out[key] = q
        suffix = "_scale_inv" if name == "qwen3_fp8_block" else "_scale"
        out[key + suffix] = scale.float().contiguous()
        if name == "qwen3_fp8_tensor":
            out[key[: -len("weight")] + "input_scale"] = torch.tensor(1.0 / E4M3_MAX)
        dequantized[key] = q.float() * expand(scale, w.shape, name)
    return out, dequantized


def main():
    source = load_file(str(SOURCE / "model.safetensors"))
    prompts = json.loads((SOURCE / "reference.json").read_text())["prompts"]
    for name, qconfig in LAYOUTS.items():
        out = hf.OUT_DIR / name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        cfg = json.loads((SOURCE / "config.json").read_text())
        cfg["quantization_config"] = qconfig
        for headroom in HEADROOMS:
            tensors, dequantized = quantize(source, name, headroom)
            model = hf.load_f32(SOURCE)
            state = model.state_dict()
            for key, w in dequantized.items():
                state[key].copy_(w)
            logits, greedy, margin = hf.compute_references(model, prompts)
            if margin >= hf.MIN_MARGIN:
                break
            print(f"{name}: headroom {headroom}: top-2 margin {margin:.3g} under {hf.MIN_MARGIN}")
        else:
            hf.fail(f"{name}: no headroom in {HEADROOMS} reached a top-2 margin of {hf.MIN_MARGIN}")
        save_file(tensors, str(out / "model.safetensors"))
        (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        save_file({f"logits.{i}": lg for i, lg in enumerate(logits)}, str(out / "reference.safetensors"))
        ref = {"name": name, "model_type": cfg["model_type"], "prompts": prompts, "greedy": greedy,
               "min_margin": margin, "scale_headroom": headroom, "covers": f"qwen3 with {qconfig['quant_method']} weights",
               "transformers": hf.transformers.__version__, "torch": torch.__version__}
        (out / "reference.json").write_text(hf.dump_json(ref))
        print(f"{name}: min margin {margin:.4g}")


if __name__ == "__main__":
    main()
