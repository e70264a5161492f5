#!/usr/bin/env python3
"""Writes a Qwen3-shaped GGUF of random weights in llama.cpp's Q4_K_M mix, for CPU speed
runs of the K-quant kernels (Qwen3-0.6B's shapes by default).

The tensor types follow what `llama-quantize ... Q4_K_M` gives a tied Qwen3: Q4_K for the
matrices, Q6_K for `attn_v` and `ffn_down` in the layers llama.cpp gives more bits (the
first and last eighth, and every third layer between) and for the tied embedding, f32 for
norms. The blocks are random bytes with small finite f16 scales, so only speed is
meaningful. The tokenizer and chat template are copied from another GGUF (the default
model's), its token list padded with unused control tokens up to `--vocab`, so both met
and llama.cpp load the file with Qwen3-0.6B's vocabulary size.

    /work/venv-ref/bin/python scripts/synthetic_q4km_gguf.py --out /tmp/qwen3-0.6b-q4_k_m.gguf

The K-quant test fixture of `crates/model-layers/tests/kquant_gguf.rs` is a tiny one, with
Q5_K in its second layer's Q4_K tensors so that every K-quant is in it, and no tokenizer:

    /work/venv-ref/bin/python scripts/synthetic_q4km_gguf.py --hidden 256 --layers 2 --heads 2 \
        --kv-heads 1 --intermediate 256 --vocab 512 --q5k-layers 1 --no-tokenizer \
        --out crates/model-layers/tests/fixtures/kquant/qwen3_q4_k_m.gguf

Needs the `gguf` and `numpy` packages (not dependencies of met or its CI).
"""

import argparse
import os

import numpy as np
import gguf

import kquant_quantize

Q = gguf.GGMLQuantizationType


def kquant_blocks(rng, rows, cols, qtype):
    """Random `qtype` blocks for `rows × cols` weights, with f16 scales that keep the values
    within a few hundredths."""
    elems, size = gguf.GGML_QUANT_SIZES[qtype]
    assert cols % elems == 0, f"{cols} columns are not whole {qtype.name} blocks"
    b = rng.integers(0, 256, size=(rows * cols // elems, size), dtype=np.uint8)
    if qtype == Q.Q6_K:
        # Values d · sc · (q − 32) with |sc| ≤ 128 and |q − 32| ≤ 32.
        b[:, size - 2:] = rng.uniform(2e-6, 1e-5, size=b.shape[0]).astype(np.float16).view(np.uint8).reshape(-1, 2)
    else:
        # Values d · sc · q − dmin · m with 6-bit sc, m and 4- or 5-bit q.
        b[:, 0:2] = rng.uniform(2e-5, 6e-5, size=b.shape[0]).astype(np.float16).view(np.uint8).reshape(-1, 2)
        b[:, 2:4] = rng.uniform(1e-5, 4e-5, size=b.shape[0]).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return b.reshape(rows, cols // elems * size)


def gaussian_blocks(rng, rows, cols, qtype, std):
    """`rows × cols` weights drawn from N(0, std²), quantised to `qtype` by
    `kquant_quantize` (checked against gguf-py's dequantiser)."""
    w = rng.normal(0.0, std, size=(rows, cols)).astype(np.float32)
    b = kquant_quantize.quantize(w, qtype)
    assert kquant_quantize.check(w, b, qtype) < 0.1, f"{qtype.name} blocks do not decode to their weights"
    return b


def more_bits(layer, layers):
    """llama.cpp's `use_more_bits`: the layers whose `attn_v` and `ffn_down` Q4_K_M keeps
    in Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def copy_tokenizer(w, src, vocab):
    """The tokenizer fields of `src`, its token list padded to `vocab` entries."""
    tokens = len(src.fields["tokenizer.ggml.tokens"].data)
    pad = vocab - tokens
    assert pad >= 0, f"the tokenizer has {tokens} tokens, more than {vocab}"
    for name, field in src.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            values = [field.contents(i) for i in range(len(field.data))]
            if name == "tokenizer.ggml.tokens":
                values += [f"<|unused_{i}|>" for i in range(pad)]
            elif name == "tokenizer.ggml.token_type":
                values += [int(gguf.TokenType.CONTROL)] * pad
            elif name == "tokenizer.ggml.scores":
                values += [0.0] * pad
            w.add_array(name, values)
        else:
            w.add_key_value(name, field.contents(), kind)


def main():
    home = os.environ.get("MET_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "met")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--tokenizer-from", default=os.path.join(home, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=3072)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--q5k-layers", type=int, nargs="*", default=[], help="layers whose Q4_K tensors are Q5_K")
    p.add_argument("--no-tokenizer", action="store_true", help="write `vocab_size` instead of a tokenizer")
    p.add_argument("--gaussian", type=float, metavar="STD",
                   help="quantise N(0, STD²) weights instead of writing random blocks")
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    if a.gaussian:
        def blocks(rows, cols, qtype):
            return gaussian_blocks(rng, rows, cols, qtype, a.gaussian)
    else:
        def blocks(rows, cols, qtype):
            return kquant_blocks(rng, rows, cols, qtype)
    w = gguf.GGUFWriter(a.out, "qwen3")
    w.add_name("synthetic-qwen3-q4_k_m")
    w.add_context_length(40960)
    w.add_embedding_length(a.hidden)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.intermediate)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_key_length(a.head_dim)
    w.add_value_length(a.head_dim)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    if a.no_tokenizer:
        w.add_vocab_size(a.vocab)
    else:
        copy_tokenizer(w, gguf.GGUFReader(a.tokenizer_from), a.vocab)
    h, q, kv = a.hidden, a.heads * a.head_dim, a.kv_heads * a.head_dim
    w.add_tensor("token_embd.weight", blocks(a.vocab, h, Q.Q6_K), raw_dtype=Q.Q6_K)
    w.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    for i in range(a.layers):
        base = Q.Q5_K if i in a.q5k_layers else Q.Q4_K
        wide = Q.Q6_K if more_bits(i, a.layers) else base
        for name, rows, cols, qtype in [("attn_q", q, h, base), ("attn_k", kv, h, base), ("attn_v", kv, h, wide),
                                        ("attn_output", h, q, base), ("ffn_gate", a.intermediate, h, base),
                                        ("ffn_up", a.intermediate, h, base), ("ffn_down", h, a.intermediate, wide)]:
            w.add_tensor(f"blk.{i}.{name}.weight", blocks(rows, cols, qtype), raw_dtype=qtype)
        for name, n in [("attn_norm", h), ("ffn_norm", h), ("attn_q_norm", a.head_dim), ("attn_k_norm", a.head_dim)]:
            w.add_tensor(f"blk.{i}.{name}.weight", np.ones(n, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(a.out, os.path.getsize(a.out) // (1 << 20), "MiB")


if __name__ == "__main__":
    main()
