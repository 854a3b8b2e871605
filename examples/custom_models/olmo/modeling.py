"""OLMo 1 from kernelbay's building blocks: Llama's shape with parameter-free LayerNorms and q/k/v clipping."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernelbay import register_model
from kernelbay.attention import AttentionMetadata
from kernelbay_engine.attention import Attention
from kernelbay_engine.layers import GatedMLP, Linear, MergedLinear, RotaryEmbedding
from kernelbay_engine.models.base import CausalLM, VocabEmbedding, rope_params


class OlmoLayerNorm(nn.Module):
    """LayerNorm without weight or bias (OLMo's checkpoints hold none), computed in float32."""

    def __init__(self, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), (self.hidden_size,), eps=self.eps).to(x.dtype)


class OlmoAttention(nn.Module):
    def __init__(self, config, layer_idx: int, rotary: RotaryEmbedding):
        super().__init__()
        heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.shape = (heads, kv_heads, head_dim)
        bias = bool(getattr(config.hf_config, "attention_bias", False))
        self.qkv_proj = MergedLinear(
            config.hidden_size,
            {"q_proj": heads * head_dim, "k_proj": kv_heads * head_dim, "v_proj": kv_heads * head_dim},
            bias=bias,
        )
        self.o_proj = Linear(heads * head_dim, config.hidden_size, bias=bias)
        self.clip_qkv = getattr(config.hf_config, "clip_qkv", None)
        self.rotary = rotary
        self.attn = Attention(config.layer_geometry(layer_idx), prefix=f"model.layers.{layer_idx}.self_attn.attn")

    def forward(self, x: torch.Tensor, cos_sin, metadata: AttentionMetadata) -> torch.Tensor:
        heads, kv_heads, head_dim = self.shape
        qkv = self.qkv_proj(x)  # [T, (heads + 2 * kv_heads) * head_dim]
        if self.clip_qkv is not None:
            qkv = qkv.clamp(-self.clip_qkv, self.clip_qkv)
        q, k, v = self.qkv_proj.split(qkv)
        q, k, v = q.view(-1, heads, head_dim), k.view(-1, kv_heads, head_dim), v.view(-1, kv_heads, head_dim)
        q, k = self.rotary.apply(q, k, *cos_sin)
        out = self.attn(q, k, v, metadata)  # [T, heads, head_dim]
        return self.o_proj(out.reshape(out.shape[0], heads * head_dim))


class OlmoDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int, rotary: RotaryEmbedding):
        super().__init__()
        self.self_attn = OlmoAttention(config, layer_idx, rotary)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hf_config.hidden_act)
        self.input_layernorm = OlmoLayerNorm(config.hidden_size)
        self.post_attention_layernorm = OlmoLayerNorm(config.hidden_size)

    def forward(self, x: torch.Tensor, cos_sin, metadata: AttentionMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos_sin, metadata)
        return x + self.mlp(self.post_attention_layernorm(x))


class OlmoModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = RotaryEmbedding(rope_params(config))
        self.layers = nn.ModuleList(
            OlmoDecoderLayer(config, i, self.rotary_emb) for i in range(config.num_hidden_layers)
        )
        self.norm = OlmoLayerNorm(config.hidden_size)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [T, hidden]
        cos_sin = self.rotary_emb.cos_sin(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos_sin, metadata)
        return self.norm(x)


@register_model("OlmoForCausalLM")
class OlmoForCausalLM(CausalLM):
    def __init__(self, config):
        super().__init__(config)
        self.model = OlmoModel(config)
        self.lm_head = self.make_lm_head()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, metadata)
