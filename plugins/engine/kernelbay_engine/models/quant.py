"""Per-layer weight formats: which `LinearMethod` each `Linear` gets, and the methods themselves.

Supported formats: plain weights, and FP8-e4m3 weights with 2-D block scales (`quant_method: fp8`,
`weight_block_size: [bn, bk]`, as in DeepSeek-V3 and Qwen3-FP8). FP8 weights are dequantised inside
the linear forward (activations stay in the model dtype), so they run on any CPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from kernelbay.errors import ConfigError
from kernelbay.moe import dequantize_fp8_blocks
from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.layers.matmul import linear

FP8_DTYPE = torch.float8_e4m3fn


@dataclass(frozen=True, slots=True)
class LinearQuantization:
    """How the checkpoint's linear weights are quantized (FP8 blocks or plain), resolved once from
    `ModelConfig.quantization`."""

    block_size: tuple[int, int] | None = None  # (rows, cols) of one FP8 scale block; None: plain weights
    not_converted: tuple[str, ...] = ()  # module paths kept in plain weights (dotted, matched by component)

    def __post_init__(self):
        if self.block_size is not None and (len(self.block_size) != 2 or min(self.block_size) <= 0):
            raise ConfigError(f"weight_block_size must be two positive ints, got {self.block_size}")

    @classmethod
    def from_quant_config(cls, quant) -> LinearQuantization:
        """`quant`: a `kernelbay_engine.config.QuantConfig` or None."""
        if quant is None:
            return cls()
        if getattr(quant, "quant_method", None) == "mxfp4":  # GPT-OSS: only its experts, which load as stored
            return cls()
        method, fmt = getattr(quant, "quant_method", None), getattr(quant, "element_type", None) or "e4m3"
        block = getattr(quant, "weight_block_size", None)
        if method != "fp8":  # one line: the element type and block size of another method say nothing more
            raise ConfigError(
                f"quantization_config.quant_method {method!r} cannot be loaded: only 'fp8' (block-scaled e4m3) is "
                "supported (and 'mxfp4' for GPT-OSS experts); use the unquantized checkpoint (LLM(quantization="
                "'int8' or 'int4') / --quantization quantizes it as it loads) or a supported export"
            )
        problems = []
        if fmt != "e4m3":
            problems.append(f"element type {fmt!r}: only 'e4m3' is supported")
        if not block:
            problems.append("weight_block_size is missing: per-tensor FP8 is not supported, only block scales")
        if problems:
            raise ConfigError("this checkpoint's quantization cannot be loaded", problems)
        assert block is not None  # a missing block is one of the problems above
        block_size = cast("tuple[int, int]", tuple(int(b) for b in block))  # two ints: __post_init__ checks it
        return cls(block_size, tuple(getattr(quant, "modules_to_not_convert", None) or ()))

    def excludes(self, module_path: str) -> bool:
        """True when an entry of `not_converted` names this module or one of its parents."""
        parts = module_path.split(".")
        return any(_contains_run(parts, entry.split(".")) for entry in self.not_converted)

    def method_for(self, module_path: str, layer: Linear) -> LinearMethod:
        if self.block_size is None or not layer.quantizable or self.excludes(module_path):
            return UnquantizedLinearMethod()
        return Fp8BlockLinearMethod(self.block_size)


def _contains_run(parts: list[str], run: list[str]) -> bool:
    n = len(run)
    return any(parts[i : i + n] == run for i in range(len(parts) - n + 1))


class LinearMethod:
    """How one `Linear` stores and applies its weights."""

    compute_dtype: torch.dtype | None = None  # what the product runs in whatever the input's; None: the input's

    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        raise NotImplementedError

    def param_names(self, layer: Linear) -> tuple[str, ...]:
        return ("weight", "bias") if layer.has_bias else ("weight",)

    def row_slice(self, layer: Linear, param: str, start: int, size: int, part: str) -> slice:
        """Rows of `param` that hold output rows [start, start + size) of a merged layer."""
        return slice(start, start + size)

    def weight(self, layer: Linear, index=None) -> torch.Tensor:
        w = layer.weight
        return w if index is None else w[index]

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight(layer).to(x.dtype), layer.bias if layer.has_bias else None)

    def apply_add(self, layer: Linear, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """`residual + apply(layer, x)`, bit for bit; a method may fold its own work into the add."""
        return residual + self.apply(layer, x)

    def apply_native(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        """`apply` in the method's `compute_dtype` (methods that have one override this)."""
        raise TypeError(f"{self!r} computes in its input's dtype: it has no native dtype to leave its output in")

    def __repr__(self) -> str:
        return type(self).__name__


