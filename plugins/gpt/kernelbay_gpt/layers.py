"""What the GPT-family decoders share: config reading, the paged attention core, fused-QKV splitting, residuals.

Each family (gpt2.py, opt.py, neox.py, falcon.py) names its modules as its checkpoints do, so a missing tensor is
reported under the name the checkpoint would use; the structure below is written once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from kernelbay.attention import AttentionMetadata
from kernelbay.errors import ConfigError
from kernelbay_engine.attention import Attention
from kernelbay_engine.layers import RotaryEmbedding

CosSin = tuple[torch.Tensor, torch.Tensor] | None  # rotary tables of the step; None: learned positions


def hf_value(config, name: str, default=None):
    """A family-specific field of the transformers config (None reads as `default`)."""
    value = getattr(config.hf_config, name, default)
    return default if value is None else value


def refuse(config, what: str, fix: str) -> None:
    """A config this family cannot build: say what and how to fix it (no silent approximation)."""
    raise ConfigError(f"{config.architecture} ({config.source or 'config'}): {what}; {fix}")


class AttentionCore(nn.Module):
    """q/k/v already projected -> heads, (partial) rotary, paged attention -> [T, heads * head_dim]."""

    def __init__(self, config, layer_idx: int, *, prefix: str, scale: float | None = None):
        super().__init__()
        heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.shape = (heads, kv_heads, head_dim)
        self.attn = Attention(config.layer_geometry(layer_idx, scale=scale), prefix=prefix)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rotary: RotaryEmbedding | None,
        cos_sin: CosSin,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        heads, kv_heads, head_dim = self.shape
        tokens = q.shape[0]
        q = q.view(tokens, heads, head_dim)
        k, v = k.view(tokens, kv_heads, head_dim), v.view(tokens, kv_heads, head_dim)
        if rotary is not None:
            q, k = rotary.apply(q, k, *cos_sin)
        out = self.attn(q, k, v, metadata)  # [T, heads, head_dim]
        return out.reshape(tokens, heads * head_dim)


def split_grouped_qkv(
    qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused `query_key_value` layout of GPT-NeoX and Falcon: per KV group, its query heads then one key
    and one value head, i.e. [T, kv_heads, heads / kv_heads + 2, head_dim]. It covers NeoX and Falcon's
    multi-head checkpoints ([heads, 3, head_dim]: one query per group), Falcon-7B's multi-query one
    ([1, heads + 2, head_dim]: q heads..., k, v) and Falcon-40B's grouped one.

    qkv [T, (heads + 2 * kv_heads) * head_dim] -> q [T, heads * head_dim], k and v [T, kv_heads * head_dim]."""
    tokens = qkv.shape[0]
    grouped = qkv.view(tokens, kv_heads, heads // kv_heads + 2, head_dim)
    q = grouped[:, :, :-2].reshape(tokens, heads * head_dim)
    return q, grouped[:, :, -2].reshape(tokens, -1), grouped[:, :, -1].reshape(tokens, -1)


def residual(
    x: torch.Tensor,
    attend: Callable[[torch.Tensor], torch.Tensor],
    feed_forward: Callable[[torch.Tensor], torch.Tensor],
    attn_norm: nn.Module,
    mlp_norm: nn.Module | None,
    *,
    parallel: bool,
) -> torch.Tensor:
    """A pre-norm decoder layer's two residual branches.

    Sequential (GPT-2, NeoX without use_parallel_residual): x += attn(ln1 x); x += mlp(ln2 x).
    Parallel (NeoX use_parallel_residual, Falcon parallel_attn): x + attn(ln1 x) + mlp(ln2 x), where
    `mlp_norm=None` feeds the MLP the attention's normed input (Falcon-7B's single input_layernorm)."""
    normed = attn_norm(x)
    h = attend(normed)
    if parallel:
        return x + (feed_forward(normed if mlp_norm is None else mlp_norm(x)) + h)
    x = x + h
    return x + feed_forward(mlp_norm(x))
