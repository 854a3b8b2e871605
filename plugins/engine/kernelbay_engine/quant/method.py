"""`QuantizedLinearMethod` and `quantize_model`: loaded float layers (or GGUF blocks) onto the quantized kernels.

report = quantize_model(model, "int8")          # every plain 2-D Linear, the LM head included
set_quantized_weight(layer, from_q4_1(q, d, m))  # one layer from GGUF blocks (the GGUF loader)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from kernelbay.errors import ConfigError
from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.models.quant import LinearMethod, UnquantizedLinearMethod
from kernelbay_engine.quant.kernels import LinearRequirements
from kernelbay_engine.quant.select import KernelChoice, select_kernel
from kernelbay_engine.quant.weights import QuantizedWeight, quantize


@dataclass(frozen=True, slots=True)
class QuantMode:
    """What `--quantization NAME` does to a float checkpoint's linears."""

    name: str
    bits: int
    group_size: int | None  # None: per output channel
    head_bits: int  # the LM head: llama.cpp's files keep it at 6-8 bits too, int4 hurts the logits most
    head_group_size: int | None = None


MODES = {
    # groups of 32 as GGUF's Q8_0: per-channel scales lost 3x the perplexity on SmolLM2 (benchmarks/perplexity.py)
    "int8": QuantMode("int8", 8, 32, 8, 32),
    "int8-channel": QuantMode("int8-channel", 8, None, 8),  # one scale per output row: torch's int8 op can run it
    "int4": QuantMode("int4", 4, 32, 8),
}


def quant_mode(name: str) -> QuantMode:
    if name not in MODES:
        raise ConfigError(f"unknown quantization {name!r}: valid values are {', '.join(MODES)} (or None)")
    return MODES[name]


