"""CPU weight prepacking: the linear layers' weights in a layout their product streams faster.

Two packed forms: `fdot` (float32: kernelbay_engine.native's fdot.cpp, the weight as column panels of 16 outputs
read by AVX-512 FMA, one sequential stream a panel) and `onednn` (oneDNN's blocked layout; float32, and bfloat16
where the CPU has native bf16). SmolLM2-135M's 30 layers at 1 / 8 rows: fdot 10.9 / 10.8 ms, oneDNN 13.8 / 16.5,
`F.linear` 28.5 / 40.1 (benchmarks/quant_kernels.py --sections fp32); at 64 rows fdot was still the faster on every
layer shape but the LM head. oneDNN is what bf16 weights get, and any weight without the
native ops.

MKL's `F.linear` runs the few-row products of decoding far below this CPU's GEMM peak (an LM head
`[8, 512] x [512, 32000]` reached ~12 GFLOP/s where a square GEMM reaches ~85). oneDNN with the
weight reordered once into its blocked layout (`torch.ops.mkldnn._reorder_linear_weight`, the
format inductor's CPU freezing pass uses; vLLM's CPU path does the same with its own oneDNN
binding) ran the same product 2-3x faster.

The form is decided by a model of the kernels, not by timing (no trial at load, nothing cached): under "auto" a
weight of at least MIN_AUTO_NUMEL elements is packed in the first form of FORMS that can take it (fdot for float32
where the native ops run, else oneDNN's), a smaller one stays dense (its product costs microseconds in any form).
Measured on this project's reference CPU (benchmarks/RESULTS-cpu-decode.md, run 12), fdot is the fastest form at
the engine's decode row counts on every layer shape timed (1 and 8 rows) and within 8% of oneDNN at prefill's (256
to 2048 rows), and a layer on fdot takes the fused decoder halves (layers/fused.py), which one layer on another
form takes away from its whole block. Timing trials at load had decided otherwise only when the machine was busy
while they ran, and a cached trial then pinned the slower form. The dense copy is released after packing, so
weights are held once. A weight shared with another module is left dense (releasing it is
impossible), except the tied LM head: its product is the largest of a decode step (SmolLM2-135M: 30% of
it dense), so it is packed as a second copy and the embedding keeps the dense table (+vocab x hidden x
dtype bytes). bfloat16 weights are packed too where the CPU has native bf16 (avx512_bf16 / amx_bf16).

    report = prepack_linear_weights(model)       # "auto": the rule above
    report = prepack_linear_weights(model, policy="always")  # the first form of `forms` each layer takes
    report = prepack_linear_weights(model, policy="always", forms=("onednn",))

A model whose own code reads a layer's weight tensor (rather than calling the layer) lists that
layer's path in a `prepack_exclude` class attribute, so it stays dense.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.layers.matmul import linear as dense_linear
from kernelbay_engine.models.quant import LinearMethod, UnquantizedLinearMethod
from kernelbay_engine.native import tracked

POLICIES = ("auto", "always", "never")
FORMS = ("fdot", "onednn")  # the packed forms (_FORMS), in the order "always" prefers them
# The CPU flags fdot.cpp's fdot_supported() asks for, for an answer without loading the native ops (explain).
FDOT_FEATURES = ("avx512f", "fma")
NO_FDOT_CPU = "the CPU lacks AVX-512 F / FMA"
# Below this many weight elements a matmul costs microseconds and its form does not matter: "auto" leaves it dense.
MIN_AUTO_NUMEL = 1 << 18


class _PrepackedMethod(LinearMethod):
    """A plain weight held in a packed form: set on loaded layers by prepack_linear_weights, holding no parameter
    but the bias; `dense()` gives the [out, in] weight back."""

    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        raise RuntimeError(f"{type(self).__name__} is set by prepack_linear_weights on loaded layers only")

    def param_names(self, layer: Linear) -> tuple[str, ...]:
        return ("bias",) if layer.has_bias else ()

    def weight(self, layer: Linear, index=None) -> torch.Tensor:
        if index is not None:
            raise ValueError("a packed weight has no expert dimension")
        return self.dense()  # rare (tests, code reading weights): a fresh [out, in] copy

    def dense(self) -> torch.Tensor:
        raise NotImplementedError


class PackedLinearMethod(_PrepackedMethod):
    """Applies a plain weight held in oneDNN's blocked layout (an opaque mkldnn tensor)."""

    def __init__(self, packed: torch.Tensor):
        self.packed = packed
        ops = torch.ops.mkldnn._linear_pointwise  # the overloads, not the packet: it resolves one per call
        self._linear, self._linear_add = ops.default, ops.binary

    def dense(self) -> torch.Tensor:
        return self.packed.to_dense()

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


