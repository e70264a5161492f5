"""Two random checkpoints of one shape for the CPU comparison: `fp8/` in transformers'
block-wise `fp8` layout (e4m3 projection weights, one `weight_scale_inv` per 128 x 128
block, everything else bf16), and `bf16/` with bf16 projection weights instead. Written with
numpy alone (the safetensors format by hand). Usage: make_checkpoints.py CONFIG_DIR OUT_DIR"""
import json, os, struct, sys

import numpy as np

BLOCK = 128


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    meta = json.dumps(header).encode()
    meta += b" " * (-len(meta) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(meta)))
        f.write(meta)
        for b in blobs:
            f.write(b)


def bf16(a):
    return (np.asarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


def main():
    src, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(src, "config.json")))
    rng = np.random.default_rng(0)
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    hd, heads, kv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    proj = {"self_attn.q_proj": (heads * hd, h), "self_attn.k_proj": (kv * hd, h), "self_attn.v_proj": (kv * hd, h),
            "self_attn.o_proj": (h, heads * hd), "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
            "mlp.down_proj": (h, inter)}
    for kind in ("fp8", "bf16"):
        t = {"model.embed_tokens.weight": ("BF16", (cfg["vocab_size"], h),
                                           bf16(rng.standard_normal((cfg["vocab_size"], h)) * 0.02)),
             "model.norm.weight": ("BF16", (h,), bf16(np.ones(h)))}
        for i in range(layers):
            p = f"model.layers.{i}."
            for norm in ("input_layernorm", "post_attention_layernorm"):
                t[p + norm + ".weight"] = ("BF16", (h,), bf16(np.ones(h)))
            for norm in ("self_attn.q_norm", "self_attn.k_norm"):
                t[p + norm + ".weight"] = ("BF16", (hd,), bf16(np.ones(hd)))
            for name, (n, k) in proj.items():
                if kind == "fp8":
                    q = rng.integers(0, 256, (n, k), dtype=np.uint8)
                    q[(q & 0x7F) == 0x7F] ^= 1  # no e4m3 NaN
                    t[p + name + ".weight"] = ("F8_E4M3", (n, k), q.tobytes())
                    grid = (-(-n // BLOCK), -(-k // BLOCK))
                    scale = (rng.random(grid, dtype=np.float32) * 0.02 + 0.01) / 448.0
                    t[p + name + ".weight_scale_inv"] = ("F32", grid, scale.astype(np.float32).tobytes())
                else:
                    t[p + name + ".weight"] = ("BF16", (n, k), bf16(rng.standard_normal((n, k)) * 0.02))
        d = os.path.join(out, kind)
        os.makedirs(d, exist_ok=True)
        c = dict(cfg)
        if kind == "fp8":
            c["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                        "weight_block_size": [BLOCK, BLOCK]}
        json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=1)
        write_safetensors(os.path.join(d, "model.safetensors"), t)
        print(d, sum(len(v[2]) for v in t.values()) / 2**20, "MiB")


if __name__ == "__main__":
    main()
