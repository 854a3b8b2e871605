"""GPT-NeoX (`GPTNeoXForCausalLM`: Pythia, RedPajama-INCITE): a fused `query_key_value` interleaved per head
([heads, 3, head_dim]), partial rotary (`rotary_pct`), a GELU MLP, optional parallel residual, untied `embed_out`."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from kernelbay import register_model
from kernelbay.attention import AttentionMetadata
from kernelbay_engine.layers import MLP, LayerNorm, Linear, RotaryEmbedding
from kernelbay_engine.loading import NameRules
from kernelbay_engine.models.base import CausalLM, VocabEmbedding, rope_params

from .layers import AttentionCore, CosSin, hf_value, residual, split_grouped_qkv


class GPTNeoXAttention(nn.Module):
    def __init__(self, config, layer_idx: int, rotary: RotaryEmbedding):
        super().__init__()
        hidden, bias = config.hidden_size, hf_value(config, "attention_bias", True)
        self.query_key_value = Linear(hidden, 3 * hidden, bias=bias)
        self.dense = Linear(hidden, hidden, bias=bias)
        self.core = AttentionCore(config, layer_idx, prefix=f"gpt_neox.layers.{layer_idx}.attention")
        self.rotary = rotary  # shared by every layer; holds no parameters

    def forward(self, x: torch.Tensor, cos_sin: CosSin, metadata: AttentionMetadata) -> torch.Tensor:
        heads, kv_heads, head_dim = self.core.shape
        q, k, v = split_grouped_qkv(self.query_key_value(x), heads, kv_heads, head_dim)
        return self.dense(self.core(q, k, v, self.rotary, cos_sin, metadata))


class GPTNeoXLayer(nn.Module):
    def __init__(self, config, layer_idx: int, rotary: RotaryEmbedding):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = LayerNorm(hidden, eps)
        self.post_attention_layernorm = LayerNorm(hidden, eps)
        self.attention = GPTNeoXAttention(config, layer_idx, rotary)
        act = hf_value(config, "hidden_act", "gelu")
        self.mlp = MLP(hidden, config.intermediate_size, act, names=("dense_h_to_4h", "dense_4h_to_h"))
        self.parallel = bool(hf_value(config, "use_parallel_residual", True))

    def forward(self, x: torch.Tensor, cos_sin: CosSin, metadata: AttentionMetadata) -> torch.Tensor:
        attend = partial(self.attention, cos_sin=cos_sin, metadata=metadata)
        return residual(
            x, attend, self.mlp, self.input_layernorm, self.post_attention_layernorm, parallel=self.parallel
        )


class GPTNeoXModel(nn.Module):
    """The checkpoint's `gpt_neox.`: embeddings, layers, final norm."""

    def __init__(self, config):
        super().__init__()
        self.embed_in = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = RotaryEmbedding(rope_params(config))
        self.layers = nn.ModuleList(GPTNeoXLayer(config, i, self.rotary_emb) for i in range(config.num_hidden_layers))
        self.final_layer_norm = LayerNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        x = self.embed_in(input_ids)  # [T, hidden]
        cos_sin = self.rotary_emb.cos_sin(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos_sin, metadata)
        return self.final_layer_norm(x)


@register_model("GPTNeoXForCausalLM")
class GPTNeoXForCausalLM(CausalLM):
    # Old checkpoints store the causal-mask buffers and rotary tables: recomputed, never loaded.
    name_rules = NameRules(ignore=(r".*\.attention\.(bias|masked_bias)", r".*\.rotary_emb\.inv_freq"))

    def __init__(self, config):
        super().__init__(config)
        self.gpt_neox = GPTNeoXModel(config)
        self.embed_out = self.make_lm_head()

    @property
    def lm_head(self) -> nn.Module:
        """NeoX names its LM head `embed_out`."""
        return self.embed_out

    def input_embeddings(self) -> nn.Module:
        return self.gpt_neox.embed_in

    def checkpoint_rules(self) -> NameRules:
        """Tied: a stored `embed_out.weight` duplicates the embedding table and is skipped (base: `lm_head`)."""
        rules = super().checkpoint_rules()
        return NameRules(rules.renames, rules.ignore, (*rules.tied, "embed_out.weight")) if self.tied else rules

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        return self.gpt_neox(input_ids, positions, metadata)
