"""CPU weight prepacking: oneDNN's blocked weight layout for the linear layers where it is faster.

MKL's `F.linear` runs the few-row products of decoding far below this CPU's GEMM peak (an LM head
`[8, 512] x [512, 32000]` reached ~12 GFLOP/s where a square GEMM reaches ~85). oneDNN with the
weight reordered once into its blocked layout (`torch.ops.mkldnn._reorder_linear_weight`, the
format inductor's CPU freezing pass uses; vLLM's CPU path does the same with its own oneDNN
binding) ran the same product 2-3x faster. Packing is decided per layer shape by timing both forms
at the row counts the engine will run (weight evicted from cache first), and the dense weight is
released afterwards, so weights are held once. Measured on a 206 MB fp32 model: steady RSS +29 MiB
(allocator and oneDNN caches), and a transient +150 MiB while timing (a 64 MiB cache-flush buffer
and one packed trial copy). A weight shared with another module is left dense (releasing it is
impossible), except the tied LM head: its product is the largest of a decode step (SmolLM2-135M: 30% of
it dense), so it is packed as a second copy and the embedding keeps the dense table (+vocab x hidden x
dtype bytes). bfloat16 weights are packed too where the CPU has native bf16 (avx512_bf16 / amx_bf16).

    report = prepack_linear_weights(model, rows=(1, 8))       # "auto": measured per shape
    report = prepack_linear_weights(model, rows=(1,), policy="always")

A model whose own code reads a layer's weight tensor (rather than calling the layer) lists that
layer's path in a `prepack_exclude` class attribute, so it stays dense.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.layers.matmul import linear as dense_linear
from kernelbay_engine.models.quant import LinearMethod, UnquantizedLinearMethod

POLICIES = ("auto", "always", "never")
# Below this many weight elements a matmul costs microseconds and its form does not matter.
MIN_AUTO_NUMEL = 1 << 18
_TRIALS = 5
# Packed wins unless dense is this much faster alone: in a model the packed form also fuses the residual add
# (apply_add) and pays less per call with the cache full of other weights. SmolLM2-135M fp32: its 576x576 and
# 576x1536 layers timed within noise of dense alone (0.10 vs 0.10 ms), and a load that left them dense ran
# its decode step at 21.4 ms against 17.0-19.5 ms packed.
PACKED_MARGIN = 1.15
# Timed calls start with the weight out of cache, as in a model whose weights exceed the last-level
# cache (the case where the form matters): a buffer this large is read before each call.
_FLUSH_BYTES = 64 << 20


class PackedLinearMethod(LinearMethod):
    """Applies a plain weight held in oneDNN's blocked layout (an opaque mkldnn tensor)."""

    def __init__(self, packed: torch.Tensor):
        self.packed = packed
        ops = torch.ops.mkldnn._linear_pointwise  # the overloads, not the packet: it resolves one per call
        self._linear, self._linear_add = ops.default, ops.binary

    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        raise RuntimeError("PackedLinearMethod is set by prepack_linear_weights on loaded layers only")

    def param_names(self, layer: Linear) -> tuple[str, ...]:
        return ("bias",) if layer.has_bias else ()

    def weight(self, layer: Linear, index=None) -> torch.Tensor:
        if index is not None:
            raise ValueError("a packed weight has no expert dimension")
        return self.packed.to_dense()  # rare (tests, code reading weights): a fresh [out, in] copy

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        bias = layer.bias if layer.has_bias else None
        return self._linear(x, self.packed, bias, "none", [], "")

    def apply_add(self, layer: Linear, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        # oneDNN's binary post-op adds the residual to the fp32 result before it is written: in float32 the same
        # bits as a separate add (in bf16 one rounding instead of two: not fused), one call fewer (the output
        # projections of each block, 60 a SmolLM2 step).
        fused = not layer.has_bias and x.dim() == 2 and residual.dtype == x.dtype == torch.float32
        if not fused or residual.shape != (x.shape[0], layer.out_features):
            return residual + self.apply(layer, x)
        return self._linear_add(x, residual, self.packed, None, "add")

    def __repr__(self) -> str:
        return "PackedLinearMethod(onednn)"


@dataclass
class PrepackReport:
    """What `prepack_linear_weights` did: packed layer paths, and why every other candidate was not packed."""

    packed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    timings_ms: dict[tuple, tuple[float, float]] = field(default_factory=dict)
    """(out, in, bias) -> (dense ms, packed ms) summed over the measured row counts."""


def prepacking_available() -> tuple[bool, str]:
    if not torch.backends.mkldnn.is_available():
        return False, "this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False, "this torch build lacks torch.ops.mkldnn._linear_pointwise"
    return True, "oneDNN available"


def prepack_linear_weights(model: nn.Module, *, rows: Sequence[int], policy: str = "auto") -> PrepackReport:
    """Pack the plain 2-D CPU weights of `model`'s `Linear` layers where `policy` says so.

    rows: the row counts the model will run (e.g. 1 and the decode batch); "auto" packs a layer when
    packed is faster summed over them, or within PACKED_MARGIN of dense. Call after the weights are loaded; a packed
    layer cannot load again.
    """
    if policy not in POLICIES:
        raise ValueError(f"prepack policy must be one of {', '.join(POLICIES)}; got {policy!r}")
    report = PrepackReport()
    if policy == "never":
        return report
    ok, reason = prepacking_available()
    shared = _shared_parameters(model)
    shared.discard(id(getattr(getattr(model, "lm_head", None), "weight", None)))  # packed as a copy: see above
    kept = tuple(getattr(model, "prepack_exclude", ()))
    candidates = []  # (path, layer, shape key) of every eligible layer
    for path, layer in model.named_modules():
        if isinstance(layer, Linear):
            why_not = reason if not ok else _ineligible(layer, shared)
            if why_not is None and path in kept:
                why_not = "the model reads this weight itself (listed in its prepack_exclude)"
            if why_not is None:
                candidates.append((path, layer, (layer.out_features, layer.in_features, layer.has_bias)))
            else:
                report.skipped[path] = why_not
    decisions = _decide_shapes(candidates, rows, policy, report)  # every timing before any packing
    for path, layer, key in candidates:
        why_not = decisions[key] if isinstance(decisions[key], str) else _pack(layer)
        if why_not is None:
            report.packed.append(path)
        else:
            report.skipped[path] = why_not
    return report


def _decide_shapes(candidates, rows, policy: str, report: PrepackReport) -> dict[tuple, bool | str]:
    """One decision per distinct (out, in, bias), timed on the first layer of that shape."""
    decisions: dict[tuple, bool | str] = {}
    flush = torch.ones(_FLUSH_BYTES // 4) if policy == "auto" and candidates else None
    for _, layer, key in candidates:
        if key not in decisions:
            decisions[key] = _decide(layer, rows, policy, report, flush)
    return decisions


def _shared_parameters(model: nn.Module) -> set[int]:
    counts = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    return {key for key, n in counts.items() if n > 1}


def _ineligible(layer: Linear, shared: set[int]) -> str | None:
    if type(layer.method) is not UnquantizedLinearMethod:
        return f"weights are {layer.method!r}, only plain weights are packed"
    if layer.batch_shape:  # before reading the weight: a repacked MoE layer released it (layers/moe.py)
        return "per-expert weights (batch_shape) are not packed"
    w = layer.weight
    if w.device.type != "cpu" or w.is_meta:
        return f"weight is on {w.device}, packing is for CPU"
    if w.dtype not in _packed_dtypes():
        return f"weight dtype {w.dtype}: packing is used for {' and '.join(map(str, _packed_dtypes()))} only"
    if id(w) in shared:
        return "weight is shared with another module (tied), so it stays dense"
    return None


def _packed_dtypes() -> tuple[torch.dtype, ...]:
    from kernelbay_engine.quant.kernels import BF16_FEATURES, cpu_flags

    return (torch.float32, torch.bfloat16) if cpu_flags() & set(BF16_FEATURES) else (torch.float32,)


def _decide(
    layer: Linear, rows: Sequence[int], policy: str, report: PrepackReport, flush: torch.Tensor | None
) -> bool | str:
    if policy == "always":
        return True
    if layer.weight.numel() < MIN_AUTO_NUMEL:
        return f"weight has {layer.weight.numel()} elements, below {MIN_AUTO_NUMEL}: too small to matter"
    try:
        packed = _reorder(layer.weight)
    except RuntimeError as exc:
        return f"oneDNN cannot pack it here: {exc}"
    bias = layer.bias if layer.has_bias else None
    dense_ms = packed_ms = 0.0
    for n in sorted(set(rows)):
        x = torch.randn(n, layer.in_features, dtype=layer.weight.dtype)
        dense_ms += _best_ms(partial(dense_linear, x, layer.weight, bias), flush)
        packed_ms += _best_ms(partial(torch.ops.mkldnn._linear_pointwise, x, packed, bias, "none", [], ""), flush)
    report.timings_ms[(layer.out_features, layer.in_features, layer.has_bias)] = (dense_ms, packed_ms)
    if packed_ms < dense_ms * PACKED_MARGIN:
        return True
    return (
        f"measured slower packed ({packed_ms:.3f} ms) than dense ({dense_ms:.3f} ms) at rows {tuple(rows)}, "
        f"beyond the {PACKED_MARGIN:.2f}x margin packing gets"
    )


def _pack(layer: Linear) -> str | None:
    try:
        packed = _reorder(layer.weight)
    except RuntimeError as exc:
        return f"oneDNN cannot pack it here: {exc}"
    layer.method = PackedLinearMethod(packed)
    del layer.weight  # the dense copy goes: weights are held once (a tied table stays the embedding's)
    return None


def _reorder(weight: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 8)


def _best_ms(fn, flush: torch.Tensor, trials: int = _TRIALS) -> float:
    """Best of `trials` calls, each with the weight evicted from cache first (reading `flush`)."""
    with torch.inference_mode():
        fn()  # first-call setup (oneDNN primitive creation) is not what a step pays
        best = float("inf")
        for _ in range(trials):
            flush.sum()
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
    return best * 1e3
