#!/usr/bin/env python3
"""Writes a Llama-shaped GGUF of random Q4_1 weights, for CPU speed runs whose weights must
stream from memory (the default model's 96 MB fit in some machines' last-level cache).

The tokenizer and chat template are copied from another GGUF (by default the default model),
so both met and llama.cpp load it; the weights are random bytes with small finite f16 scales
and minimums, norms are ones, and the embedding (tied to the head) is Q8_0. Only speed is
meaningful: the model says nothing sensible.

    python3 -m venv ~/venvs/gguf && ~/venvs/gguf/bin/pip install gguf numpy
    ~/venvs/gguf/bin/python scripts/synthetic_gguf.py --out /tmp/llama-1b-q4_1.gguf

Needs the `gguf` and `numpy` packages (not dependencies of met or its CI).
"""

import argparse
import os

import numpy as np
import gguf

Q = gguf.GGMLQuantizationType


def blocks(rng, rows, cols, qtype):
    """Random bytes for `rows × cols` weights of `qtype` with small f16 scale (and min)."""
    elems, size = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(rows * cols // elems, size), dtype=np.uint8)
    d = rng.uniform(0.002, 0.02, size=b.shape[0]).astype(np.float16)
    b[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    if qtype == Q.Q4_1:
        m = rng.uniform(-0.1, 0.0, size=b.shape[0]).astype(np.float16)
        b[:, 2:4] = m.view(np.uint8).reshape(-1, 2)
    return b.reshape(rows, cols // elems * size)


def main():
    home = os.environ.get("MET_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "met")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--tokenizer-from", default=os.path.join(home, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    src = gguf.GGUFReader(a.tokenizer_from)
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("synthetic-llama-q4_1")
    w.add_context_length(8192)
    w.add_embedding_length(a.hidden)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.intermediate)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_dimension_count(a.hidden // a.heads)
    w.add_rope_freq_base(100000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    for name, field in src.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            w.add_array(name, [field.contents(i) for i in range(len(field.data))])
        else:
            w.add_key_value(name, field.contents(), kind)
    h, kv = a.hidden, a.hidden // a.heads * a.kv_heads
    ones = np.ones(h, dtype=np.float32)
    w.add_tensor("token_embd.weight", blocks(rng, vocab, h, Q.Q8_0), raw_dtype=Q.Q8_0)
    w.add_tensor("output_norm.weight", ones)
    for i in range(a.layers):
        for name, rows, cols in [("attn_q", h, h), ("attn_k", kv, h), ("attn_v", kv, h), ("attn_output", h, h),
                                 ("ffn_gate", a.intermediate, h), ("ffn_up", a.intermediate, h),
                                 ("ffn_down", h, a.intermediate)]:
            w.add_tensor(f"blk.{i}.{name}.weight", blocks(rng, rows, cols, Q.Q4_1), raw_dtype=Q.Q4_1)
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(a.out, os.path.getsize(a.out) // (1 << 20), "MiB")


if __name__ == "__main__":
    main()
