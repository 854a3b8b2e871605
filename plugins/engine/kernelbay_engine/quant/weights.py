"""`QuantizedWeight`: one linear weight held quantized, and the constructors that make one.

Two forms, both groupwise along K (in_features), one scale per (row, group):

- 8-bit: `q` int8 [N, K], value = q * scale;
- 4-bit: `q` uint8 [N, K] holding 0..15, value = (q - 8) * scale + zero (torch's int4 CPU kernel's
  convention; GGUF Q4_0 has zero = 0, Q4_1 folds its min in as zero = min + 8 * scale).

`scale` and `zero` are float32 [N, K // group_size]; group_size == K is per-output-channel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelbay.errors import ConfigError

GGUF_GROUP = 32  # Q8_0, Q4_0 and Q4_1 blocks: 32 weights along K share one scale (and min)
DOT_BLOCK = 32  # the native dot kernel's block: activations quantized per 32, weights' scales held per 32
BITS = (4, 8)


@dataclass(frozen=True, slots=True, eq=False)
class QuantizedWeight:
    """A weight [N, K] as integer codes plus per-group float32 scales (and zeros, 4-bit only)."""

    bits: int
    group_size: int
    unpacked: torch.Tensor | None
    """The codes one per byte (`q`), or None where only `dot_codes` were built: `q` unpacks them on first use."""
    scale: torch.Tensor
    """float32 [N, K // group_size]."""
    zero: torch.Tensor | None = None
    """float32 [N, K // group_size] (bits 4); None for 8-bit."""
    source: str = ""
    """Where the codes came from, for explain: "GGUF Q4_1", "int8 from float32 (per-channel)", ..."""
    dot_codes: torch.Tensor | None = None
    """uint8 [N, padded blocks * 32 * bits / 8]: the codes in int8_dot's layout (kernels._dot_layout), where they were
    built straight from a file's blocks (GGUF Q4_0 / Q4_1 / Q8_0 hold the same codes in another byte order)."""

    def __post_init__(self):
        problems = _shape_problems(self)
        if problems:
            raise ConfigError("invalid quantized weight", problems)

    @property
    def q(self) -> torch.Tensor:
        """int8 [N, K] (bits 8) or uint8 [N, K] with values 0..15 (bits 4); unpacked from `dot_codes` on first use
        (every consumer but int8_dot's packing reads these) and then held."""
        if self.unpacked is None:
            assert self.dot_codes is not None  # _shape_problems holds one of them
            q = codes_from_dot_layout(self.dot_codes, self.bits, self.in_features)
            object.__setattr__(self, "unpacked", q)  # a cache of derived state: the weight stays what it was
            return q
        return self.unpacked

    @property
    def out_features(self) -> int:
        return self.scale.shape[0]

    @property
    def in_features(self) -> int:
        return self.scale.shape[1] * self.group_size

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The weight the codes stand for, [N, K] (the reference every kernel is tested against), or only the
        `rows` [R] of it, [R, K], from those rows' codes alone (a quantized embedding table's lookup)."""

        def pick(t: torch.Tensor) -> torch.Tensor:
            return t if rows is None else t.index_select(0, rows)

        zero = None if self.zero is None else pick(self.zero)
        return dequantized_rows(pick(self.q), pick(self.scale), zero, self.bits, self.group_size, dtype)

    def nbytes(self) -> int:
        """Bytes a kernel streams per use: the codes at their bit width plus the scales."""
        n = self.out_features * self.in_features * self.bits // 8 + self.scale.numel() * 4
        return n + (self.zero.numel() * 4 if self.zero is not None else 0)


def dequantized_rows(
    q: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor | None,
    bits: int,
    group_size: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The values [R, K] of codes `q` [R, K] with their scales (and zeros, 4-bit) [R, K // group_size], in `dtype`:
    a `QuantizedWeight`'s rows, or a quantized table's rows read back from where its tied LM head keeps them."""
    codes = q.view(q.shape[0], -1, group_size).float()
    if bits == 4:
        codes = codes - 8
    out = codes * scale.unsqueeze(-1)
    if zero is not None:  # 4-bit weights have zeros, 8-bit ones none
        out = out + zero.unsqueeze(-1)
    out = out.view(q.shape[0], q.shape[1])
    return out if out.dtype == dtype else out.to(dtype)  # a same-dtype .to() is still a dispatched call


