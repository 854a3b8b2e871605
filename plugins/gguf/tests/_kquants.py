"""Q4_K and Q6_K encoders for tests (gguf-py dequantizes K-quants but cannot make them).

Plain round-to-nearest with the block layouts gguf's dequantizers read (not llama.cpp's search for the best
scales): enough to build a K-quant file of a real model and compare kept-quantized against dequantized.
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def _f16(values: np.ndarray) -> np.ndarray:
    """float32 [n] -> the 2 bytes of each as float16 [n, 2]."""
    return values.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros_like(a), where=b != 0)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] (cols % 256 == 0) -> Q4_K bytes [rows, cols // 256 * 144]:
    per super-block d, dmin (f16), eight 6-bit scales and mins packed in 12 bytes, 128 bytes of nibbles."""
    rows = x.shape[0]
    sub = x.reshape(-1, 8, 32).astype(np.float32)
    lo, hi = np.minimum(sub.min(-1), 0), sub.max(-1)
    scale, low = (hi - lo) / 15, -lo  # value = q * scale - low, q in 0..15
    d = scale.max(-1) / 63
    dmin = low.max(-1) / 63
    d16, dmin16 = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(_safe_div(scale, d16[:, None])), 0, 63).astype(np.uint8)
    m = np.clip(np.round(_safe_div(low, dmin16[:, None])), 0, 63).astype(np.uint8)
    step, offset = d16[:, None] * sc, dmin16[:, None] * m
    q = np.clip(np.round(_safe_div(sub + offset[..., None], np.broadcast_to(step[..., None], sub.shape))), 0, 15)
    q = q.astype(np.uint8).reshape(-1, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    # 12 bytes: scales 0-3 (+ top bits of 4-7), mins 0-3 (+ top bits of 4-7), low bits of scales / mins 4-7
    high_sc, high_m = sc[:, :4] | ((sc[:, 4:] >> 4) << 6), m[:, :4] | ((m[:, 4:] >> 4) << 6)
    scales = np.concatenate([high_sc, high_m, (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)], axis=-1)
    return np.concatenate([_f16(d), _f16(dmin), scales, qs], axis=-1).reshape(rows, -1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] (cols % 256 == 0) -> Q6_K bytes [rows, cols // 256 * 210]:
    128 bytes of low nibbles, 64 of high 2-bit pairs, sixteen int8 scales, d (f16)."""
    rows = x.shape[0]
    sub = x.reshape(-1, 16, 16).astype(np.float32)
    scale = np.abs(sub).max(-1) / 31  # value = d * sc * (u - 32), u in 0..63
    d = scale.max(-1) / 127
    d16 = d.astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(_safe_div(scale, d16[:, None])), -128, 127).astype(np.int8)
    step = d16[:, None] * sc.astype(np.float32)
    u = np.clip(np.round(_safe_div(sub, np.broadcast_to(step[..., None], sub.shape))), -32, 31) + 32
    u = u.astype(np.uint8).reshape(-1, QK_K)
    low, high = (u & 15).reshape(-1, 2, 2, 64), (u >> 4).reshape(-1, 2, 4, 32)
    ql = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(-1, 128)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(-1, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), _f16(d)], axis=-1).reshape(rows, -1)
