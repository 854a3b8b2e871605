"""The sharded layers' communication: what a rank's share of a layer computes, and how the ranks combine it.

- `RowParallel`: a linear whose input features are split (o_proj, down_proj, c_proj): each rank multiplies its
  columns, the ranks sum; the bias and the residual are added once (rank 0 holds the bias, the others zeros).
- `VocabParallelHead`: the LM head split by vocabulary rows; the ranks' logits are gathered side by side (what the
  driver samples from), the padding of an uneven split cut off.
- `VocabParallelEmbedding`: the embedding table split by vocabulary rows; a rank looks up the ids it holds, zeros
  elsewhere, and the ranks sum. `whole_embedding` gathers the whole table on every rank, for a model outside the
  ranks' steps (an EAGLE-3 draft on the driver) that looks tokens up alone.
- `ExpertParallel`: an MoE layer holding experts [first, first + count); the router stays whole on every rank, each
  rank runs its own experts on the tokens routed to them (others weigh 0), the ranks sum.
Column-parallel linears (q/k/v, gate/up, MLA's per-head projections) need nothing: their outputs stay split by head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kernelbay_engine.distributed.group import TensorParallelGroup
from kernelbay_engine.models.base import VocabEmbedding


@dataclass(frozen=True, slots=True, eq=False)
class RowParallel:
    """`Linear.combine` of a row-parallel linear."""

    group: TensorParallelGroup

    def __call__(self, layer, method, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        if residual is not None and self.group.parallel.is_driver:
            y = method.apply_add(layer, x, residual)
        else:
            y = method.apply(layer, x)
        return self.group.all_reduce(y.contiguous())


@dataclass(frozen=True, slots=True, eq=False)
class VocabParallelHead:
    """`Linear.combine` of the LM head: every rank's vocabulary rows gathered, `vocab_size` columns kept."""

    group: TensorParallelGroup
    vocab_size: int

    def __call__(self, layer, method, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        if residual is not None:
            raise ValueError("the LM head adds no residual")
        return self.group.all_gather_last(method.apply(layer, x))[..., : self.vocab_size]


class VocabParallelEmbedding(VocabEmbedding):
    """weight: [rows, hidden], the vocabulary rows [first, first + rows) (the last rank's tail zero padding); or,
    held quantized (`method`: a GGUF file's codes), those rows' codes."""

    def __init__(self, rows: int, hidden_size: int, *, first: int, group: TensorParallelGroup, scale=None):
        super().__init__(rows, hidden_size, scale=scale)
        self.rows = rows
        self.first = first
        self.group = group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.first
        elsewhere = (local < 0) | (local >= self.rows)
        local = local.masked_fill(elsewhere, 0)
        x = self.method.lookup(local) if self.method is not None else nn.functional.embedding(local, self.weight)
        x = self.group.all_reduce(x.masked_fill(elsewhere.unsqueeze(-1), 0.0))
        if self.scale is not None:
            x = x * torch.tensor(self.scale).to(x.dtype)  # rounded like transformers
        return x

    def held_rows(self) -> torch.Tensor:
        """[rows, hidden]: this rank's rows as its lookups return them before the scale (quantized ones dequantized)."""
        if self.method is None:
            return self.weight.detach()
        return self.method.lookup(torch.arange(self.rows))


def whole_embedding(model) -> VocabEmbedding:
    """The model's token table, every rank's rows gathered (a collective: every rank calls it; the driver keeps the
    result): a plain `VocabEmbedding` of `vocab_size` rows in the rows' dtype, with the sharded table's scale."""
    sharded = model.input_embeddings()
    if not isinstance(sharded, VocabParallelEmbedding):
        raise TypeError(f"the token table is a {type(sharded).__name__}, not a VocabParallelEmbedding")
    vocab = model.config.vocab_size
    rows = sharded.group.all_gather_last(sharded.held_rows().T).T[:vocab]  # [world_size * rows, hidden] -> vocab
    whole = VocabEmbedding(vocab, rows.shape[1], scale=sharded.scale)
    whole.weight = nn.Parameter(rows.contiguous(), requires_grad=False)
    return whole


@dataclass(frozen=True, slots=True, eq=False)
class ExpertParallel:
    """`SparseMoE.expert_parallel`: the rank's experts [first, first + count) and the group that sums them."""

    first: int
    count: int
    group: TensorParallelGroup

    def localize(self, ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The router's (ids [T, k], weights [T, k]) as this rank's expert indices; another rank's expert weighs 0."""
        local = ids - self.first
        mine = (local >= 0) & (local < self.count)
        return torch.where(mine, local, 0), torch.where(mine, weights, torch.zeros_like(weights))

    def combine(self, out: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(out.contiguous())