def _shape_problems(w: QuantizedWeight) -> list[str]:
    if w.bits not in BITS:
        return [f"bits {w.bits}: only {BITS} are supported"]
    if w.unpacked is None:
        return _dot_codes_problems(w)
    if w.unpacked.dim() != 2:
        return [f"codes must be 2-D [out, in], got shape {tuple(w.unpacked.shape)}"]
    n, k = w.unpacked.shape
    want = torch.int8 if w.bits == 8 else torch.uint8
    problems = [] if w.unpacked.dtype == want else [f"{w.bits}-bit codes must be {want}, got {w.unpacked.dtype}"]
    if w.group_size <= 0 or k % w.group_size:
        problems.append(f"in_features {k} is not a multiple of the group size {w.group_size}")
        return problems
    groups = (n, k // w.group_size)
    for name, t in (("scale", w.scale), ("zero", w.zero)):
        if t is not None and (tuple(t.shape) != groups or t.dtype != torch.float32):
            problems.append(f"{name} must be float32 {list(groups)}, got {t.dtype} {list(t.shape)}")
    if (w.bits == 4) != (w.zero is not None):
        problems.append("4-bit weights need a zero tensor, 8-bit weights take none")
    return problems


def _dot_codes_problems(w: QuantizedWeight) -> list[str]:
    """What is wrong with a weight held only as `dot_codes` (its K is the scales' groups times the group size)."""
    if w.dot_codes is None:
        return ["a quantized weight needs its codes: unpacked (q) or in int8_dot's layout (dot_codes)"]
    if w.group_size <= 0 or w.group_size % DOT_BLOCK or w.scale.dim() != 2:
        return [f"dot_codes need groups of {DOT_BLOCK}k and 2-D scales, got {w.group_size}, {w.scale.dim()}-D"]
    blocks = w.scale.shape[1] * w.group_size // DOT_BLOCK
    width = (blocks + blocks % 2) * DOT_BLOCK * w.bits // 8
    want = (w.scale.shape[0], width)
    if w.dot_codes.dtype != torch.uint8 or tuple(w.dot_codes.shape) != want:
        return [f"dot_codes must be uint8 {list(want)}, got {w.dot_codes.dtype} {list(w.dot_codes.shape)}"]
    zero_ok = (w.bits == 4) == (w.zero is not None) and (w.zero is None or w.zero.shape == w.scale.shape)
    return [] if zero_ok else ["4-bit weights need a zero tensor shaped as scale, 8-bit weights take none"]


def codes_from_dot_layout(codes: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """The codes `q` [R, K] (int8 for 8 bits, 0..15 for 4) of rows held in int8_dot's layout (codes [R, padded
    bytes]: kernels._dot_layout's inverse)."""
    if bits == 8:
        q = (codes ^ 0x80).view(torch.int8)  # u = q + 128 as bits (two's complement)
    else:
        pairs = codes.view(codes.shape[0], -1, 1, DOT_BLOCK)
        q = torch.cat([pairs & 0x0F, pairs >> 4], dim=2).reshape(codes.shape[0], -1)
    return q if q.shape[1] == k else q[:, :k].contiguous()  # an odd block count was padded with a zero block


def _groups_of(t: torch.Tensor, name: str, k: int, group: int) -> torch.Tensor:
    """`t` as float32 [N, k // group], or a ConfigError naming the GGUF block layout expected."""
    if t.dim() != 2 or t.shape[1] * group != k:
        raise ConfigError(f"{name} must be [N, K // {group}] = [N, {k // group}], got {list(t.shape)}")
    if not t.is_floating_point():
        raise ConfigError(f"{name} must be a float tensor (GGUF stores fp16), got {t.dtype}")
    return t.to(torch.float32).contiguous()


def _check_k(q: torch.Tensor, kind: str) -> int:
    if q.dim() != 2:
        raise ConfigError(f"{kind} codes must be 2-D [N, K], got shape {list(q.shape)}")
    k = q.shape[1]
    if k % GGUF_GROUP:
        raise ConfigError(f"{kind}: K = {k} is not a multiple of its block size {GGUF_GROUP}")
    return k


def from_q8_0(q: torch.Tensor, scale: torch.Tensor) -> QuantizedWeight:
    """GGUF Q8_0: q int8 [N, K], scale [N, K // 32]; value = q * scale."""
    k = _check_k(q, "Q8_0")
    if q.dtype != torch.int8:
        raise ConfigError(f"Q8_0 codes must be int8, got {q.dtype}")
    s = _groups_of(scale, "Q8_0 scale", k, GGUF_GROUP)
    return QuantizedWeight(8, GGUF_GROUP, q.contiguous(), s, None, "GGUF Q8_0")


def from_q4_0(q: torch.Tensor, scale: torch.Tensor) -> QuantizedWeight:
    """GGUF Q4_0: q uint8 nibble values 0..15 [N, K], scale [N, K // 32]; value = (q - 8) * scale."""
    k = _check_nibbles(q, "Q4_0")
    s = _groups_of(scale, "Q4_0 scale", k, GGUF_GROUP)
    return QuantizedWeight(4, GGUF_GROUP, q.contiguous(), s, torch.zeros_like(s), "GGUF Q4_0")


def from_q4_1(q: torch.Tensor, scale: torch.Tensor, min: torch.Tensor) -> QuantizedWeight:
    """GGUF Q4_1: q uint8 nibble values 0..15 [N, K], scale and min [N, K // 32]; value = q * scale + min."""
    k = _check_nibbles(q, "Q4_1")
    s = _groups_of(scale, "Q4_1 scale", k, GGUF_GROUP)
    m = _groups_of(min, "Q4_1 min", k, GGUF_GROUP)
    return QuantizedWeight(4, GGUF_GROUP, q.contiguous(), s, m + 8 * s, "GGUF Q4_1")


def _check_nibbles(q: torch.Tensor, kind: str) -> int:
    k = _check_k(q, kind)
    if q.dtype != torch.uint8:
        raise ConfigError(f"{kind} codes must be uint8 nibble values 0..15 (one per weight), got {q.dtype}")
    if q.numel() and int(q.max()) > 15:
        raise ConfigError(f"{kind} codes must be nibble values 0..15, found {int(q.max())}")
    return k


def quantize(weight: torch.Tensor, bits: int, group_size: int | None = None, *, source: str = "") -> QuantizedWeight:
    """Quantize a float weight [N, K]: 8-bit symmetric, 4-bit asymmetric (min/max), per group of
    `group_size` along K (None: one group per row). Also the nearest form for K-quants: dequantize, then this."""
    if bits not in BITS:
        raise ConfigError(f"cannot quantize to {bits} bits: supported widths are {BITS}")
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ConfigError(f"quantize takes a float [N, K] weight, got {weight.dtype} {list(weight.shape)}")
    n, k = weight.shape
    group = k if group_size is None else group_size
    if group <= 0 or k % group:
        raise ConfigError(f"in_features {k} is not a multiple of the group size {group}: choose a divisor of {k}")
    blocks = weight.detach().float().reshape(n, k // group, group)
    label = source or f"{bits}-bit from {weight.dtype} ({'per-channel' if group == k else f'groups of {group}'})"
    if bits == 8:
        scale = blocks.abs().amax(-1).clamp(min=1e-12) / 127
        q = torch.round(blocks / scale[..., None]).clamp(-127, 127).to(torch.int8)
        return QuantizedWeight(8, group, q.reshape(n, k), scale, None, label)
    lo, hi = blocks.amin(-1), blocks.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    q = torch.round((blocks - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8)
    return QuantizedWeight(4, group, q.reshape(n, k), scale, lo + 8 * scale, label)
