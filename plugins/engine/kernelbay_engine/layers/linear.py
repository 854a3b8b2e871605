"""Linear layers whose weights are created late, by a quantization method chosen per layer.

A `Linear` is declared with its geometry only. After the whole module tree exists,
`kernelbay_engine.models.quant.create_weights(model, ...)` picks each layer's `LinearMethod` (plain, or
FP8 block-scaled unless the layer is excluded) and creates every weight in one pass.

`MergedLinear` fuses several checkpoint projections (q/k/v, gate/up) into one matmul; it tells the
loader which rows of its weights each checkpoint tensor fills (`checkpoint_aliases`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from kernelbay_engine.models.quant import LinearMethod


class Linear(nn.Module):
    """y = x W^T (+ b). W: [*batch_shape, out_features, in_features]; batch_shape is () or (num_experts,)."""

    # Parameters the layer's LinearMethod creates (a packed or quantized layer holds no `weight`).
    weight: torch.Tensor
    bias: torch.Tensor  # only when has_bias
    weight_scale_inv: torch.Tensor  # FP8 block-scaled weights only

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = False,
        batch_shape: tuple[int, ...] = (),
        quantizable: bool = True,
        checkpoint_transposed: bool = False,
    ):
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"Linear needs positive sizes, got in={in_features}, out={out_features}")
        self.in_features = in_features
        self.out_features = out_features
        self.has_bias = bias
        self.batch_shape = tuple(batch_shape)
        self.quantizable = quantizable  # False: always plain weights (e.g. the LM head)
        # The checkpoint stores W as [in, out] (GPT-2's Conv1D): the loader reads it transposed into [out, in].
        self.checkpoint_transposed = checkpoint_transposed
        self.method: LinearMethod | None = None
        # Tensor parallelism: how the ranks' shares of the output combine (kernelbay_engine.distributed.layers);
        # None: this rank's output is the layer's (replicated, or column-parallel and kept split).
        self.combine: Callable | None = None

    def create_weights(self, method: LinearMethod, dtype: torch.dtype) -> None:
        """Called once, by `quant.create_weights`, after the per-layer method is known."""
        if self.method is not None:
            raise RuntimeError(f"weights of {self!r} were already created")
        self.method = method
        method.create_weights(self, dtype)

    def dequantized_weight(self) -> torch.Tensor:
        """W in the compute dtype (what an MLA backend absorbs, what tests compare)."""
        return self._require_method().weight(self)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x W^T (+ b), plus `residual` when given (the output projection of a pre-norm block)."""
        method = self.method or self._require_method()
        if self.combine is not None:
            return self.combine(self, method, x, residual)
        return method.apply(self, x) if residual is None else method.apply_add(self, x, residual)

    @property
    def compute_dtype(self) -> torch.dtype | None:
        """The dtype the layer's kernel computes in whatever the input's (bf16 for the quantized CPU kernels);
        None when it computes in the input's dtype."""
        return self.method.compute_dtype if self.method is not None else None

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        """x W^T (+ b) left in `compute_dtype` (no cast back to x's dtype): for a consumer that computes in it."""
        return self._require_method().apply_native(self, x)

    def _require_method(self) -> LinearMethod:
        if self.method is None:
            raise RuntimeError(
                "Linear weights were never created: build models through "
                "kernelbay.models.AutoModelForCausalLM (it calls quant.create_weights)"
            )
        return self.method

    def checkpoint_aliases(self, prefix: str) -> dict[str, tuple[str, tuple]]:
        """Checkpoint name -> (own parameter name, index into it) for tensors stored under other names."""
        return {}

    def extra_repr(self) -> str:
        batch = f", batch_shape={self.batch_shape}" if self.batch_shape else ""
        return f"in={self.in_features}, out={self.out_features}, bias={self.has_bias}{batch}, method={self.method}"


class MergedLinear(Linear):
    """One matmul for several projections; `parts` maps checkpoint sibling names to their output rows.

    E.g. `MergedLinear(h, {"q_proj": 4096, "k_proj": 1024, "v_proj": 1024})` named `qkv_proj` loads
    either a fused `qkv_proj.weight` (Phi-3) or `q_proj/k_proj/v_proj.weight` into row slices (Llama).
    """

    def __init__(
        self,
        in_features: int,
        parts: Mapping[str, int],
        *,
        bias: bool = False,
        batch_shape: tuple[int, ...] = (),
        checkpoint_transposed: bool = False,
    ):
        if not parts:
            raise ValueError("MergedLinear needs at least one part")
        super().__init__(
            in_features,
            sum(parts.values()),
            bias=bias,
            batch_shape=batch_shape,
            checkpoint_transposed=checkpoint_transposed,
        )
        self.parts = dict(parts)
        self._sizes = tuple(self.parts.values())

    def part_rows(self) -> dict[str, tuple[int, int]]:
        """Part name -> (first row, row count) in the fused output."""
        rows, start = {}, 0
        for name, size in self.parts.items():
            rows[name] = (start, size)
            start += size
        return rows

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return y.split_with_sizes(self._sizes, dim=-1)  # not torch.split: two Python frames fewer, 60 calls a step

    def checkpoint_aliases(self, prefix: str) -> dict[str, tuple[str, tuple]]:
        parent = prefix.rpartition(".")[0]
        return self._part_aliases(lambda part, param: _join(parent, part, param), lambda rows: (rows,))

    def _part_aliases(self, name_of, index_of) -> dict[str, tuple[str, tuple]]:
        """For every part and parameter: checkpoint name -> (parameter, index of the part's rows)."""
        aliases = {}
        method = self._require_method()
        for part, (start, size) in self.part_rows().items():
            for param in method.param_names(self):
                rows = method.row_slice(self, param, start, size, part)
                aliases[name_of(part, param)] = (param, index_of(rows))
        return aliases


class ExpertLinear(MergedLinear):
    """Per-expert weights stacked on a leading dim; checkpoints name them `experts.<e>.<part>.<param>`."""

    def __init__(self, in_features: int, parts: Mapping[str, int], *, num_experts: int, bias: bool = False):
        super().__init__(in_features, parts, bias=bias, batch_shape=(num_experts,))
        self.first_expert = 0
        """The checkpoint's number of expert 0 here (expert parallelism: a rank holds experts from it on)."""

    def checkpoint_aliases(self, prefix: str) -> dict[str, tuple[str, tuple]]:
        experts = prefix.rpartition(".")[0]
        aliases = {}
        for e in range(self.batch_shape[0]):
            number = str(self.first_expert + e)
            aliases.update(
                self._part_aliases(
                    lambda part, param, n=number: _join(experts, n, part, param), lambda rows, e=e: (e, rows)
                )
            )
        return aliases


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)
