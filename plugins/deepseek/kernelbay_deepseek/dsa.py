"""DeepSeek sparse attention (DSA, V3.2): the lightning indexer that picks, per query, the keys MLA attends to.

The indexer has its own small heads: queries from the MLA query latent (`wq_b`), one shared key per token
(`wk`, LayerNorm'd), RoPE on the first `qk_rope_head_dim` channels (half-split, unlike MLA's interleaved
pairs), and a per-head weight from the hidden state. A key's score for a query is
`sum_h w_h * relu(q_h . k * index_head_dim^-0.5) * index_n_heads^-0.5`; each query keeps its `index_topk` best
visible keys. Its keys live in the layer's paged cache beside the MLA latent (`Attention.cached_index_keys`), in
the KV-cache dtype: the model dtype by default, where DeepSeek's kernels keep fp8 with per-block scales (and a
Hadamard rotation, which leaves dot products unchanged), as transformers' bf16 implementation does too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernelbay.attention import AttentionMetadata
from kernelbay.errors import ConfigError
from kernelbay_engine.attention import Attention
from kernelbay_engine.layers import Linear, RotaryEmbedding
from kernelbay_engine.models.base import rope_params

_NO_KEY = -1  # pads a row of top-k indices whose query sees fewer than index_topk keys


class Indexer(nn.Module):
    """wq_b [q_lora_rank -> heads * dim], wk [hidden -> dim], k_norm [dim], weights_proj [hidden -> heads]."""

    def __init__(self, config):
        super().__init__()
        indexer, mla = config.indexer, config.mla
        if mla.q_lora_rank is None:
            raise ConfigError(
                f"{config.architecture}: the DSA indexer projects its queries from the query latent, "
                "so q_lora_rank must be set in config.json"
            )
        self.geometry = indexer
        self.heads, self.dim = indexer.index_n_heads, indexer.index_head_dim
        self.wq_b = Linear(mla.q_lora_rank, self.heads * self.dim)
        self.wk = Linear(config.hidden_size, self.dim)
        self.k_norm = nn.LayerNorm(self.dim, eps=1e-6)  # with bias; DeepSeek's published eps
        self.weights_proj = Linear(config.hidden_size, self.heads)
        self.rotary = RotaryEmbedding(rope_params(config, rotary_dim=mla.qk_rope_head_dim, interleaved=False))

    def forward(
        self, x: torch.Tensor, q_latent: torch.Tensor, cos_sin, metadata: AttentionMetadata, attn: Attention
    ) -> torch.Tensor:
        """x [T, hidden], q_latent [T, q_lora_rank] -> top-k key positions [T, index_topk] int32 (-1 pads)."""
        q = self.wq_b(q_latent).view(x.shape[0], self.heads, self.dim)
        k = self.k_norm(self.wk(x)).unsqueeze(1)  # [T, 1, dim]
        q, k = self.rotary.apply(q, k, *cos_sin)
        weights = self.weights_proj(x).float() * self.heads**-0.5  # [T, heads]
        keys = attn.cached_index_keys(k.squeeze(1), metadata)
        picks = torch.full((x.shape[0], self.geometry.index_topk), _NO_KEY, dtype=torch.int32, device=x.device)
        start = 0
        for q_len, request_keys in zip(metadata.query_lens_host, keys, strict=True):
            rows = slice(start, start + q_len)
            scores = self._scores(q[rows], weights[rows], request_keys, metadata.positions[rows])
            chosen = self._top_k(scores)
            picks[rows, : chosen.shape[1]] = chosen
            start += q_len
        return picks

    def _scores(self, q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
        """One request: q [Tq, heads, dim], weights [Tq, heads], keys [S, dim] -> [Tq, S], -inf past each query."""
        per_head = F.relu(torch.matmul(q.float(), keys.float().T) * self.dim**-0.5)  # [Tq, heads, S]
        scores = torch.matmul(weights.unsqueeze(1), per_head).squeeze(1)
        future = torch.arange(keys.shape[0], device=keys.device).unsqueeze(0) > q_pos.unsqueeze(1)
        return scores.masked_fill(future, float("-inf"))

    def _top_k(self, scores: torch.Tensor) -> torch.Tensor:
        """The best min(index_topk, S) keys per row; picks a query cannot see (only -inf left) become -1."""
        best = scores.topk(min(self.geometry.index_topk, scores.shape[1]), dim=-1)
        return torch.where(best.values == float("-inf"), _NO_KEY, best.indices).to(torch.int32)
