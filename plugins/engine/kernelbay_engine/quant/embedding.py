"""A token embedding table held as a `QuantizedWeight`'s codes: rows dequantized only as they are looked up.

A GGUF file's token_embd (Q8_0 in SmolLM2's Q4_1 file) is also the tied LM head's weight: the head runs it on
a kernel, and the table reads its rows' codes back from the head's (int8_dot's layout: `code_rows`), and their
scales too where the head's float16 scales are the same values (a file's blocks: `scale_rows`), so the codes and
scales are held once and neither an fp32 table (vocab x hidden x 4 bytes: 113 MiB for SmolLM2) nor any other float
copy exists. A row equals `weight.dequantize()`'s bit for bit (the
same float32 products), cast to the model dtype: a Q8_0 table gives the rows of the file dequantized.

    set_quantized_embedding(model.input_embeddings(), weight)   # the module's `weight` is deleted
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from kernelbay.errors import ConfigError
from kernelbay_engine.quant.weights import QuantizedWeight, dequantized_rows


class QuantizedEmbedding:
    """`lookup(ids) -> [*ids.shape, hidden]` in `dtype`, from the codes of the gathered rows only.

    `code_rows(ids) -> q rows`: where the codes are read when the tied LM head's kernel holds them
    (`kernels.dot_code_rows`); the table then keeps only the scales (and zeros), so the codes exist once.
    `scale_rows(ids) -> float32 scale rows`: where the scales are read when the head holds them exactly
    (`kernels.dot_scale_rows`); the table then keeps only the zeros (4-bit)."""

    holds_weight = True  # loading/plan.py: the loader reads no checkpoint tensor into the table

    def __init__(
        self,
        weight: QuantizedWeight,
        dtype: torch.dtype,
        code_rows: Callable[[torch.Tensor], torch.Tensor] | None = None,
        scale_rows: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.dtype, self.source, self.device = dtype, weight.source, weight.scale.device
        self.bits, self.group_size, self.in_features = weight.bits, weight.group_size, weight.in_features
        self.rows, self.zero = weight.out_features, weight.zero
        self.scale = weight.scale if scale_rows is None else None  # None: the tied head holds them
        self.owns_codes = code_rows is None
        self.code_rows = code_rows or functools.partial(torch.index_select, weight.q, 0)
        self.scale_rows = scale_rows or functools.partial(torch.index_select, weight.scale, 0)

    @property
    def nbytes(self) -> int:
        """Bytes the table holds: codes one per byte and float32 scales (unless the tied LM head holds them), zeros."""
        held = self.zero.nbytes if self.zero is not None else 0
        held += self.scale.nbytes if self.scale is not None else 0
        return held + (self.rows * self.in_features if self.owns_codes else 0)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        zero = None if self.zero is None else self.zero.index_select(0, flat)
        rows = dequantized_rows(
            self.code_rows(flat), self.scale_rows(flat), zero, self.bits, self.group_size, self.dtype
        )
        return rows.view(*ids.shape, self.in_features)

    def __repr__(self) -> str:
        return f"QuantizedEmbedding({self.source}, rows dequantized per lookup)"


def set_quantized_embedding(
    table: nn.Module,
    weight: QuantizedWeight,
    code_rows: Callable[[torch.Tensor], torch.Tensor] | None = None,
    scale_rows: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> QuantizedEmbedding:
    """Hold `table`'s (a `VocabEmbedding`'s) rows as `weight`'s codes (read through `code_rows`, and the scales
    through `scale_rows`, where the tied LM head holds them); its float `weight` is deleted."""
    plain = table._parameters.get("weight")
    if plain is None or not hasattr(table, "method"):
        raise ConfigError(f"{table!r} is not a plain VocabEmbedding table: it cannot hold quantized rows")
    if tuple(plain.shape) != (weight.out_features, weight.in_features):
        raise ConfigError(
            f"quantized table is [{weight.out_features}, {weight.in_features}], the embedding is {list(plain.shape)}"
        )
    method = QuantizedEmbedding(weight, plain.dtype, code_rows, scale_rows)
    table.method = method  # type: ignore[assignment]  # a plain attribute of the table module, not a submodule
    del table.weight  # a tied LM head holds its own (kernel-packed) form of the same codes
    return method
