"""CPU kernels for quantized linears, each with capability declarations answerable without a weight.

Every kernel declares the weight widths and group sizes it runs, the activation dtype it computes in
and the CPU features it needs; `is_available()` says whether this machine and torch build can run it
and `failures(req)` lists what stops it running one layer. In order of preference:

- int8_dot (kernelbay_engine.native's qdot.cpp, AVX-512 VNNI): int8 activations per block of 32 times 4- or
  8-bit codes, summed in int32, float32 in and out; llama.cpp's arithmetic. On SmolLM2-135M's layers (2-thread
  AMD EPYC, weights streamed from memory) 2.0 ms a single-row pass against 2.8 ms for torch's int4 op, and its
  Q8_0 head 0.7 against 1.1 ms (benchmarks/quant_kernels.py --sections kernels; in the step:
  benchmarks/decode_step.py --compare-kernels int8_dot);
- torch's int8 / int4 CPU ops (int8_channel, int4_group, int8_group): bf16 activations. With float32 or float16
  activations these ops run 20-40x slower (ATen's int4mm / int8mm kernels vectorize bf16 only on x86:
  benchmarks/quant_kernels.py), so they compute in bf16;
- dense: the codes dequantized once (any width).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kernelbay.errors import ConfigError
from kernelbay_engine.quant.weights import DOT_BLOCK, QuantizedWeight, codes_from_dot_layout

INT4_GROUPS = (32, 64, 128, 256)  # what aten's int4 CPU kernel accepts as qGroupSize
_INT4_ROWS = 16  # its packing needs N divisible by 16: other N are padded with zero rows
_PACK_ROWS = 128  # rows packed at a time (a multiple of _INT4_ROWS)
BF16_FEATURES = ("avx512_bf16", "amx_bf16")
COMPUTES_IN = (
    "the model dtype's activations cast to bf16 and the output back; scales bf16, products summed in fp32: "
    "torch's fp32 / fp16 paths of these ops are scalar loops, 20-40x slower"
)


@dataclass(frozen=True, slots=True)
class Packed:
    """A weight as one kernel holds it: `run(x [M, K] in compute_dtype) -> [M, N]`, and the bytes it reads."""

    run: Callable[[torch.Tensor], torch.Tensor]
    nbytes: int
    native: tuple | None = None
    """int8_dot: (codes, d, m, bits, out_features), what native code calling qdot itself takes (layers/fused.py)."""


@dataclass(frozen=True, slots=True)
class LinearRequirements:
    """What one layer asks of a kernel (hashable: selection is cached per distinct record)."""

    bits: int | None  # 8 or 4; None: a plain float weight (only the dense kernel runs it)
    group_size: int | None  # along in_features; == in_features: per output channel
    in_features: int
    out_features: int
    dtype: torch.dtype  # the model's activation dtype


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where that file does not exist)."""
    info = Path("/proc/cpuinfo")
    if not info.exists():
        return frozenset()
    for line in info.read_text().splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def _bf16_available() -> tuple[bool, str]:
    have = sorted(cpu_flags() & set(BF16_FEATURES))
    if not have:
        return False, f"the CPU lacks {' / '.join(BF16_FEATURES)}: bf16 activations would run emulated, slowly"
    return True, f"bf16 activations on {', '.join(have)} ({COMPUTES_IN})"


def _op_available(*names: str) -> tuple[bool, str]:
    missing = [n for n in names if not hasattr(torch.ops.aten, n)]
    if missing:
        return False, f"this torch build lacks torch.ops.aten.{', '.join(missing)}"
    return True, ""


class LinearKernel:
    """Base of the kernels: declarations as class attributes, `pack` turns a weight into a callable."""

    name = ""
    bits: tuple[int | None, ...] = ()
    group_sizes: tuple[int, ...] | None = None  # None: per output channel only
    per_channel = False  # also runs group_size == in_features
    ops: tuple[str, ...] = ()
    compute_dtype = torch.bfloat16

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        ok, why = _op_available(*cls.ops)
        return (ok, why) if not ok else _bf16_available()

    @classmethod
    def failures(cls, req: LinearRequirements) -> list[str]:
        if req.bits not in cls.bits:
            return [f"{_width(req.bits)} weights: it runs {'/'.join(map(str, cls.bits))}-bit ones"]
        channel = req.group_size == req.in_features
        if channel and cls.per_channel:
            return []
        if req.group_size not in (cls.group_sizes or ()):
            return [f"group size {_group(req)}: it supports {cls.supported_groups()}"]
        return []

    @classmethod
    def supported_groups(cls) -> str:
        parts = [f"groups of {'/'.join(map(str, cls.group_sizes))}"] if cls.group_sizes else []
        return " or ".join(parts + (["per-channel scales"] if cls.per_channel else []))

    @classmethod
    def pack(cls, weight: QuantizedWeight) -> Packed:
        raise NotImplementedError