def _new_param(shape: Iterable[int], dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(tuple(shape), dtype=dtype), requires_grad=False)


class UnquantizedLinearMethod(LinearMethod):
    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        layer.weight = _new_param((*layer.batch_shape, layer.out_features, layer.in_features), dtype)
        if layer.has_bias:
            layer.bias = _new_param((*layer.batch_shape, layer.out_features), dtype)


class Fp8BlockLinearMethod(LinearMethod):
    """weight: [*, out, in] float8_e4m3fn; weight_scale_inv: [*, ceil(out/bn), ceil(in/bk)] float32.

    W = weight * weight_scale_inv, each scale covering one bn x bk block (the checkpoint's convention).
    """

    def __init__(self, block_size: tuple[int, int]):
        self.block_size = block_size

    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        bn, bk = self.block_size
        batch, out, inp = layer.batch_shape, layer.out_features, layer.in_features
        layer.weight = _new_param((*batch, out, inp), FP8_DTYPE)
        layer.weight_scale_inv = _new_param((*batch, math.ceil(out / bn), math.ceil(inp / bk)), torch.float32)
        if layer.has_bias:
            layer.bias = _new_param((*batch, out), dtype)

    def param_names(self, layer: Linear) -> tuple[str, ...]:
        return (*super().param_names(layer), "weight_scale_inv")

    def row_slice(self, layer: Linear, param: str, start: int, size: int, part: str) -> slice:
        if param != "weight_scale_inv":
            return slice(start, start + size)
        bn = self.block_size[0]
        if start % bn:
            raise ConfigError(
                f"cannot fuse {part!r} into one FP8 layer: it starts at row {start}, "
                f"not a multiple of the scale block height {bn}"
            )
        return slice(start // bn, math.ceil((start + size) / bn))

    def weight(self, layer: Linear, index=None) -> torch.Tensor:
        w, s = layer.weight, layer.weight_scale_inv
        if index is not None:
            w, s = w[index], s[index]
        return dequantize_fp8_blocks(w, s, self.block_size)

    def __repr__(self) -> str:
        return f"Fp8BlockLinearMethod(block_size={self.block_size})"


def quantize_fp8_blocks(weight: torch.Tensor, block_size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `dequantize_fp8_blocks` (max-abs scaling per block); for tests and converters."""
    bn, bk = block_size
    out, inp = weight.shape[-2:]
    rows, cols = math.ceil(out / bn), math.ceil(inp / bk)
    padded = F.pad(weight.float(), (0, cols * bk - inp, 0, rows * bn - out))
    blocks = padded.unflatten(-1, (cols, bk)).unflatten(-3, (rows, bn))  # [*, rows, bn, cols, bk]
    amax = blocks.abs().amax(dim=(-3, -1)).clamp(min=1e-12)  # [*, rows, cols]
    scale = amax / torch.finfo(FP8_DTYPE).max
    q = (blocks / scale[..., :, None, :, None]).to(FP8_DTYPE)
    return q.flatten(-2).flatten(-3, -2)[..., :out, :inp].contiguous(), scale


def create_weights(model: nn.Module, fmt: LinearQuantization, dtype: torch.dtype) -> None:
    """Give every `Linear` in `model` its method (exclusions honoured) and create all weights, in one pass."""
    for path, module in model.named_modules():
        if isinstance(module, Linear) and module.method is None:
            module.create_weights(fmt.method_for(path, module), dtype)
