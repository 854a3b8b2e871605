"""GPT-2 (`GPT2LMHeadModel`): learned positions, pre-norm LayerNorm blocks, a GELU MLP, and Conv1D projections
whose checkpoint weights are stored transposed ([in, out]); the fused `c_attn` holds q, k, v one after another."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from kernelbay import register_model
from kernelbay.attention import AttentionMetadata
from kernelbay_engine.layers import MLP, LayerNorm, LearnedPositionEmbedding, Linear, MergedLinear
from kernelbay_engine.loading import NameRules
from kernelbay_engine.models.base import CausalLM, VocabEmbedding

from .layers import AttentionCore, hf_value, refuse, residual


def _scale(config, layer_idx: int) -> float:
    """transformers' GPT-2 softmax scale: 1/sqrt(head_dim) unless scale_attn_weights is off, / (layer + 1)
    with scale_attn_by_inverse_layer_idx."""
    scale = config.head_dim**-0.5 if hf_value(config, "scale_attn_weights", True) else 1.0
    return scale / (layer_idx + 1) if hf_value(config, "scale_attn_by_inverse_layer_idx", False) else scale


class GPT2Attention(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        hidden = config.hidden_size
        width = config.num_attention_heads * config.head_dim  # hidden, or a tensor-parallel rank's share of it
        # parts name the thirds of the fused tensor, so a tensor-parallel rank reads its heads of each
        parts = {"q": width, "k": width, "v": width}
        self.c_attn = MergedLinear(hidden, parts, bias=True, checkpoint_transposed=True)
        self.c_proj = Linear(width, hidden, bias=True, checkpoint_transposed=True)
        self.core = AttentionCore(
            config, layer_idx, prefix=f"transformer.h.{layer_idx}.attn", scale=_scale(config, layer_idx)
        )

    def forward(self, x: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.c_attn(x).chunk(3, dim=-1)
        return self.c_proj(self.core(q, k, v, None, None, metadata))


class GPT2Block(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.ln_1 = LayerNorm(hidden, eps)
        self.attn = GPT2Attention(config, layer_idx)
        self.ln_2 = LayerNorm(hidden, eps)
        act = hf_value(config, "activation_function", "gelu_new")
        self.mlp = MLP(hidden, config.intermediate_size, act, names=("c_fc", "c_proj"), transposed=True)

    def forward(self, x: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        return residual(x, partial(self.attn, metadata=metadata), self.mlp, self.ln_1, self.ln_2, parallel=False)


class GPT2Model(nn.Module):
    """The checkpoint's `transformer.`: token and position tables, blocks, final norm."""

    def __init__(self, config):
        super().__init__()
        self.wte = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.wpe = LearnedPositionEmbedding(config.max_position_embeddings, config.hidden_size)
        self.h = nn.ModuleList(GPT2Block(config, i) for i in range(config.num_hidden_layers))
        self.ln_f = LayerNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        x = self.wte(input_ids) + self.wpe(positions)  # [T, hidden]
        for block in self.h:
            x = block(x, metadata)
        return self.ln_f(x)


@register_model("GPT2LMHeadModel")
class GPT2LMHeadModel(CausalLM):
    # OpenAI's published files lack the `transformer.` prefix; old ones also store the causal-mask buffers.
    name_rules = NameRules(
        renames=((r"^(?!transformer\.|lm_head\.)", "transformer."),),
        ignore=(r".*\.attn\.(bias|masked_bias)",),
    )

    def __init__(self, config):
        super().__init__(config)
        if hf_value(config, "add_cross_attention", False):
            refuse(
                config, "add_cross_attention=true is an encoder-decoder GPT-2", "kernelbay serves decoder-only GPT-2"
            )
        self.transformer = GPT2Model(config)
        self.lm_head = self.make_lm_head()

    def input_embeddings(self) -> nn.Module:
        return self.transformer.wte

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        return self.transformer(input_ids, positions, metadata)
