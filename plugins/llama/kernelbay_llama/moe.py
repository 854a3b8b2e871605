"""The llama family's mixture-of-experts members: Llama's decoder with the engine's shared MoE layer as the FFN of
the layers `config.moe` marks (kernelbay_engine.layers.moe).

- Mixtral: every layer MoE, softmax top-k renormalised; published checkpoints name the block `block_sparse_moe`
  and the experts `w1` (gate) / `w3` (up) / `w2` (down);
- Qwen2-MoE (Qwen1.5-MoE): q/k/v bias, a shared expert scaled by `sigmoid(shared_expert_gate(x))`, dense layers
  between MoE ones (`decoder_sparse_step`, `mlp_only_layers`), `norm_topk_prob`;
- Qwen3-MoE: Qwen3's q/k norm, no shared expert; FP8 block-scaled variants load their experts as stored.
"""

from __future__ import annotations

from functools import partial

from kernelbay import register_model
from kernelbay.errors import ConfigError
from kernelbay_engine.layers.moe import DEFAULT_NAMES, STACKED_EXPERTS, SparseMoE
from kernelbay_engine.loading import NameRules

from .layers import Features
from .modeling import LlamaFamilyForCausalLM, Qwen3ForCausalLM, _hf

_IGNORED = LlamaFamilyForCausalLM.name_rules.ignore


class LlamaMoEForCausalLM(LlamaFamilyForCausalLM):
    """Shared by the MoE members: `expert_names` are the checkpoint's per-expert (gate, up, down) names."""

    expert_names: tuple[str, str, str] = DEFAULT_NAMES
    name_rules = NameRules(renames=(STACKED_EXPERTS,), ignore=_IGNORED)

    @classmethod
    def ffn_factory(cls, config):
        if config.moe is None:
            raise ConfigError(
                f"{config.architecture} needs its experts in config.json (num_experts / num_local_experts and "
                "num_experts_per_tok)"
            )
        return partial(SparseMoE.from_config, config, names=cls.expert_names)


@register_model("MixtralForCausalLM")
class MixtralForCausalLM(LlamaMoEForCausalLM):
    """Mixtral 8x7B / 8x22B."""

    expert_names = ("w1", "w3", "w2")
    name_rules = NameRules(renames=((r"\.block_sparse_moe\.", ".mlp."), STACKED_EXPERTS), ignore=_IGNORED)


@register_model("Qwen2MoeForCausalLM")
class Qwen2MoeForCausalLM(LlamaMoEForCausalLM):
    """Qwen1.5-MoE / Qwen2-MoE: bias on q, k and v (`qkv_bias`), a gated shared expert."""

    @classmethod
    def features(cls, config) -> Features:
        return Features(qkv_bias=bool(_hf(config, "qkv_bias", True)), activation=_hf(config, "hidden_act", "silu"))


@register_model("Qwen3MoeForCausalLM")
class Qwen3MoeForCausalLM(LlamaMoEForCausalLM):
    """Qwen3-30B-A3B / 235B-A22B (and their FP8 variants): Qwen3's q/k norm, routed experts only."""

    @classmethod
    def features(cls, config) -> Features:
        return Qwen3ForCausalLM.features(config)
