"""Random PEFT adapters for vLLM's side of the LoRA bench: N adapters of rank R on all seven
projections of the Llama-3.1-8B shape, drawn as met's `--lora-dummy` draws its own (A uniform
in +-1/sqrt(in), B uniform in +-0.01, alpha = rank). Usage: make_adapters.py CONFIG_DIR OUT N R"""
import json, os, sys

import torch
from safetensors.torch import save_file

config_dir, out, n, r = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
c = json.load(open(os.path.join(config_dir, "config.json")))
h, inter, heads = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
hd = c.get("head_dim", h // heads)
q, kv = heads * hd, c["num_key_value_heads"] * hd
shapes = {"self_attn.q_proj": (h, q), "self_attn.k_proj": (h, kv), "self_attn.v_proj": (h, kv),
          "self_attn.o_proj": (q, h), "mlp.gate_proj": (h, inter), "mlp.up_proj": (h, inter),
          "mlp.down_proj": (inter, h)}
g = torch.Generator().manual_seed(0)
for a in range(n):
    tensors = {}
    for layer in range(c["num_hidden_layers"]):
        for name, (fan_in, fan_out) in shapes.items():
            key = f"base_model.model.model.layers.{layer}.{name}"
            tensors[f"{key}.lora_A.weight"] = ((torch.rand(r, fan_in, generator=g) * 2 - 1) / fan_in**0.5).bfloat16()
            tensors[f"{key}.lora_B.weight"] = ((torch.rand(fan_out, r, generator=g) * 2 - 1) * 0.01).bfloat16()
    d = os.path.join(out, f"a{a}")
    os.makedirs(d, exist_ok=True)
    save_file(tensors, os.path.join(d, "adapter_model.safetensors"))
    json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": r, "lora_dropout": 0.0,
               "bias": "none", "use_rslora": False, "base_model_name_or_path": config_dir,
               "target_modules": [k.split(".")[1] for k in shapes]}, open(os.path.join(d, "adapter_config.json"), "w"))
print(f"{n} adapters of rank {r} in {out}")
