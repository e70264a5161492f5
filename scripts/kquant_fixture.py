#!/usr/bin/env python3
"""Writes `crates/kernels/src/quant/testdata/kquant_rows.bin`: random rows of each K-quant
(Q4_K, Q5_K, Q6_K) with the values gguf-py's dequantiser gives them, so met's packed
layout is checked against an implementation other than its own block decoders.

    /work/venv-ref/bin/python scripts/kquant_fixture.py

Per entry: the format's name (4 ASCII bytes, `q4_k`), `k` and the row count as u32 LE,
the GGUF blocks, then the f32 LE values. Needs the `gguf` and `numpy` packages.
"""

import os
import struct

import numpy as np
from gguf import GGMLQuantizationType as Q, GGML_QUANT_SIZES
from gguf.quants import dequantize

OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "kernels", "src", "quant", "testdata",
                   "kquant_rows.bin")
ROWS, K = 3, 512


def blocks(rng, qtype):
    """Random blocks with finite small f16 scales: `d` (and `dmin`) first, Q6_K's `d` last."""
    elems, size = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(ROWS * K // elems, size), dtype=np.uint8)
    d = rng.uniform(0.0005, 0.01, size=b.shape[0]).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if qtype == Q.Q6_K:
        b[:, size - 2:] = d
    else:
        b[:, 0:2] = d
        b[:, 2:4] = rng.uniform(0.0, 0.01, size=b.shape[0]).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return b


def main():
    rng = np.random.default_rng(34)
    out = bytearray()
    for name, qtype in [("q4_k", Q.Q4_K), ("q5_k", Q.Q5_K), ("q6_k", Q.Q6_K)]:
        b = blocks(rng, qtype)
        values = dequantize(b.reshape(ROWS, -1), qtype).astype("<f4")
        assert values.shape == (ROWS, K) and np.isfinite(values).all()
        out += name.encode() + struct.pack("<II", K, ROWS) + b.tobytes() + values.tobytes()
    with open(OUT, "wb") as f:
        f.write(out)
    print(OUT, len(out), "bytes")


if __name__ == "__main__":
    main()
