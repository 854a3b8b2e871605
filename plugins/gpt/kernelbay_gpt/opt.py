"""OPT (`OPTForCausalLM`): learned positions stored with an offset of 2, separate q/k/v projections (fused here),
a ReLU MLP, LayerNorm before (125m, 1.3b+) or after (350m, `do_layer_norm_before=false`) each block, and
`project_in` / `project_out` where the embeddings are narrower than the model (`word_embed_proj_dim`)."""

from __future__ import annotations

import torch
from torch import nn

from kernelbay import register_model
from kernelbay.attention import AttentionMetadata
from kernelbay_engine.layers import LayerNorm, LearnedPositionEmbedding, Linear, MergedLinear, activation
from kernelbay_engine.loading import NameRules
from kernelbay_engine.models.base import CausalLM, VocabEmbedding

from .layers import AttentionCore, hf_value, refuse

POSITION_OFFSET = 2  # rows fairseq kept before position 0 (padding legacy); transformers keeps them too


class OPTAttention(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        hidden, bias = config.hidden_size, hf_value(config, "enable_bias", True)
        self.qkv_proj = MergedLinear(hidden, {"q_proj": hidden, "k_proj": hidden, "v_proj": hidden}, bias=bias)
        self.out_proj = Linear(hidden, hidden, bias=bias)
        self.core = AttentionCore(config, layer_idx, prefix=f"model.decoder.layers.{layer_idx}.self_attn")

    def forward(self, x: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        return self.out_proj(self.core(q, k, v, None, None, metadata))


class OPTDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        hidden, eps, bias = config.hidden_size, config.rms_norm_eps, hf_value(config, "enable_bias", True)
        self.pre_norm = hf_value(config, "do_layer_norm_before", True)
        self.self_attn = OPTAttention(config, layer_idx)
        self.self_attn_layer_norm = LayerNorm(hidden, eps)
        self.fc1 = Linear(hidden, config.intermediate_size, bias=bias)
        self.fc2 = Linear(config.intermediate_size, hidden, bias=bias)
        self.act_fn = activation(hf_value(config, "activation_function", "relu"))
        self.final_layer_norm = LayerNorm(hidden, eps)

    def forward(self, x: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.self_attn(self.self_attn_layer_norm(x), metadata)
            return x + self._mlp(self.final_layer_norm(x))
        x = self.self_attn_layer_norm(x + self.self_attn(x, metadata))  # post-norm: 350m
        return self.final_layer_norm(x + self._mlp(x))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act_fn(self.fc1(x)))


class OPTDecoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden, width = config.hidden_size, _embed_width(config)
        self.embed_tokens = VocabEmbedding(config.vocab_size, width)
        self.embed_positions = LearnedPositionEmbedding(config.max_position_embeddings, hidden, offset=POSITION_OFFSET)
        if width != hidden:
            self.project_in = Linear(width, hidden)
            self.project_out = Linear(hidden, width)
        self.projected = width != hidden
        self.layers = nn.ModuleList(OPTDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = hf_value(config, "do_layer_norm_before", True) and not hf_value(
            config, "_remove_final_layer_norm", False
        )
        if self.final_norm:
            self.final_layer_norm = LayerNorm(hidden, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [T, word_embed_proj_dim]
        if self.projected:
            x = self.project_in(x)
        x = x + self.embed_positions(positions)  # [T, hidden]
        for layer in self.layers:
            x = layer(x, metadata)
        if self.final_norm:
            x = self.final_layer_norm(x)
        return self.project_out(x) if self.projected else x


class OPTModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.decoder = OPTDecoder(config)


def _embed_width(config) -> int:
    return int(hf_value(config, "word_embed_proj_dim", config.hidden_size))


@register_model("OPTForCausalLM")
class OPTForCausalLM(CausalLM):
    # facebook/opt-* files lack the `model.` prefix that transformers' class adds.
    name_rules = NameRules(renames=((r"^(?!model\.|lm_head\.)", "model."),))

    def __init__(self, config):
        super().__init__(config)
        if not hf_value(config, "layer_norm_elementwise_affine", True):
            refuse(
                config,
                "layer_norm_elementwise_affine=false (LayerNorms without weights) is not supported",
                "no published OPT checkpoint uses it; set it to true if the checkpoint holds LayerNorm weights",
            )
        self.model = OPTModel(config)
        self.lm_head = Linear(_embed_width(config), config.vocab_size, quantizable=False)

    def input_embeddings(self) -> nn.Module:
        return self.model.decoder.embed_tokens

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        return self.model.decoder(input_ids, positions, metadata)