class PanelLinearMethod(_PrepackedMethod):
    """Applies a float32 weight held as fdot.cpp's panels (kernelbay_engine.native): AVX-512 FMA, float32 in and
    out. Each output is the FMA chain over K in order, so a row's result does not depend on its batch."""

    def __init__(self, weight: torch.Tensor):
        from kernelbay_engine import native

        ok, reason = fdot_available()
        if not ok:
            raise RuntimeError(f"the fdot form needs the native ops on an AVX-512 CPU: {reason}")
        ops = native.ops()
        assert ops is not None  # fdot_available loaded it
        self.out_features, self.in_features = weight.shape
        self.panels = ops.fdot_pack(weight.detach())
        self._fdot = ops.fdot
        # what native code calling fdot itself takes (layers/fused.py): qdot's (codes, d, m, bits, n) shape
        self.native = (self.panels, _UNUSED, _UNUSED, 32, self.out_features)

    def dense(self) -> torch.Tensor:
        return self.panels.transpose(1, 2).reshape(-1, self.in_features)[: self.out_features]

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        bias = layer.bias if layer.has_bias else None
        if tracked(x):  # autograd or a torch.compile trace needs aten's graph: the same product, unpacked
            return dense_linear(x, self.weight(layer), bias)
        if x.dtype != torch.float32:
            raise TypeError(f"{self!r} multiplies float32 inputs; got {x.dtype} (cast the input, or load in float32)")
        flat = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        y = self._fdot(flat if flat.is_contiguous() else flat.contiguous(), self.panels, self.out_features)
        if bias is not None:
            y += bias
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def __repr__(self) -> str:
        return "PanelLinearMethod(fdot)"


_UNUSED = torch.empty(0)


@dataclass
class PrepackReport:
    """What `prepack_linear_weights` did: packed layer paths and their forms, and why every other candidate was not
    packed."""

    packed: list[str] = field(default_factory=list)
    forms: dict[str, str] = field(default_factory=dict)  # path -> "fdot" / "onednn"
    skipped: dict[str, str] = field(default_factory=dict)


def prepacking_available() -> tuple[bool, str]:
    """Whether oneDNN's form can run (the `onednn` form)."""
    if not torch.backends.mkldnn.is_available():
        return False, "this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False, "this torch build lacks torch.ops.mkldnn._linear_pointwise"
    return True, "oneDNN available"


def fdot_available() -> tuple[bool, str]:
    """Whether fdot's form can run: the native ops loaded, on a CPU with AVX-512 F and FMA."""
    from kernelbay_engine import native

    ops = native.ops()
    if ops is None:
        return False, native.status()
    if not ops.fdot_supported():
        return False, NO_FDOT_CPU
    return True, "native fdot available"


def form_available(name: str) -> tuple[bool, str]:
    """Whether the packed form `name` (one of FORMS) can run here, and why not."""
    return _FORMS[name].available()


def prepack_linear_weights(model: nn.Module, *, policy: str = "auto", forms: Sequence[str] = FORMS) -> PrepackReport:
    """Pack the plain 2-D CPU weights of `model`'s `Linear` layers where `policy` says so, in one of `forms`.

    "auto" packs each layer whose weight has at least MIN_AUTO_NUMEL elements in the first of `forms` it can take (the
    module docstring says why, with the measurements); "always" packs every eligible layer so; "never" none. Call
    after the weights are loaded; a packed layer cannot load again.
    """
    if policy not in POLICIES:
        raise ValueError(f"prepack policy must be one of {', '.join(POLICIES)}; got {policy!r}")
    unknown = [f for f in forms if f not in FORMS]
    if unknown or not forms:
        raise ValueError(f"prepack forms must be some of {', '.join(FORMS)}; got {tuple(forms)!r}")
    report = PrepackReport()
    if policy == "never":
        return report
    available = {name: form_available(name) for name in forms}
    shared = _shared_parameters(model)
    shared.discard(id(getattr(getattr(model, "lm_head", None), "weight", None)))  # packed as a copy: see above
    kept = tuple(getattr(model, "prepack_exclude", ()))
    for path, layer in model.named_modules():
        if not isinstance(layer, Linear):
            continue
        why_not = _ineligible(layer, shared)
        if why_not is None and path in kept:
            why_not = "the model reads this weight itself (listed in its prepack_exclude)"
        form = None
        if why_not is None:
            form, why_not = planned_form(layer.weight.dtype, layer.weight.numel(), policy, available)
        if form is not None:
            why_not = _pack(layer, form)
        if why_not is None:
            report.packed.append(path)
            report.forms[path] = form  # type: ignore[assignment]  # packed: a form
        else:
            report.skipped[path] = why_not
    return report


