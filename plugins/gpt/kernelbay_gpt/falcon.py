"""Falcon (`FalconForCausalLM`, and the legacy `RWForCausalLM` / `RefinedWebModel` of Falcon-7B).

Two layouts: the original decoder (Falcon-7B: multi-query, one `input_layernorm` feeding attention and MLP in
parallel) and `new_decoder_architecture` (Falcon-40B/180B: `num_kv_heads` grouped KV heads, `ln_attn` and `ln_mlp`).
The fused `query_key_value` is grouped per KV head in both (`split_grouped_qkv`); rotary positions; tied LM head.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from kernelbay import register_model
from kernelbay.attention import AttentionMetadata
from kernelbay_engine.layers import MLP, LayerNorm, Linear, RotaryEmbedding
from kernelbay_engine.models.base import CausalLM, VocabEmbedding, rope_params

from .layers import AttentionCore, CosSin, hf_value, refuse, residual, split_grouped_qkv


class FalconAttention(nn.Module):
    def __init__(self, config, layer_idx: int, rotary: RotaryEmbedding):
        super().__init__()
        hidden, bias = config.hidden_size, bool(hf_value(config, "bias", False))
        width = (config.num_attention_heads + 2 * config.num_key_value_heads) * config.head_dim
        self.query_key_value = Linear(hidden, width, bias=bias)
        self.dense = Linear(hidden, hidden, bias=bias)
        self.core = AttentionCore(config, layer_idx, prefix=f"transformer.h.{layer_idx}.self_attention")
        self.rotary = rotary  # shared by every layer; holds no parameters

    def forward(self, x: torch.Tensor, cos_sin: CosSin, metadata: AttentionMetadata) -> torch.Tensor:
        heads, kv_heads, head_dim = self.core.shape
        q, k, v = split_grouped_qkv(self.query_key_value(x), heads, kv_heads, head_dim)
        return self.dense(self.core(q, k, v, self.rotary, cos_sin, metadata))


class FalconDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int, rotary: RotaryEmbedding):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.self_attention = FalconAttention(config, layer_idx, rotary)
        act, bias = hf_value(config, "activation", "gelu"), bool(hf_value(config, "bias", False))
        self.mlp = MLP(hidden, config.intermediate_size, act, names=("dense_h_to_4h", "dense_4h_to_h"), bias=bias)
        self.parallel = bool(hf_value(config, "parallel_attn", True)) or _new_architecture(config)
        if _norms(config) == 2:  # new architecture: one norm per branch
            self.ln_attn, self.ln_mlp = LayerNorm(hidden, eps), LayerNorm(hidden, eps)
            self.norms = ("ln_attn", "ln_mlp")
        elif self.parallel:  # one norm feeding both branches
            self.input_layernorm = LayerNorm(hidden, eps)
            self.norms = ("input_layernorm", None)
        else:  # sequential, the original decoder without parallel_attn
            self.input_layernorm, self.post_attention_layernorm = LayerNorm(hidden, eps), LayerNorm(hidden, eps)
            self.norms = ("input_layernorm", "post_attention_layernorm")

    def forward(self, x: torch.Tensor, cos_sin: CosSin, metadata: AttentionMetadata) -> torch.Tensor:
        attn_norm, mlp_norm = (getattr(self, n) if n else None for n in self.norms)
        attend = partial(self.self_attention, cos_sin=cos_sin, metadata=metadata)
        return residual(x, attend, self.mlp, attn_norm, mlp_norm, parallel=self.parallel)


def _new_architecture(config) -> bool:
    return bool(hf_value(config, "new_decoder_architecture", False))


def _norms(config) -> int:
    """LayerNorms per layer in the new architecture (transformers' default 2: ln_attn and ln_mlp); 1 otherwise."""
    return int(hf_value(config, "num_ln_in_parallel_attn", 2)) if _new_architecture(config) else 1


def _check(config) -> None:
    """Falcon variants transformers builds differently from what this class would: refused, with the reason."""
    if config.position_embedding == "alibi":
        refuse(
            config,
            "alibi=true (Falcon-RW style ALiBi biases) is not supported: no kernelbay attention backend applies ALiBi",
            "use a rotary Falcon checkpoint (alibi=false)",
        )
    if _new_architecture(config) and not hf_value(config, "parallel_attn", True):
        refuse(
            config,
            "new_decoder_architecture=true with parallel_attn=false has no norm layout in transformers' Falcon",
            "set parallel_attn=true (every published new-architecture Falcon uses it)",
        )
    if _norms(config) not in (1, 2):
        refuse(config, f"num_ln_in_parallel_attn={_norms(config)} must be 1 or 2", "fix config.json")
    grouped = _new_architecture(config) or hf_value(config, "multi_query", True)
    if not grouped and config.num_key_value_heads != config.num_attention_heads:
        refuse(
            config,
            f"multi_query=false stores one key/value head per query head, but num_kv_heads="
            f"{config.num_key_value_heads} != {config.num_attention_heads} heads",
            "remove num_kv_heads or set it to num_attention_heads",
        )


class FalconModel(nn.Module):
    """The checkpoint's `transformer.`: embeddings, layers, final norm."""

    def __init__(self, config):
        super().__init__()
        self.word_embeddings = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = RotaryEmbedding(rope_params(config))
        self.h = nn.ModuleList(FalconDecoderLayer(config, i, self.rotary_emb) for i in range(config.num_hidden_layers))
        self.ln_f = LayerNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        x = self.word_embeddings(input_ids)  # [T, hidden]
        cos_sin = self.rotary_emb.cos_sin(positions, x.dtype)
        for layer in self.h:
            x = layer(x, cos_sin, metadata)
        return self.ln_f(x)


@register_model("FalconForCausalLM")
class FalconForCausalLM(CausalLM):
    def __init__(self, config):
        super().__init__(config)
        _check(config)
        self.transformer = FalconModel(config)
        self.lm_head = self.make_lm_head()

    def input_embeddings(self) -> nn.Module:
        return self.transformer.word_embeddings

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        return self.transformer(input_ids, positions, metadata)
