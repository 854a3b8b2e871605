"""The llama family's shared causal LM. It registers nothing, so a provider module building on it (gpt_oss) does not
import modeling's registrations as its own: the registry credits what an import registers to the imported provider
(`kernelbay doctor` checks each registers only what it advertises)."""

from __future__ import annotations

import torch

from kernelbay.attention import AttentionMetadata
from kernelbay_engine.loading import NameRules
from kernelbay_engine.models.base import CausalLM

from .layers import Features, LlamaModel


def _hf(config, name: str, default=None):
    value = getattr(config.hf_config, name, default)
    return default if value is None else value


class LlamaFamilyForCausalLM(CausalLM):
    """The shared implementation; subclasses override `features`."""

    # Old checkpoints store rotary tables; they are recomputed, never loaded.
    name_rules = NameRules(ignore=(r".*\.rotary_emb\.inv_freq",))

    @classmethod
    def features(cls, config) -> Features:
        bias = bool(_hf(config, "attention_bias", False))
        return Features(
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=bool(_hf(config, "mlp_bias", False)),
            activation=_hf(config, "hidden_act", "silu"),
        )

    def __init__(self, config):
        super().__init__(config)
        features = self.features(config)
        self.model = LlamaModel(config, features, self.ffn_factory(config))
        self.lm_head = self.make_lm_head()
        self.final_logit_softcap = config.final_logit_softcapping

    @classmethod
    def ffn_factory(cls, config):
        """`layer_idx -> FFN module or None` for the layers whose FFN is not the dense MLP (MoE members, see
        moe.py); None: every layer dense."""
        return None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, metadata)
