"""Multi-head latent attention (DeepSeek-V2/V3): queries per head, keys and values from a shared latent.

Per token the cache holds the normalised latent [kv_lora_rank] and the rotated shared key [qk_rope_head_dim];
the attention backend expands the latent with `kv_b_proj` (latent -> per-head k_nope ‖ v). The softmax scale
(`config.attention_scale`) already includes YaRN's mscale² when the RoPE is scaled. Under DSA (V3.2,
`config.indexer`) each query attends only to the keys its layer's lightning indexer picks (dsa.py).
"""

from __future__ import annotations

import torch
from torch import nn

from kernelbay.attention import AttentionForwardArgs, AttentionMetadata
from kernelbay_engine.attention import Attention
from kernelbay_engine.layers import Linear, RMSNorm, RotaryEmbedding
from kernelbay_engine.models.base import rope_params

from .dsa import Indexer


def mla_rotary(config, interleaved: bool) -> RotaryEmbedding:
    return RotaryEmbedding(rope_params(config, rotary_dim=config.mla.qk_rope_head_dim, interleaved=interleaved))


class MLAAttention(nn.Module):
    """q (optionally through a low-rank `q_a_proj` -> norm -> `q_b_proj`), latent kv, RoPE on the rope dims."""

    def __init__(self, config, layer_idx: int, rotary: RotaryEmbedding):
        super().__init__()
        mla, hidden, heads = config.mla, config.hidden_size, config.num_attention_heads
        self.mla, self.heads = mla, heads
        bias = bool(getattr(config.hf_config, "attention_bias", False))
        if mla.q_lora_rank is None:
            self.q_proj = Linear(hidden, heads * mla.qk_head_dim)
        else:
            self.q_a_proj = Linear(hidden, mla.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, config.rms_norm_eps)
            self.q_b_proj = Linear(mla.q_lora_rank, heads * mla.qk_head_dim)
        self.kv_a_proj_with_mqa = Linear(hidden, mla.kv_lora_rank + mla.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, config.rms_norm_eps)
        self.kv_b_proj = Linear(mla.kv_lora_rank, heads * (mla.qk_nope_head_dim + mla.v_head_dim))
        self.o_proj = Linear(heads * mla.v_head_dim, hidden, bias=bias)
        self.rotary = rotary  # shared, parameter-free
        self.attn = Attention(
            config.layer_geometry(layer_idx),
            kv_b_proj=self.kv_b_proj,
            prefix=f"model.layers.{layer_idx}.self_attn.attn",
        )
        self.indexer = Indexer(config) if config.indexer is not None else None  # DSA (V3.2)

    def _queries(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q [T, H, nope + rope] and the normalised query latent [T, q_lora_rank] (None without one)."""
        if self.mla.q_lora_rank is None:
            q, q_latent = self.q_proj(x), None
        else:
            q_latent = self.q_a_layernorm(self.q_a_proj(x))
            q = self.q_b_proj(q_latent)
        return q.view(x.shape[0], self.heads, self.mla.qk_head_dim), q_latent

    def forward(self, x: torch.Tensor, cos_sin, metadata: AttentionMetadata) -> torch.Tensor:
        mla = self.mla
        q, q_latent = self._queries(x)
        q_nope, q_pe = q.split([mla.qk_nope_head_dim, mla.qk_rope_head_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([mla.kv_lora_rank, mla.qk_rope_head_dim], dim=-1)
        q_pe, k_pe = self.rotary.apply(q_pe, k_pe.unsqueeze(1), *cos_sin)
        q = torch.cat([q_nope, q_pe], dim=-1)
        args = None
        if self.indexer is not None:  # each query attends to the keys the indexer picks
            args = AttentionForwardArgs(topk_indices=self.indexer(x, q_latent, cos_sin, metadata, self.attn))
        out = self.attn(q, self.kv_a_layernorm(latent), k_pe.squeeze(1), metadata, args)  # [T, H, v_head_dim]
        return self.o_proj(out.reshape(x.shape[0], self.heads * mla.v_head_dim))
