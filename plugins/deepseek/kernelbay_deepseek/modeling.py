"""DeepSeek-V2, -V3 and -V3.2 causal LMs: MLA attention (V3.2: sparse, DSA), dense MLPs in the first layers, MoE
after."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kernelbay import register_model
from kernelbay.attention import AttentionMetadata
from kernelbay.errors import ConfigError
from kernelbay_engine.layers import GatedMLP, RMSNorm
from kernelbay_engine.layers.moe import STACKED_EXPERTS
from kernelbay_engine.loading import NameRules
from kernelbay_engine.models.base import CausalLM, VocabEmbedding

from .mla import MLAAttention, mla_rotary
from .moe import deepseek_moe


@dataclass(frozen=True, slots=True)
class Variant:
    """What V2 and V3 do differently beyond what config.json states."""

    interleaved_rope: bool = True  # RoPE rotates (x0, x1), (x2, x3) pairs
    default_routing: tuple[str, str] = ("softmax", "greedy")  # (scoring_func, topk_method) when not written


def _is_moe_layer(hf, layer_idx: int) -> bool:
    listed = getattr(hf, "mlp_layer_types", None)  # V3.2 writes each layer's MLP kind
    if listed is not None:
        return listed[layer_idx] == "sparse"
    freq = getattr(hf, "moe_layer_freq", None) or 1
    return (
        getattr(hf, "n_routed_experts", None) is not None
        and layer_idx >= (hf.first_k_dense_replace or 0)
        and layer_idx % freq == 0
    )


class DeepseekDecoderLayer(nn.Module):
    def __init__(self, config, variant: Variant, layer_idx: int, rotary):
        super().__init__()
        hf = config.hf_config
        self.self_attn = MLAAttention(config, layer_idx, rotary)
        if _is_moe_layer(hf, layer_idx):
            self.mlp = deepseek_moe(config, variant.default_routing)
        else:
            self.mlp = GatedMLP(
                config.hidden_size,
                config.intermediate_size,
                getattr(hf, "hidden_act", "silu"),
                bias=bool(getattr(hf, "mlp_bias", False)),
            )
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos_sin, metadata: AttentionMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos_sin, metadata)
        return x + self.mlp(self.post_attention_layernorm(x))


class DeepseekModel(nn.Module):
    def __init__(self, config, variant: Variant):
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = mla_rotary(config, variant.interleaved_rope)
        self.layers = nn.ModuleList(
            DeepseekDecoderLayer(config, variant, i, self.rotary_emb) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos_sin = self.rotary_emb.cos_sin(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos_sin, metadata)
        return self.norm(x)


class DeepseekForCausalLM(CausalLM):
    """Shared by V2 and V3; subclasses give their `Variant`.

    Experts load from per-expert tensors (`experts.<e>.gate_proj.weight`, the published format) or from
    transformers' stacked in-memory format (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]).
    """

    name_rules = NameRules(renames=(STACKED_EXPERTS,))

    def __init__(self, config):
        super().__init__(config)
        if config.mla is None:
            raise ConfigError(
                f"{config.architecture} needs MLA geometry (kv_lora_rank, qk_nope_head_dim, "
                f"qk_rope_head_dim, v_head_dim) in config.json"
            )
        self.model = DeepseekModel(config, self.variant(config))
        self.lm_head = self.make_lm_head()

    @classmethod
    def variant(cls, config) -> Variant:
        return Variant()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, metadata)

    def checkpoint_rules(self) -> NameRules:
        """Skip the multi-token-prediction layers stored after the last decoder layer (V3's layer 61)."""
        rules = super().checkpoint_rules()
        extra = getattr(self.config.hf_config, "num_nextn_predict_layers", None) or 0
        first = self.config.num_hidden_layers
        mtp = tuple(rf"model\.layers\.{i}\..*" for i in range(first, first + extra))
        return NameRules(rules.renames, (*rules.ignore, *mtp), rules.tied)


@register_model("DeepseekV2ForCausalLM")
class DeepseekV2ForCausalLM(DeepseekForCausalLM):
    """DeepSeek-V2 / V2-Lite / Coder-V2: softmax routing, optional q_lora_rank."""


@register_model("DeepseekV3ForCausalLM")
class DeepseekV3ForCausalLM(DeepseekForCausalLM):
    """DeepSeek-V3 / R1: sigmoid `noaux_tc` grouped routing, FP8 block-scaled checkpoints."""

    @classmethod
    def variant(cls, config) -> Variant:
        interleave = getattr(config.hf_config, "rope_interleave", None)
        return Variant(
            interleaved_rope=True if interleave is None else bool(interleave), default_routing=("sigmoid", "noaux_tc")
        )


@register_model("DeepseekV32ForCausalLM")
class DeepseekV32ForCausalLM(DeepseekV3ForCausalLM):
    """DeepSeek-V3.2: V3 plus DeepSeek sparse attention (a lightning indexer per layer picks the top-k keys
    each query attends to; backends must declare sparse mode "dsa")."""

    def __init__(self, config):
        if config.indexer is None:
            raise ConfigError(
                f"{config.architecture} needs its DSA indexer geometry (index_n_heads, index_head_dim, "
                "index_topk) in config.json"
            )
        super().__init__(config)
