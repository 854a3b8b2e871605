"""Learned absolute position embeddings (GPT-2, OPT): a table indexed by each token's position."""

from __future__ import annotations

import torch
from torch import nn


class LearnedPositionEmbedding(nn.Module):
    """weight: [num_positions + offset, dim]; a token at position p reads row p + offset.

    `offset`: rows the checkpoint keeps before position 0 (OPT stores 2, a fairseq padding legacy)."""

    def __init__(self, num_positions: int, dim: int, *, offset: int = 0):
        super().__init__()
        if num_positions <= 0 or dim <= 0 or offset < 0:
            raise ValueError(
                f"LearnedPositionEmbedding needs positive sizes and offset >= 0, "
                f"got num_positions={num_positions}, dim={dim}, offset={offset}"
            )
        self.offset = offset
        self.weight = nn.Parameter(torch.empty(num_positions + offset, dim), requires_grad=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """positions [T] -> [T, dim]."""
        return nn.functional.embedding(positions + self.offset if self.offset else positions, self.weight)

    def extra_repr(self) -> str:
        rows, dim = self.weight.shape
        return f"{rows - self.offset}, {dim}, offset={self.offset}"
