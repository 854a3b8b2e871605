"""Multi-head latent attention (DeepSeek-V2/V3): queries per head, keys and values from a shared latent.

Per token the cache holds the normalised latent [kv_lora_rank] and the rotated shared key [qk_rope_head_dim];
the attention backend expands the latent with `kv_b_proj` (latent -> per-head k_nope ‖ v). The softmax scale
(`config.attention_scale`) already includes YaRN's mscale² when the RoPE is scaled.
"""

from __future__ import annotations

import torch
from torch import nn

from kernelbay.attention import AttentionMetadata
from kernelbay_engine.attention import Attention
from kernelbay_engine.layers import Linear, RMSNorm, RotaryEmbedding
from kernelbay_engine.models.base import rope_params


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
            layer_idx,
            heads,
            mla.qk_head_dim,
            heads,
            scale=config.attention_scale,
            mla=mla,
            kv_b_proj=self.kv_b_proj,
            prefix=f"model.layers.{layer_idx}.self_attn.attn",
        )

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if self.mla.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        return q.view(x.shape[0], self.heads, self.mla.qk_head_dim)  # [T, H, nope + rope]

    def forward(self, x: torch.Tensor, cos_sin, metadata: AttentionMetadata) -> torch.Tensor:
        mla = self.mla
        q_nope, q_pe = self._queries(x).split([mla.qk_nope_head_dim, mla.qk_rope_head_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([mla.kv_lora_rank, mla.qk_rope_head_dim], dim=-1)
        q_pe, k_pe = self.rotary.apply(q_pe, k_pe.unsqueeze(1), *cos_sin)
        q = torch.cat([q_nope, q_pe], dim=-1)
        out = self.attn(q, self.kv_a_layernorm(latent), k_pe.squeeze(1), metadata)  # [T, H, v_head_dim]
        return self.o_proj(out.reshape(x.shape[0], self.heads * mla.v_head_dim))
