"""A plain K-quant quantiser (Q4_K, Q5_K, Q6_K) for test fixtures: round-to-nearest with
each sub-block's range as its scale, not llama.cpp's search for the best scales, which
only the quality of the values would show. Blocks follow ggml's layouts (`ggml-common.h`);
`check` decodes them with gguf-py to confirm it.
"""

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

QK_K = 256


def _f16(v):
    return v.astype(np.float16)


def _pack_scales(sc, m):
    """The 12 bytes holding eight 6-bit scales and minimums per super-block."""
    s = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return s


def _q4_q5(x, levels):
    """Scales, minimums and quants of Q4_K (`levels` 15) or Q5_K (31) super-blocks."""
    x = x.reshape(-1, 8, 32)
    lo, hi = np.minimum(x.min(-1), 0), x.max(-1)
    scale, mn = (hi - lo) / levels, -lo
    d = _f16(np.maximum(scale.max(-1), 1e-12) / 63)
    dmin = _f16(np.maximum(mn.max(-1), 1e-12) / 63)
    sc = np.clip(np.rint(scale / d.astype(np.float32)[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(mn / dmin.astype(np.float32)[:, None]), 0, 63).astype(np.uint8)
    step = d.astype(np.float32)[:, None] * sc
    off = dmin.astype(np.float32)[:, None] * m
    q = np.where(step[..., None] > 0, np.rint((x + off[..., None]) / np.where(step > 0, step, 1)[..., None]), 0)
    q = np.clip(q, 0, levels).astype(np.uint8)
    head = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), _pack_scales(sc, m)], 1)
    # Chunk c of 32 bytes: sub-block 2c in the low nibbles, 2c + 1 in the high ones.
    qs = ((q[:, 0::2] & 0xF) | ((q[:, 1::2] & 0xF) << 4)).reshape(-1, 128)
    return head, q, qs


def q4_k(x):
    head, _, qs = _q4_q5(x, 15)
    return np.concatenate([head, qs], 1)


def q5_k(x):
    head, q, qs = _q4_q5(x, 31)
    # Bit j of qh[l] is bit 4 of element l of sub-block j.
    qh = sum(((q[:, j, :] >> 4) & 1) << j for j in range(8)).astype(np.uint8)
    return np.concatenate([head, qh, qs], 1)


def q6_k(x):
    x = x.reshape(-1, 16, 16)
    scale = np.abs(x).max(-1) / 31
    d = _f16(np.maximum(scale.max(-1), 1e-12) / 127)
    sc = np.clip(np.rint(scale / d.astype(np.float32)[:, None]), -128, 127).astype(np.int8)
    step = d.astype(np.float32)[:, None] * sc
    q = np.where(step[..., None] != 0, np.rint(x / np.where(step != 0, step, 1)[..., None]), 0)
    q = np.clip(q + 32, 0, 63).astype(np.uint8).reshape(-1, 2, 4, 32)  # [half, quarter, l]
    ql = np.concatenate([(q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4), (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)], 2)
    qh = sum((q[:, :, t] >> 4) << (2 * t) for t in range(4)).astype(np.uint8)
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), d.view(np.uint8).reshape(-1, 2)], 1)


QUANTISERS = {Q.Q4_K: q4_k, Q.Q5_K: q5_k, Q.Q6_K: q6_k}


def quantize(x, qtype):
    """`x` (rows × cols, cols whole super-blocks) as rows of `qtype` blocks."""
    rows, cols = x.shape
    blocks = QUANTISERS[qtype](x.reshape(-1, QK_K).astype(np.float32))
    return blocks.reshape(rows, -1)


def check(x, blocks, qtype):
    """The largest |dequantised − x| relative to max |x|, by gguf-py's dequantiser."""
    back = dequantize(blocks, qtype).reshape(x.shape)
    return float(np.abs(back - x).max() / np.abs(x).max())