def planned_form(
    dtype: torch.dtype, numel: int, policy: str, available: dict[str, tuple[bool, str]] | None = None
) -> tuple[str | None, str | None]:
    """(the form a plain weight of `dtype` and `numel` elements is packed in under `policy`, None) or (None, why it
    stays dense): the rule of the module docstring. `available`: form -> form_available(form), every form by
    default (also what `kernelbay explain` asks)."""
    available = available if available is not None else {name: form_available(name) for name in FORMS}
    takes = [name for name, (ok, _) in available.items() if ok and dtype in _FORMS[name].dtypes()]
    if not takes:
        return None, "; ".join(f"{name}: {_refusal(name, dtype, available)}" for name in available)
    if policy == "auto" and numel < MIN_AUTO_NUMEL:
        return None, f"weight has {numel} elements, below {MIN_AUTO_NUMEL}: too small to matter"
    return takes[0], None


def explain_rule(dtype_name: str) -> dict:
    """`kernelbay explain`'s `prepack` section for a model whose linears keep plain `dtype_name` weights: the form
    "auto" packs them in on this machine, by the rule above. Read from the CPU's flags and torch's build, not by
    loading the native ops (explain builds no kernel), so an fdot answer holds where they load."""
    from kernelbay.dtypes import torch_dtype
    from kernelbay_engine.quant.kernels import cpu_flags

    fdot = (True, "") if set(FDOT_FEATURES) <= cpu_flags() else (False, NO_FDOT_CPU)
    available = {"fdot": fdot, "onednn": prepacking_available()}
    form, why = planned_form(torch_dtype(dtype_name), MIN_AUTO_NUMEL, "auto", available)
    if form is None:
        line = f"prepack      {dtype_name} linears stay dense: {why}"
    else:
        line = (
            f"prepack      {dtype_name} linears of {MIN_AUTO_NUMEL:,} elements or more -> {form} at load, by rule (no "
            f"timing; prepack_weights='auto'), smaller ones dense"
        )
        if form == "fdot":
            line += "; where the native ops do not load, onednn"
    return {"policy": "auto", "dtype": dtype_name, "form": form, "min_elements": MIN_AUTO_NUMEL, "lines": [line]}


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
    if id(w) in shared:
        return "weight is shared with another module (tied), so it stays dense"
    return None


def _refusal(name: str, dtype: torch.dtype, available: dict[str, tuple[bool, str]]) -> str:
    ok, reason = available[name]
    if not ok:
        return reason
    dtypes = " and ".join(map(str, _FORMS[name].dtypes()))
    return f"weight dtype {dtype}: this form packs {dtypes} only"


def _onednn_dtypes() -> tuple[torch.dtype, ...]:
    from kernelbay_engine.quant.kernels import BF16_FEATURES, cpu_flags

    return (torch.float32, torch.bfloat16) if cpu_flags() & set(BF16_FEATURES) else (torch.float32,)


@dataclass(frozen=True)
class _Form:
    available: Callable[[], tuple[bool, str]]
    dtypes: Callable[[], tuple[torch.dtype, ...]]
    method: Callable[[torch.Tensor], _PrepackedMethod]  # the packed method of a dense [out, in] weight


_FORMS = {
    "fdot": _Form(fdot_available, lambda: (torch.float32,), PanelLinearMethod),
    "onednn": _Form(prepacking_available, _onednn_dtypes, lambda w: PackedLinearMethod(_reorder(w))),
}


def _pack(layer: Linear, form: str) -> str | None:
    try:
        method = _FORMS[form].method(layer.weight)
    except RuntimeError as exc:
        return f"{form} cannot pack it here: {exc}"
    layer.method = method
    del layer.weight  # the dense copy goes: weights are held once (a tied table stays the embedding's)
    return None


def _reorder(weight: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 8)