def _width(bits: int | None) -> str:
    return "float" if bits is None else f"{bits}-bit"


def _group(req: LinearRequirements) -> str:
    return "per-channel" if req.group_size == req.in_features else str(req.group_size)


class Int8ChannelKernel(LinearKernel):
    """torch.ops.aten._weight_int8pack_mm: int8 codes [N, K] with one scale per output row."""

    name = "int8_channel"
    bits = (8,)
    per_channel = True
    ops = ("_weight_int8pack_mm",)

    @classmethod
    def pack(cls, weight: QuantizedWeight) -> Packed:
        q, scale, mm = weight.q, weight.scale[:, 0].to(cls.compute_dtype), torch._weight_int8pack_mm
        return Packed(lambda x: mm(x, q, scale), q.numel() + scale.numel() * 2)


class Int4GroupKernel(LinearKernel):
    """torch.ops.aten._weight_int4pack_mm_for_cpu: nibbles packed two per byte, per-group scale and zero."""

    name = "int4_group"
    bits = (4,)
    group_sizes = INT4_GROUPS
    ops = ("_weight_int4pack_mm_for_cpu", "_convert_weight_to_int4pack_for_cpu")

    @classmethod
    def pack(cls, weight: QuantizedWeight) -> Packed:
        q = weight.q
        return _int4_pack(lambda a, b: q[a:b], weight.scale, weight.zero, weight.group_size)


class Int8GroupKernel(Int4GroupKernel):
    """Groupwise int8 (GGUF Q8_0) on the int4 kernel, exactly: q = 16 * hi + lo splits each code into two
    nibbles, [x, x] @ [W_hi | W_lo]^T with scales 16 * scale (hi) and scale, zero 8 * scale (lo). The
    bytes streamed equal int8's; torch has no groupwise int8 CPU op."""

    name = "int8_group"
    bits = (8,)

    @classmethod
    def pack(cls, weight: QuantizedWeight) -> Packed:
        q = weight.q  # int8 shifts and masks, a row chunk at a time: no wider copy of a large weight

        def planes(a: int, b: int) -> torch.Tensor:  # hi in 0..15 after the +8 bias, lo in 0..15
            return torch.cat([(q[a:b] >> 4) + 8, q[a:b] & 15], dim=1)

        scale = torch.cat([16 * weight.scale, weight.scale], dim=1)
        zero = torch.cat([torch.zeros_like(weight.scale), 8 * weight.scale], dim=1)
        packed = _int4_pack(planes, scale, zero, weight.group_size)
        return Packed(lambda x: packed.run(torch.cat([x, x], dim=-1)), packed.nbytes)


