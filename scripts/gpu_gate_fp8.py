"""FP8 weights for the precision gate (`gpu_gate.py`): checkpoints as their publishers write
them, and the references that judge met on them.

A draw of the gate's sharp float model (rounded to bf16, as every gate checkpoint is) becomes:

- the FP8 checkpoint met loads: every Linear of the decoder layers cast to
  `float8_e4m3fn` under its scale, the absolute maximum of its 128 x 128 block (`block`,
  transformers' `fp8` with `weight_block_size` [128, 128], `weight_scale_inv` [n/128, k/128])
  or of the whole tensor (`tensor`, AutoFP8's static per-tensor `fp8`: `weight_scale` and a
  calibrated `input_scale`, both scalars) over 448, e4m3's largest value; embeddings, norms and
  the head stay bf16, as real FP8 checkpoints leave them;
- the same model in float32 with those weights dequantized (`fp8(q) x scale`, the values met
  and transformers compute with): the float32 reference.

The noise floor is transformers running the FP8 checkpoint in bf16. `native` tries that first
and, where it cannot, says why; the gate records it. In transformers 5.17 (read from its
source; the GPU machine's image has transformers 5.17 and no `kernels` package):

- block: it loads into `FP8Linear` (e4m3 weights, `weight_scale_inv`), but every forward
  calls `fp8_linear`, which takes DeepGEMM or the Triton kernel
  `kernels-community/finegrained-fp8`, both fetched from the Hugging Face Hub by the `kernels`
  package at run time (`integrations/finegrained_fp8.py`, `_load_finegrained_fp8_kernel`,
  and `integrations/hub_kernels.py`): the GPU machine has neither the package nor a network.
  Without a GPU the quantizer dequantizes the weights to bf16 at load (`quantizer_finegrained_fp8.py`,
  `validate_environment`);
- tensor: `FineGrainedFP8Config` defaults `weight_block_size` to (128, 128), so the loader
  expects `weight_scale_inv` of [n/128, k/128] and leaves AutoFP8's `weight_scale` and
  `input_scale` unread.

Failing that, the floor is transformers' bf16 model with each quantized Linear replaced by
`EmulatedFp8Linear`, which computes what transformers' `FP8Linear` computes (its docstrings
in 5.17: activations narrowed to e4m3 dynamically per token and 128 columns for block
weights, under the static per-tensor `activation_scale` = `input_scale` for static
checkpoints; e4m3 products accumulated in float32, the result in the activations' dtype).
The activation narrowing belongs in the floor: met's prefill steps narrow activations the
same way, and bf16 on the dequantized weights (recorded beside it, `dequant_bf16_*`) keeps
far closer to float32 than any FP8 product does. Measured on the CPU (eight draws of each
shape, `bench/results/gate-fp8-cpu-2026-12-04`): the emulated floor's mean |dlogprob| goes
from 0.20 at 16 tokens to 0.39-0.47 past 500 (p99 0.71 to 1.48), bf16 on the dequantized
weights' from 0.025 to 0.07 (p99 0.09 to 0.27), six to eight times less; weights with every
other scale doubled, as `fp8-wrong-scale` uploads them, run exactly by met on the CPU, stand
1.9-2.3 from float32 (mean |dlogprob|): 4.2 to 12.9 times the floor's mean, 2.5 to 6.8 times
its p99.
"""

import json
import os

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

E4M3_MAX = 448.0
BLOCK = 128
LAYOUTS = {
    "block": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
              "weight_block_size": [BLOCK, BLOCK], "modules_to_not_convert": ["lm_head"]},
    "tensor": {"quant_method": "fp8", "activation_scheme": "static"},
}
# Static input scales: the largest |input| of each Linear over CALIB_PROMPTS random prompts
# of CALIB_LEN tokens through the float32 dequantized model, as AutoFP8 calibrates.
CALIB_PROMPTS, CALIB_LEN = 4, 1024


def targets(model):
    """Names of the Linear modules a checkpoint quantizes: those of the decoder layers."""
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in f".{n}"]


def expand(scale, shape, layout):
    """`scale` broadcast over a weight of `shape`."""
    if layout == "block":
        return scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[: shape[0], : shape[1]]
    return scale.expand(shape)


