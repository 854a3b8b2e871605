"""RMSNorm in the two flavours checkpoints use: `w * x` (Llama, Qwen, DeepSeek) and `(1 + w) * x` (Gemma);
LayerNorm with bias (the GPT family)."""

from __future__ import annotations

import torch
from torch import nn

from kernelbay_engine.native import ops, tracked

_NATIVE_OUT = (None, torch.bfloat16)  # output dtypes the native norm writes (float32 in, as aten computes)


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dim, computed in float32 like the reference implementations.

    `unit_offset=True` stores `w` as an offset from 1 (Gemma): the output is `x_hat * (1 + w)`, cast after
    the multiply; otherwise `x_hat` is cast to the input dtype first and then scaled by `w` (Llama).
    """

    def __init__(self, dim: int, eps: float = 1e-6, *, unit_offset: bool = False):
        super().__init__()
        if dim <= 0 or eps <= 0:
            raise ValueError(f"RMSNorm needs dim > 0 and eps > 0, got dim={dim}, eps={eps}")
        self.eps = eps
        self.unit_offset = unit_offset
        # weight: [dim]; ones (or zeros with a unit offset) is the identity
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """The norm of x in x's dtype, or in `out_dtype` (a consumer computing in bf16: rounded as its cast would)."""
        out_dtype = None if out_dtype == x.dtype else out_dtype  # a consumer computing in x's dtype: no cast
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32 and not self.unit_offset:
            # One call instead of aten's ~8 internal dispatches (61 norms a SmolLM2 decode step), within float32
            # rounding of aten's: the native op where it runs (no autograd, no torch.compile trace), else aten's.
            native = ops()
            if native is not None and x.is_contiguous() and out_dtype in _NATIVE_OUT and not tracked(x, self.weight):
                return native.rms_norm(x, self.weight, self.eps, out_dtype is not None)
            y = nn.functional.rms_norm(x, self.weight.shape, self.weight, self.eps)
            return y if out_dtype is None else y.to(out_dtype)
        x32 = x.float()
        x_hat = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        y = (x_hat * (1.0 + self.weight.float())).type_as(x) if self.unit_offset else self.weight * x_hat.to(x.dtype)
        return y if out_dtype is None else y.to(out_dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, unit_offset={self.unit_offset}"


class LayerNorm(nn.Module):
    """LayerNorm over the last dim with a learned scale and (optionally) bias: GPT-2, OPT, GPT-NeoX, Falcon."""

    def __init__(self, dim: int, eps: float = 1e-5, *, bias: bool = True):
        super().__init__()
        if dim <= 0 or eps <= 0:
            raise ValueError(f"LayerNorm needs dim > 0 and eps > 0, got dim={dim}, eps={eps}")
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))  # [dim]
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None  # [dim]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, bias={self.bias is not None}"
