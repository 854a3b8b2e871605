"""A token embedding table held as a `QuantizedWeight`'s codes: rows dequantized only as they are looked up.

A GGUF file's token_embd (Q8_0 in SmolLM2's Q4_1 file) is also the tied LM head's weight: the head runs it on
a kernel, the table keeps the same codes and scales, so neither an fp32 table (vocab x hidden x 4 bytes:
113 MiB for SmolLM2) nor any other float copy exists. A row equals `weight.dequantize()`'s bit for bit (the
same float32 products), cast to the model dtype: a Q8_0 table gives the rows of the file dequantized.

    set_quantized_embedding(model.input_embeddings(), weight)   # the module's `weight` is deleted
"""

from __future__ import annotations

import torch
from torch import nn

from kernelbay.errors import ConfigError
from kernelbay_engine.quant.weights import QuantizedWeight


class QuantizedEmbedding:
    """`lookup(ids) -> [*ids.shape, hidden]` in `dtype`, from the codes of the gathered rows only."""

    holds_weight = True  # loading/plan.py: the loader reads no checkpoint tensor into the table

    def __init__(self, weight: QuantizedWeight, dtype: torch.dtype):
        self.weight, self.dtype, self.source = weight, dtype, weight.source

    @property
    def device(self) -> torch.device:
        return self.weight.q.device

    @property
    def nbytes(self) -> int:
        """Bytes the table holds (codes one per byte, float32 scales and zeros)."""
        w = self.weight
        return w.q.nbytes + w.scale.nbytes + (w.zero.nbytes if w.zero is not None else 0)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight.dequantize(self.dtype, rows=ids.reshape(-1))
        return rows.view(*ids.shape, self.weight.in_features)

    def __repr__(self) -> str:
        return f"QuantizedEmbedding({self.source}, rows dequantized per lookup)"


def set_quantized_embedding(table: nn.Module, weight: QuantizedWeight) -> QuantizedEmbedding:
    """Hold `table`'s (a `VocabEmbedding`'s) rows as `weight`'s codes; its float `weight` is deleted."""
    plain = table._parameters.get("weight")
    if plain is None or not hasattr(table, "method"):
        raise ConfigError(f"{table!r} is not a plain VocabEmbedding table: it cannot hold quantized rows")
    if tuple(plain.shape) != (weight.out_features, weight.in_features):
        raise ConfigError(
            f"quantized table is [{weight.out_features}, {weight.in_features}], the embedding is {list(plain.shape)}"
        )
    method = QuantizedEmbedding(weight, plain.dtype)
    table.method = method  # type: ignore[assignment]  # a plain attribute of the table module, not a submodule
    del table.weight  # a tied LM head holds its own (kernel-packed) form of the same codes
    return method
