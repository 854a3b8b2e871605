"""Architectures of the llama family, registered with kernelbay; each only says how its config maps to `Features`."""

from __future__ import annotations

from dataclasses import replace

from kernelbay import register_model
from kernelbay.errors import ConfigError

from .family import LlamaFamilyForCausalLM, _hf
from .layers import Features


@register_model("LlamaForCausalLM", "MistralForCausalLM")
class LlamaForCausalLM(LlamaFamilyForCausalLM):
    """Llama 2/3/3.1/3.2 and Mistral (sliding window comes from the config's layer types)."""


@register_model("Qwen2ForCausalLM")
class Qwen2ForCausalLM(LlamaFamilyForCausalLM):
    """Qwen2 / Qwen2.5: bias on q, k and v only."""

    @classmethod
    def features(cls, config) -> Features:
        return Features(qkv_bias=True, activation=_hf(config, "hidden_act", "silu"))


@register_model("Qwen3ForCausalLM")
class Qwen3ForCausalLM(LlamaFamilyForCausalLM):
    """Qwen3: RMSNorm on each q and k head before RoPE."""

    @classmethod
    def features(cls, config) -> Features:
        base = LlamaFamilyForCausalLM.features(config)
        return Features(qkv_bias=base.qkv_bias, o_bias=base.o_bias, qk_norm=True, activation=base.activation)


@register_model("Phi3ForCausalLM")
class Phi3ForCausalLM(LlamaFamilyForCausalLM):
    """Phi-3 / Phi-3.5 / Phi-4-mini: fused qkv_proj and gate_up_proj in the checkpoint, no biases."""

    @classmethod
    def features(cls, config) -> Features:
        return Features(activation=_hf(config, "hidden_act", "silu"))


@register_model("Gemma2ForCausalLM")
class Gemma2ForCausalLM(LlamaFamilyForCausalLM):
    """Gemma-2: (1 + w) norms, sandwich norms, scaled embeddings, soft-capping, alternating windows."""

    @classmethod
    def features(cls, config) -> Features:
        bias = bool(_hf(config, "attention_bias", False))
        act = _hf(config, "hidden_activation", None) or _hf(config, "hidden_act", "gelu_pytorch_tanh")
        return Features(qkv_bias=bias, o_bias=bias, gemma=True, activation=act)


@register_model("Gemma3ForCausalLM")
class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma 3 text (gemma3_text): Gemma-2's layers plus (1 + w) q/k norms; 5 sliding layers per global one,
    which rotate with their own base (`rope_local_base_freq`) while only the global layers take rope_scaling."""

    @classmethod
    def features(cls, config) -> Features:
        if _hf(config, "use_bidirectional_attention", False):
            raise ConfigError(
                "use_bidirectional_attention=true (an embedding model such as EmbeddingGemma) is not a causal LM; "
                "kernelbay builds Gemma3ForCausalLM with causal attention only."
            )
        return replace(Gemma2ForCausalLM.features(config), qk_norm=True)