class QuantizedLinearMethod(LinearMethod):
    """Applies a weight held by a quantized kernel; activations are cast to the kernel's dtype and back."""

    holds_weight = True  # the loader reads no checkpoint tensor into such a layer's weight (loading/plan.py)

    def __init__(self, choice: KernelChoice, weight: QuantizedWeight):
        self.choice = choice
        self.kernel = choice.kernel
        self.compute_dtype = choice.kernel.compute_dtype  # Linear.compute_dtype: what the product runs in
        self.source = weight.source
        packed = choice.kernel.pack(weight)
        self.run, self.nbytes = packed.run, packed.nbytes  # nbytes: what one product reads (benchmarks)
        self.native = packed.native  # the packed tensors native code runs (int8_dot only; layers/fused.py)
        self.shape = (weight.out_features, weight.in_features)

    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        raise RuntimeError("QuantizedLinearMethod is set on loaded layers only (quantize_model)")

    def param_names(self, layer: Linear) -> tuple[str, ...]:
        return ("bias",) if layer.has_bias else ()

    def weight(self, layer: Linear, index=None) -> torch.Tensor:
        """The weight as the kernel computes it (rare: tests, code reading weights): the kernel run on I."""
        if index is not None:
            raise ValueError("a quantized weight has no expert dimension")
        eye = torch.eye(self.shape[1], dtype=self.compute_dtype)
        return self.run(eye).t().float()

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        """x W^T in the kernel's dtype, any leading dims. A decode step runs ~120 of these: each call skipped
        when not needed (a reshape of 2-D input, a same-dtype cast) is ~2-5 us saved."""
        flat = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        y = self.run(flat if flat.dtype == self.compute_dtype else flat.to(self.compute_dtype))
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], y.shape[-1])

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        y = self._product(x)
        y = y if y.dtype == x.dtype else y.to(x.dtype)
        return y + layer.bias if layer.has_bias else y

    def apply_native(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        y = self._product(x)
        return y + layer.bias.to(self.compute_dtype) if layer.has_bias else y

    def apply_add(self, layer: Linear, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        # float32 + bf16 promotes the kernel's output exactly as its cast back would: one call a layer fewer.
        if layer.has_bias or residual.dtype != torch.float32:
            return residual + self.apply(layer, x)
        return residual + self._product(x)

    def __repr__(self) -> str:
        return f"QuantizedLinearMethod({self.kernel.name}, {self.source})"


def requirements(weight: QuantizedWeight, dtype: torch.dtype) -> LinearRequirements:
    return LinearRequirements(weight.bits, weight.group_size, weight.in_features, weight.out_features, dtype)


def set_quantized_weight(layer: Linear, weight: QuantizedWeight, *, kernel: str | None = None) -> KernelChoice:
    """Give `layer` the quantized `weight` on the kernel selected for it (`kernel`: one requested by name)."""
    if layer.batch_shape:
        raise ConfigError(f"{layer!r}: per-expert weights (batch_shape) have no quantized kernel")
    if (weight.out_features, weight.in_features) != (layer.out_features, layer.in_features):
        raise ConfigError(
            f"quantized weight is [{weight.out_features}, {weight.in_features}], "
            f"the layer needs [{layer.out_features}, {layer.in_features}]"
        )
    dtype = _layer_dtype(layer)
    choice = select_kernel(requirements(weight, dtype), kernel)
    if choice.kernel.name == "dense":
        _set_plain(layer, weight.dequantize(dtype))
    else:
        layer.method = QuantizedLinearMethod(choice, weight)
        if "weight" in layer._parameters:
            del layer.weight  # held once, by the kernel (a tied embedding keeps its own reference)
    return choice


def _layer_dtype(layer: Linear) -> torch.dtype:
    w = layer._parameters.get("weight")
    if w is not None:
        return w.dtype
    bias = layer._parameters.get("bias")
    return bias.dtype if bias is not None else torch.get_default_dtype()


DEQUANTIZED = "run on dense weights: the file's codes are dequantized at load, no quantized kernel runs them here"


def dequantized_note(report: dict[str, str] | None, path) -> str | None:
    """The warning `LLM` logs when a file's codes were dequantized for want of a quantized kernel (report: what
    keep_quantized says each layer runs); None when every quantized layer runs a quantized kernel. Here, not beside
    explain's note, so a load does not import the explain package."""
    dense = [name for name, runs in (report or {}).items() if runs.endswith(" on dense")]
    if not dense:
        return None
    return (
        f"{len(dense)} linears of {path} {DEQUANTIZED} (this CPU or torch build lacks them; "
        f"`kernelbay explain {path}` lists each kernel and why it cannot run)"
    )


class DequantizedLinearMethod(UnquantizedLinearMethod):
    """Plain weights made from quantized codes (no kernel reads the codes here): the layer holds them, so a load
    after it (`quantization="gguf"` gives the codes on meta) reads nothing into them and they stay what the
    report says they are."""

    holds_weight = True  # loading/plan.py


def _set_plain(layer: Linear, weight: torch.Tensor) -> None:
    layer.method = DequantizedLinearMethod()
    layer.weight = nn.Parameter(weight, requires_grad=False)


@dataclass
class QuantReport:
    """What `quantize_model` did: layer path -> its choice, and why the others were left as they are."""

    mode: str
    chosen: dict[str, KernelChoice] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def quantize_model(model: nn.Module, mode: str, *, kernel: str | None = None) -> QuantReport:
    """Quantize every plain 2-D `Linear` of a loaded model in place (the LM head at `head_bits`)."""
    spec = quant_mode(mode)
    report = QuantReport(spec.name)
    head = getattr(model, "lm_head", None)
    for path, layer in model.named_modules():
        if not isinstance(layer, Linear):
            continue
        why_not = _not_quantizable(layer)
        if why_not:
            report.skipped[path] = why_not
            continue
        bits, group = (spec.head_bits, spec.head_group_size) if layer is head else (spec.bits, spec.group_size)
        with torch.inference_mode():
            weight = quantize(_plain_weight(layer), bits, group)
        report.chosen[path] = set_quantized_weight(layer, weight, kernel=kernel if bits == spec.bits else None)
        report.sources[path] = weight.source
    return report


def _not_quantizable(layer: Linear) -> str | None:
    if type(layer.method) is not UnquantizedLinearMethod:
        return f"weights are {layer.method!r} already"
    if layer.batch_shape:
        return "per-expert weights (batch_shape) are not quantized"
    w = _plain_weight(layer)
    if w.is_meta or w.device.type != "cpu":
        return f"weight is on {w.device}: the quantized kernels are CPU kernels"
    return None


def _plain_weight(layer: Linear) -> torch.Tensor:
    w = layer._parameters.get("weight")
    if w is None:
        raise RuntimeError(f"{layer!r} has no plain weight to quantize")
    return w
