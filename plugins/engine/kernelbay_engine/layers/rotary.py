"""Rotary position embeddings: every RoPE variant the shipped families use, computed from positions on the fly.

Frequencies follow transformers' `modeling_rope_utils` formula for formula (so logits match bit for bit in
float32); they are built lazily on first use, never in `__init__`, so building a model on the meta device
does not need any tensor math.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from kernelbay_engine.native import QKV_ROPE_DTYPES, ops, tracked

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")


@dataclass(frozen=True, slots=True)
class RopeParams:
    """What a rotary layer needs; `scaling` holds the type-specific keys (factor, beta_fast, long_factor, ...)."""

    theta: float
    rotary_dim: int  # leading dims of a head that rotate (partial rotary: < head_dim)
    rope_type: str = "default"
    max_position_embeddings: int = 2048
    scaling: Mapping[str, object] = field(default_factory=dict)
    interleaved: bool = False  # pairs (x0, x1), (x2, x3) rotate together (DeepSeek) instead of halves

    def __post_init__(self):
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {self.rope_type!r} is not supported; use one of {', '.join(ROPE_TYPES)}")
        if self.rotary_dim <= 0 or self.rotary_dim % 2:
            raise ValueError(f"rotary_dim must be a positive even number, got {self.rotary_dim}")
        if self.theta <= 0:
            raise ValueError(f"rope theta must be > 0, got {self.theta}")

    def get(self, key: str, default=None):
        value = self.scaling.get(key)
        return default if value is None else value

    @property
    def original_max(self) -> int:
        return int(self.get("original_max_position_embeddings", self.max_position_embeddings))


def _base_inv_freq(p: RopeParams, base: float | None = None) -> torch.Tensor:
    dim = p.rotary_dim
    base = p.theta if base is None else base
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))


def _default(p: RopeParams, seq_len: int) -> tuple[torch.Tensor, float]:
    return _base_inv_freq(p), 1.0


def _linear(p: RopeParams, seq_len: int) -> tuple[torch.Tensor, float]:
    return _base_inv_freq(p) / float(p.get("factor")), 1.0


def _dynamic(p: RopeParams, seq_len: int) -> tuple[torch.Tensor, float]:
    dim, factor, max_pos = p.rotary_dim, float(p.get("factor")), p.max_position_embeddings
    seq_len = max(seq_len, max_pos)
    base = p.theta * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return _base_inv_freq(p, base), 1.0


def _llama3(p: RopeParams, seq_len: int) -> tuple[torch.Tensor, float]:
    inv_freq = _base_inv_freq(p)
    factor, low, high = float(p.get("factor")), float(p.get("low_freq_factor")), float(p.get("high_freq_factor"))
    old_len = p.original_max
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled), 1.0


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_attention_factor(p: RopeParams, factor: float) -> float:
    if p.get("attention_factor") is not None:
        return float(p.get("attention_factor"))
    mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
    return yarn_mscale(factor)


def _yarn_ramp(p: RopeParams, dim: int) -> torch.Tensor:
    """1 where a frequency keeps its original value (extrapolates), 0 where it is interpolated."""
    base, orig = p.theta, p.original_max

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(p.get("beta_fast", 32)), correction_dim(p.get("beta_slow", 1))
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    return 1 - ramp


def _yarn(p: RopeParams, seq_len: int) -> tuple[torch.Tensor, float]:
    dim = p.rotary_dim
    factor = float(p.get("factor") or p.max_position_embeddings / p.original_max)
    pos_freqs = p.theta ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = _yarn_ramp(p, dim)
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    return inv_freq, _yarn_attention_factor(p, factor)


def _longrope(p: RopeParams, seq_len: int) -> tuple[torch.Tensor, float]:
    dim, orig = p.rotary_dim, p.original_max
    factor = float(p.get("factor") or p.max_position_embeddings / orig)
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    ext = p.get("long_factor") if seq_len > orig else p.get("short_factor")
    if ext is None or len(ext) != dim // 2:
        raise ValueError(f"longrope needs long_factor and short_factor of length rotary_dim/2 = {dim // 2}")
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (torch.tensor(ext, dtype=torch.float32) * p.theta**exponents), float(attention_factor)


_INV_FREQ: dict[str, Callable[[RopeParams, int], tuple[torch.Tensor, float]]] = {
    "default": _default,
    "linear": _linear,
    "dynamic": _dynamic,
    "llama3": _llama3,
    "yarn": _yarn,
    "longrope": _longrope,
}
# Types whose frequencies depend on how far the step's positions reach.
_LENGTH_DEPENDENT: dict[str, Callable[[RopeParams], int]] = {
    "dynamic": lambda p: p.max_position_embeddings,
    "longrope": lambda p: p.original_max,
}


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to packed q [T, H, D] and k [T, Hk, D] at `positions` [T]; dims past rotary_dim pass through."""

    def __init__(self, params: RopeParams):
        super().__init__()
        self.params = params
        self._tables: dict[bool, tuple[torch.Tensor, float]] = {}
        self._step: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def _inv_freq(self, positions: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Frequencies for this step. `longrope` and `dynamic` depend on how far positions reach: like
        transformers (per forward call), the step's furthest position decides, for every request in it."""
        long = False
        threshold = _LENGTH_DEPENDENT.get(self.params.rope_type)
        if threshold is not None and positions.numel():
            long = int(positions.max()) + 1 > threshold(self.params)
        if self.params.rope_type == "dynamic" and long:
            return _dynamic(self.params, int(positions.max()) + 1)
        if long not in self._tables:
            start = threshold(self.params) + 1 if long and threshold is not None else 0  # long implies a threshold
            self._tables[long] = _INV_FREQ[self.params.rope_type](self.params, start)
        return self._tables[long]

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin: [T, rotary_dim] (halves repeated), scaled by the variant's attention factor."""
        inv_freq, attention_factor = self._inv_freq(positions)
        freqs = positions[:, None].float() * inv_freq.to(positions.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if attention_factor != 1.0:  # x * 1.0 is x: skipped, like the casts to the dtype they already have
            cos, sin = cos * attention_factor, sin * attention_factor
        return (cos, sin) if cos.dtype == dtype else (cos.to(dtype), sin.to(dtype))

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rot_dim = self.params.rotary_dim
        x_rot, x_pass = x[..., :rot_dim], x[..., rot_dim:]
        cos, sin = cos[:, None, :], sin[:, None, :]
        if self.params.interleaved:
            half = rot_dim // 2
            cos, sin = cos[..., :half], sin[..., :half]
            even, odd = x_rot[..., 0::2], x_rot[..., 1::2]
            rotated = torch.cat([even * cos - odd * sin, odd * cos + even * sin], dim=-1)
        else:
            rotated = x_rot * cos + _rotate_half(x_rot) * sin
        return torch.cat([rotated, x_pass], dim=-1) if x_pass.shape[-1] else rotated

    def apply(  # type: ignore[override]  # shadows nn.Module.apply(fn): callers across the plugins use this one
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q and k with tables from `cos_sin` (computed once per step, shared by all layers)."""
        p = self.params
        full = q.shape[-1] == k.shape[-1] == p.rotary_dim and q.dtype == k.dtype
        if p.interleaved or not full or torch.compiler.is_compiling():
            return self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        both = _adjacent_heads(q, k)
        if both is None:
            return self._rotate_full(q, cos, sin), self._rotate_full(k, cos, sin)
        out = self._rotate_full(both, cos, sin)  # q and k of one fused projection: one rotation for both
        return out[:, : q.shape[1]].contiguous(), out[:, q.shape[1] :].contiguous()

    def split_rotate(
        self, qkv: torch.Tensor, heads: int, kv_heads: int, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, heads, D], k and v [T, kv_heads, D] in the tables' dtype from a fused projection's output
        qkv [T, (heads + 2 * kv_heads) * D] (in any float dtype: a quantized kernel's bf16 is widened exactly),
        q and k rotated: one native call where it runs, else the cast, the split by heads and `apply`."""
        p, dim = self.params, qkv.shape[-1] // (heads + 2 * kv_heads)
        native = ops()
        runnable = qkv.dtype in QKV_ROPE_DTYPES and qkv.dim() == 2 and qkv.is_contiguous()
        if native is not None and runnable and cos.dtype == torch.float32:
            if not p.interleaved and p.rotary_dim == dim and not tracked(qkv):
                return native.qkv_rope(qkv, heads, kv_heads, cos, sin)
        qkv = qkv.to(cos.dtype).view(-1, heads + 2 * kv_heads, dim)
        q, k, v = qkv.split_with_sizes((heads, kv_heads, kv_heads), dim=1)  # 2 aten calls, not 4
        q, k = self.apply(q, k, cos, sin)
        return q, k, v

    def _rotate_full(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """`_rotate` with every dim rotating, in 4 ops instead of ~12 (a decode step is dispatch-bound):
        rotate_half(x) * sin == roll(x, D/2) * (sin with its first half negated), negation being exact, so the
        result is bit for bit `_rotate`'s (roll measured ~2x cheaper than a signed-swap matmul in a decode step)."""
        native = ops()
        if native is not None and x.dtype == cos.dtype == torch.float32 and not tracked(x) and x.stride(-1) == 1:
            return native.rope(x, cos, sin)  # the same products and sums, one call (kernelbay_engine.native)
        cos3, signed_sin3 = self._step_tables(cos, sin)
        return x * cos3 + torch.roll(x, self.params.rotary_dim // 2, -1) * signed_sin3

    def _step_tables(self, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, 1, D] views of this step's cos and signed sin, made by the first layer and reused by the others."""
        step = self._step
        if step is None or step[0] is not cos or step[1] is not sin:
            half = self.params.rotary_dim // 2
            signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
            step = self._step = (cos, sin, cos[:, None, :], signed[:, None, :])
        return step[2], step[3]

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.apply(q, k, *self.cos_sin(positions, q.dtype))

    def extra_repr(self) -> str:
        p = self.params
        return f"type={p.rope_type}, rotary_dim={p.rotary_dim}, theta={p.theta}, interleaved={p.interleaved}"


def _adjacent_heads(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """q [T, H, D] and k [T, Hk, D] as one [T, H + Hk, D] view when k's heads follow q's in memory (both are
    slices of one fused qkv output), else None."""
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        return None
    if q.stride(2) != 1 or q.stride(1) != q.shape[2] or k.stride()[1:] != q.stride()[1:]:
        return None
    if q.shape[0] > 1 and q.stride(0) != k.stride(0):  # one token: that stride means nothing (views differ)
        return None
    if k.data_ptr() != q.data_ptr() + q.shape[1] * q.stride(1) * q.element_size():
        return None
    if q.untyped_storage().data_ptr() != k.untyped_storage().data_ptr():
        return None
    return q.as_strided((q.shape[0], q.shape[1] + k.shape[1], q.shape[2]), q.stride())