def _int4_pack(codes_of: Callable[[int, int], torch.Tensor], scale, zero, group: int) -> Packed:
    """`codes_of(a, b)`: the 0..15 codes of rows [a, b), built a chunk at a time: the op takes int32 codes, so
    packing bounds that 4-byte copy (and any code transform) to _PACK_ROWS rows; rows pack independently."""
    (n, groups), k = scale.shape, scale.shape[1] * group
    rows = n + -n % _INT4_ROWS  # zero rows past n (codes 8, scale 0) give zero outputs, sliced off
    packed = torch.empty(rows, k // 2, dtype=torch.uint8)
    for a in range(0, rows, _PACK_ROWS):
        b = min(a + _PACK_ROWS, rows)
        chunk = codes_of(a, min(b, n)).to(torch.int32)
        if b > n:
            chunk = torch.cat([chunk, torch.full((b - n, k), 8, dtype=torch.int32)])
        packed[a:b] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(chunk, 1)
    scales_zeros = torch.zeros(groups, rows, 2, dtype=torch.bfloat16)  # [K/g, N, 2], written in place
    scales_zeros[:, :n, 0], scales_zeros[:, :n, 1] = scale.t(), zero.t()

    mm = torch._weight_int4pack_mm_for_cpu  # the torch.* binding: ~1 us a call less than torch.ops.aten's

    def run(x):
        y = mm(x, packed, group, scales_zeros)
        return y[..., :n] if rows != n else y

    return Packed(run, packed.numel() + scales_zeros.numel() * 2)


_DOT_PACK_ROWS = 4096  # rows converted at a time (bounds the int16 copy of a large 8-bit weight)


class NativeDotKernel(LinearKernel):
    """int8 activations (one scale per block of 32, as llama.cpp's Q8_1) times 4- or 8-bit weights on AVX-512
    VNNI (kernelbay_engine.native's qdot.cpp): products summed exactly in int32, float32 in and out, no casts.
    What it computes: the weights the codes stand for (scales as fp16, as GGUF stores them) dotted with the
    activations rounded to int8 per block; bytes streamed as GGUF Q4_1 / Q8_0 hold them."""

    name = "int8_dot"
    bits = (4, 8)
    per_channel = True
    compute_dtype = torch.float32

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        from kernelbay_engine import native

        module = native.ops()
        if module is None:
            return False, native.status()
        if not module.qdot_supported():
            return False, "the CPU lacks AVX-512 VNNI (avx512f, avx512bw, avx512vl, avx512_vnni, f16c)"
        return True, "int8 activations per block of 32 on AVX-512 VNNI, float32 in and out"

    @classmethod
    def failures(cls, req: LinearRequirements) -> list[str]:
        if req.bits not in cls.bits:
            return [f"{_width(req.bits)} weights: it runs 4/8-bit ones"]
        if req.group_size is None or req.group_size % DOT_BLOCK or req.in_features % DOT_BLOCK:
            return [f"group size {_group(req)} (K = {req.in_features}): it needs groups a multiple of {DOT_BLOCK}"]
        return []

    @classmethod
    def supported_groups(cls) -> str:
        return f"groups (or rows) a multiple of {DOT_BLOCK}"

    @classmethod
    def pack(cls, weight: QuantizedWeight) -> Packed:
        from kernelbay_engine import native

        codes, d, m = _dot_layout(weight)
        qdot, bits = native.ops().qdot, weight.bits  # type: ignore[union-attr]  # is_available said it loads
        nbytes = codes.numel() + d.numel() * 2 + m.numel() * 2

        def run(x: torch.Tensor) -> torch.Tensor:  # qdot reads rows in place: a strided view is copied first
            return qdot(x if x.is_contiguous() else x.contiguous(), codes, d, m, bits)

        return Packed(run, nbytes, (codes, d, m, bits, weight.out_features))


def _dot_layout(w: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qdot.cpp's layout: unsigned codes u (w = d * u + m per block of 32, d and m fp16 [N, K / 32]), blocks in pairs
    (the codes padded to an even block count with a zero block); 4-bit pairs as 32 bytes (byte i = u[2j, i] |
    u[2j + 1, i] << 4), 8-bit as 64."""
    n, k = w.out_features, w.in_features
    blocks = k // DOT_BLOCK
    padded = blocks + blocks % 2
    per_block = w.group_size // DOT_BLOCK
    scale, zero = w.scale, w.zero  # per block of 32 already (GGUF's blocks): no copies
    if per_block > 1:
        scale = scale.repeat_interleave(per_block, dim=1)
        zero = zero.repeat_interleave(per_block, dim=1) if zero is not None else None
    # 4-bit: (u - 8) * scale + zero; 8-bit: u = q + 128, so q * scale = u * scale - 128 * scale
    offset = zero - 8 * scale if zero is not None else -128 * scale
    d, m = scale.to(torch.float16), offset.to(torch.float16)
    if not _all_finite(d, m):
        raise ConfigError(
            f"a {w.bits}-bit weight [{n}, {k}] ({w.source}) has scales beyond float16's range: the int8_dot kernel "
            f"cannot hold it; choose another linear kernel ({', '.join(KERNEL_NAMES)})"
        )
    if w.dot_codes is not None:  # built straight from a file's blocks
        return w.dot_codes, d, m
    if padded == blocks:  # no padding block: whole-tensor ops, one allocation each (no per-chunk page faults)
        return _dot_codes(w.q, w.bits, blocks), d, m
    codes = torch.empty(n, padded * DOT_BLOCK * w.bits // 8, dtype=torch.uint8)  # every byte written below
    for a in range(0, n, _DOT_PACK_ROWS):
        b = min(a + _DOT_PACK_ROWS, n)
        u = w.q[a:b] if w.bits == 4 else w.q[a:b].view(torch.uint8) ^ 0x80  # q + 128, as bits: two's complement
        u = torch.nn.functional.pad(u.view(b - a, blocks, DOT_BLOCK), (0, 0, 0, padded - blocks))
        if w.bits == 4:
            pairs = u.view(b - a, padded // 2, 2, DOT_BLOCK)
            u = pairs[:, :, 0] | (pairs[:, :, 1] << 4)
        codes[a:b] = u.reshape(b - a, -1)
    return codes, d, m


def _all_finite(d: torch.Tensor, m: torch.Tensor) -> bool:
    """Whether every float16 value of both is finite: their float32 sum is (|x| <= 65504 each, no sum of real values
    reaches float32's 3.4e38; a NaN or inf carries through). 16 us where isfinite().all() takes 120 (a load: 121)."""
    return bool(torch.isfinite(d.sum(dtype=torch.float32) + m.sum(dtype=torch.float32)))


def _dot_codes(q: torch.Tensor, bits: int, blocks: int) -> torch.Tensor:
    """qdot.cpp's codes of `q` [N, K] when its K // 32 blocks pair up exactly (see _dot_layout)."""
    if bits == 8:
        return q.contiguous().view(torch.uint8) ^ 0x80  # q + 128 as bits (two's complement)
    pairs = q.contiguous().view(q.shape[0], blocks // 2, 2, DOT_BLOCK)
    return (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(q.shape[0], -1)


def dot_code_rows(native: tuple, rows: torch.Tensor) -> torch.Tensor:
    """The codes `q` [R, K] (QuantizedWeight's: int8 for 8 bits, 0..15 for 4) of `rows` of a weight held in qdot.cpp's
    layout (`Packed.native` of int8_dot: codes, d, m, bits, N), read back from those rows alone (_dot_layout's
    inverse): a tied embedding table looks its rows up in the LM head's codes instead of holding a copy."""
    codes, d, _, bits, _ = native
    return codes_from_dot_layout(codes.index_select(0, rows), bits, d.shape[1] * DOT_BLOCK)


def dot_scale_rows(native: tuple, rows: torch.Tensor) -> torch.Tensor:
    """The float32 scales [R, K // 32] of `rows` of a weight held in qdot.cpp's layout, from its float16 `d`: where
    `holds_scales` says d holds the weight's scales exactly, a tied table reads them there instead of a copy."""
    return native[1].index_select(0, rows).float()


def holds_scales(native: tuple, scale: torch.Tensor) -> bool:
    """Whether qdot.cpp's float16 `d` (`Packed.native` of int8_dot) is `scale` [N, K // 32] exactly: a GGUF file's
    blocks (float16 scales, one per block of 32), not scales float16 rounds or groups it repeats."""
    d = native[1]
    return d.shape == scale.shape and torch.equal(d.float(), scale)


class DenseKernel(LinearKernel):
    """The codes dequantized once to the model dtype (oneDNN-packed where possible): any width and group,
    at 2-8x the bytes. The nearest supported form when no quantized kernel runs a layer."""

    name = "dense"
    bits = (4, 8, None)

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        return True, "plain torch"

    @classmethod
    def failures(cls, req: LinearRequirements) -> list[str]:
        return []

    @classmethod
    def pack(cls, weight: QuantizedWeight) -> Packed:
        raise TypeError("the dense kernel holds plain weights: the layer gets an UnquantizedLinearMethod")


KERNELS: tuple[type[LinearKernel], ...] = (
    NativeDotKernel,
    Int8ChannelKernel,
    Int4GroupKernel,
    Int8GroupKernel,
    DenseKernel,
)
"""In order of preference: the first capable and available one runs a layer."""
KERNEL_NAMES = tuple(k.name for k in KERNELS)