def quantize(w, layout):
    """e4m3 codes and f32 scales of `w` [n, k]: [ceil(n/128), ceil(k/128)] or a scalar."""
    if layout == "block":
        n, k = w.shape
        padded = torch.zeros(-(-n // BLOCK) * BLOCK, -(-k // BLOCK) * BLOCK)
        padded[:n, :k] = w.abs()
        grid = padded.view(padded.shape[0] // BLOCK, BLOCK, -1, BLOCK).amax(dim=(1, 3))
        scale = grid / E4M3_MAX
    else:
        scale = w.abs().max() / E4M3_MAX
    scale = scale.clamp_min(torch.finfo(torch.float32).tiny).float()
    q = (w / expand(scale, w.shape, layout)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize(q, scale, layout):
    """The float32 values of e4m3 codes `q` under `scale`, as met and transformers compute them."""
    return q.float() * expand(scale, q.shape, layout)


@torch.no_grad()
def calibrate(model, names, seed, vocab):
    """Static input scales: the largest |input| of each module in `names` over the calibration
    prompts, over 448."""
    mods = dict(model.named_modules())
    amax = {n: torch.tensor(0.0) for n in names}

    def hook(name):
        return lambda _m, args: amax.__setitem__(name, torch.maximum(amax[name], args[0].abs().max().float().cpu()))

    handles = [mods[n].register_forward_pre_hook(hook(n)) for n in names]
    g = torch.Generator().manual_seed(seed * 104729 + 1)
    for _ in range(CALIB_PROMPTS):
        model(input_ids=torch.randint(3, vocab, (1, CALIB_LEN), generator=g))
    for h in handles:
        h.remove()
    return {n: (a / E4M3_MAX).clamp_min(torch.finfo(torch.float32).tiny) for n, a in amax.items()}


def write(model_bf16, raw, layout, out, ref_out, seed):
    """Writes the FP8 checkpoint of `model_bf16` to `out` and its float32 dequantized twin to
    `ref_out` (the module docstring says how)."""
    names = targets(model_bf16)
    model = model_bf16.float()
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    tensors = {k: v.to(torch.bfloat16) for k, v in state.items()}
    for name in names:
        key = f"{name}.weight"
        q, scale = quantize(state[key], layout)
        tensors[key] = q
        tensors[f"{key}_scale_inv" if layout == "block" else f"{key}_scale"] = scale
        state[key] = dequantize(q, scale, layout)
    model.load_state_dict(state)
    if layout == "tensor":
        for name, s in calibrate(model.eval(), names, seed, raw["vocab_size"]).items():
            tensors[f"{name}.input_scale"] = s
    for path, weights, cfg in ((out, tensors, {**raw, "quantization_config": LAYOUTS[layout]}),
                               (ref_out, state, {**raw, "torch_dtype": "float32"})):
        os.makedirs(path, exist_ok=True)
        save_file(weights, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)


class EmulatedFp8Linear(torch.nn.Module):
    """transformers' `FP8Linear` forward in torch (the module docstring says why): the
    activations narrowed to e4m3 (per token and 128 columns, or under a static per-tensor
    scale), times the e4m3 weights under their scales, accumulated in float32."""

    def __init__(self, q, scale, layout, input_scale, bias):
        super().__init__()
        self.register_buffer("weight", dequantize(q, scale, layout))
        self.register_buffer("input_scale", input_scale)
        self.bias = bias

    def narrow(self, x):
        x = x.float()
        if self.input_scale is not None:
            return (x / self.input_scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * self.input_scale
        g = x.unflatten(-1, (-1, BLOCK))  # [..., k / 128, 128]
        s = (g.abs().amax(-1, keepdim=True) / E4M3_MAX).clamp_min(torch.finfo(torch.float32).tiny)
        return ((g / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * s).flatten(-2)

    def forward(self, x):
        y = torch.nn.functional.linear(self.narrow(x), self.weight)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)


def emulated(model_bf16, fp8_path, layout, device):
    """`model_bf16` (transformers, bf16, loaded from the dequantized twin) with every
    quantized Linear computing from `fp8_path`'s codes and scales as `FP8Linear` does."""
    tensors = load_file(os.path.join(fp8_path, "model.safetensors"))
    mods = dict(model_bf16.named_modules())
    for name in targets(model_bf16):
        parent, _, attr = name.rpartition(".")
        w = f"{name}.weight"
        scale = tensors[f"{w}_scale_inv" if layout == "block" else f"{w}_scale"]
        static = tensors.get(f"{name}.input_scale")
        lin = EmulatedFp8Linear(tensors[w], scale, layout, static, mods[name].bias)
        setattr(mods[parent], attr, lin.to(device))
    return model_bf16


def native(fp8_path, device):
    """transformers' own FP8 model of `fp8_path` in bf16 if it loads cleanly, keeps e4m3
    weights and runs a forward here; else None and why not."""
    try:
        model, info = AutoModelForCausalLM.from_pretrained(fp8_path, dtype=torch.bfloat16, device_map=device,
                                                           output_loading_info=True)
    except Exception as e:  # noqa: BLE001 -- any failure means: no native path here
        return None, f"transformers cannot load it: {type(e).__name__}: {e}"
    bad = {k: sorted(v)[:4] for k, v in info.items() if k in ("missing_keys", "unexpected_keys") and v}
    if bad:
        return None, f"transformers' fp8 loader does not read this layout: {bad}"
    if not any(p.dtype == torch.float8_e4m3fn for p in model.parameters()):
        return None, "transformers dequantized the weights to bf16 at load (no FP8 path on this device)"
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([[3, 4, 5, 6]], device=device))
    except Exception as e:  # noqa: BLE001
        return None, f"transformers' FP8 forward failed: {type(e).__name__}: {str(e)[:300]}"
    return model.eval(), "transformers' own FP8 linear"
