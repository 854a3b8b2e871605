"""The MLP activations the shipped families use, by their HF config names, and the MLPs built on them."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

from kernelbay_engine.layers.linear import Linear, MergedLinear
from kernelbay_engine.native import SILU_MUL_DTYPES, ops, tracked

_gelu_tanh = partial(F.gelu, approximate="tanh")
# Functions, not modules: the same ops as nn.SiLU / nn.GELU / nn.ReLU without a module call per layer.
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_new": _gelu_tanh,  # GPT-2's name for the same tanh approximation
    "relu": F.relu,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """`hidden_act` -> its function; an unknown name is an error listing the supported ones."""
    fn = _ACTIVATIONS.get(name)
    if fn is None:
        raise ValueError(f"hidden_act {name!r} is not supported; use one of {', '.join(sorted(_ACTIVATIONS))}")
    return fn


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)); gate and up fused in one `gate_up_proj` (loads gate_proj/up_proj too)."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str, *, bias: bool = False):
        super().__init__()

        self.gate_up_proj = MergedLinear(
            hidden_size, {"gate_proj": intermediate_size, "up_proj": intermediate_size}, bias=bias
        )
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = activation(act)

    @property
    def input_dtype(self) -> torch.dtype | None:
        """The dtype the MLP computes in from its input on (bf16 when both projections run bf16 kernels), which a
        norm before it may hand x in (the cast done once there); None: x's own."""
        dtype = self.gate_up_proj.compute_dtype
        return dtype if dtype is not None and dtype == self.down_proj.compute_dtype else None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The MLP of x, plus `residual` when given (added by the down projection)."""
        gate_up, down = self.gate_up_proj, self.down_proj
        if self.input_dtype is not None:  # both on kernels computing in it (bf16):
            y = gate_up.forward_native(x)  # act(gate) * up in it too, no cast out and back in (2 calls a layer)
        else:
            y = gate_up(x)
        native = ops() if self.act_fn is F.silu else None
        if native is not None and y.dtype in SILU_MUL_DTYPES and y.is_contiguous() and not tracked(y):
            return down(native.silu_mul(y), residual)  # split, silu and product in one call, the same bits
        gate, up = gate_up.split(y)
        return down(self.act_fn(gate) * up, residual)


class MLP(nn.Module):
    """fc_out(act(fc_in(x))), the GPT family's plain MLP; `names` are the checkpoint's names for the two
    projections (GPT-2 `c_fc`/`c_proj`, NeoX and Falcon `dense_h_to_4h`/`dense_4h_to_h`), so that a missing
    tensor is reported under the name the checkpoint would use. `transposed`: GPT-2's Conv1D layout."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        act: str,
        *,
        names: tuple[str, str],
        bias: bool = True,
        transposed: bool = False,
    ):
        super().__init__()
        self.names = names
        fc_in = Linear(hidden_size, intermediate_size, bias=bias, checkpoint_transposed=transposed)
        fc_out = Linear(intermediate_size, hidden_size, bias=bias, checkpoint_transposed=transposed)
        for name, layer in zip(names, (fc_in, fc_out), strict=True):
            self.add_module(name, layer)
        self.act_fn = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fc_in, fc_out = (getattr(self, name) for name in self.names)
        return fc_out(self.act_fn(fc_in(x)))
