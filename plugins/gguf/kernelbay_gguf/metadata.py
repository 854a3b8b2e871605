"""GGUF metadata -> the Hugging Face config.json fields kernelbay reads, per architecture it serves.

Key names follow llama.cpp's `gguf` constants (`{arch}.embedding_length`, ...). A key the model
needs and the file lacks is an error naming it; an architecture without a mapping here is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kernelbay.errors import MalformedConfig, UnsupportedArchitecture

DEFAULT_EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class Architecture:
    """One GGUF architecture: the HF class it loads as, and how llama.cpp's converter changed its tensors."""

    hf_architecture: str
    model_type: str
    permuted_qk: bool = False  # convert_hf_to_gguf interleaves Q/K rows for its rotary layout (Llama only)
    block_names: Mapping[str, str] = field(default_factory=dict)  # GGUF block tensor -> HF name, where not Llama's
    norm_offset: float = 0.0  # added back to every norm weight on read (Gemma's converter stores 1 + w)
    keys: Mapping[str, str] = field(default_factory=dict)  # further GGUF keys (after "{arch}.") -> config fields
    defaults: Mapping[str, Any] = field(default_factory=dict)  # config fields llama.cpp fixes and GGUF never says
    expert_names: tuple[str, str, str] = DEFAULT_EXPERT_NAMES  # HF per-expert (gate, up, down) names
    # config_dict holds every field kernelbay reads: no default of transformers' config class adds one (tested
    # against transformers' own parse of each architecture), so that class need not be imported (LlamaConfig's
    # import chain alone costs ~0.9 s and ~57 MiB)
    complete_config: bool = True


_GEMMA_BLOCKS = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_EXPERTS = {"expert_count": "num_experts", "expert_used_count": "num_experts_per_tok"}
_EXPERT_WIDTHS = {
    "expert_feed_forward_length": "moe_intermediate_size",
    "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
}
# Gemma's query_pre_attn_scalar and Gemma 3's sliding-layer pattern, Qwen2-MoE's shared-expert gate: class
# defaults GGUF has no key for (complete_config=False: transformers' class parses the file's fields)
ARCHITECTURES = {
    "llama": Architecture("LlamaForCausalLM", "llama", permuted_qk=True),
    "qwen2": Architecture("Qwen2ForCausalLM", "qwen2", defaults={"use_sliding_window": False}),
    "qwen3": Architecture("Qwen3ForCausalLM", "qwen3"),
    "gemma2": Architecture(
        "Gemma2ForCausalLM", "gemma2", block_names=_GEMMA_BLOCKS, norm_offset=-1.0, complete_config=False
    ),
    "gemma3": Architecture(
        "Gemma3ForCausalLM", "gemma3_text", block_names=_GEMMA_BLOCKS, norm_offset=-1.0, complete_config=False
    ),
    "phi3": Architecture("Phi3ForCausalLM", "phi3", block_names={"ffn_up": "mlp.gate_up_proj"}),
    "qwen2moe": Architecture(
        "Qwen2MoeForCausalLM", "qwen2_moe", keys={**_EXPERTS, **_EXPERT_WIDTHS}, complete_config=False
    ),
    # llama.cpp renormalises Qwen3-MoE's top-k weights (transformers' GGUF loader sets the same default)
    "qwen3moe": Architecture(
        "Qwen3MoeForCausalLM", "qwen3_moe", keys={**_EXPERTS, **_EXPERT_WIDTHS}, defaults={"norm_topk_prob": True}
    ),
}
# Mixtral files say general.architecture "llama" and carry experts: told apart by llama.expert_count.
MIXTRAL = Architecture(
    "MixtralForCausalLM",
    "mixtral",
    permuted_qk=True,
    keys={"expert_count": "num_local_experts", "expert_used_count": "num_experts_per_tok"},
    expert_names=("w1", "w3", "w2"),
)
# Architectures kernelbay serves from safetensors but not from GGUF, and why.
REFUSED = {
    "gemma": "transformers cannot load Gemma 1 GGUF files, so kernelbay-gguf has no reference to verify its "
    "mapping against; convert the model to a safetensors folder (kernelbay serves GemmaForCausalLM from one)",
}

# GGUF key (after "{arch}.") -> config.json field; the required ones first.
REQUIRED_KEYS = {
    "embedding_length": "hidden_size",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "context_length": "max_position_embeddings",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
}
OPTIONAL_KEYS = {
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "rope.freq_base": "rope_theta",
    "attention.sliding_window": "sliding_window",
    "attn_logit_softcapping": "attn_logit_softcapping",
    "final_logit_softcapping": "final_logit_softcapping",
    "vocab_size": "vocab_size",
}
TOKEN_KEYS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id"}


def architecture(fields: dict[str, Any], source: str) -> tuple[str, Architecture]:
    """The file's `general.architecture` (its metadata key prefix) and kernelbay's mapping for it."""
    name = fields.get("general.architecture")
    if not isinstance(name, str):
        raise MalformedConfig(f"{source} has no general.architecture key; it is not a model GGUF file")
    if name in REFUSED:
        raise UnsupportedArchitecture(f"{source}: GGUF architecture {name!r} is not supported: {REFUSED[name]}")
    arch = ARCHITECTURES.get(name)
    if arch is None:
        raise UnsupportedArchitecture(
            f"{source}: GGUF architecture {name!r} is not supported by kernelbay-gguf "
            f"(supported: {', '.join(sorted(ARCHITECTURES))}, and llama files with experts as Mixtral); "
            f"convert the model to a safetensors folder instead"
        )
    if name == "llama" and f"{name}.expert_count" in fields:
        return name, MIXTRAL
    return name, arch


def config_dict(fields: dict[str, Any], tensor_names: set[str], source: str) -> dict[str, Any]:
    """config.json as the file's metadata says it (`fields`: key -> decoded value)."""
    name, arch = architecture(fields, source)
    missing = [f"{name}.{key}" for key in REQUIRED_KEYS if f"{name}.{key}" not in fields]
    if missing:
        raise MalformedConfig(f"{source} lacks the metadata key(s) {', '.join(missing)}; the file is incomplete")
    config: dict[str, Any] = {"model_type": arch.model_type, "architectures": [arch.hf_architecture]}
    for key, hf_field in {**REQUIRED_KEYS, **OPTIONAL_KEYS, **arch.keys}.items():
        if f"{name}.{key}" in fields:
            config[hf_field] = fields[f"{name}.{key}"]
    for key, hf_field in TOKEN_KEYS.items():
        if f"tokenizer.ggml.{key}" in fields:
            config[hf_field] = fields[f"tokenizer.ggml.{key}"]
    if "vocab_size" not in config:
        config["vocab_size"] = _vocab_size(fields, source)
    scaling = _rope_scaling(fields, name, config, tensor_names, source)
    if scaling:
        config["rope_scaling"] = scaling
    config["tie_word_embeddings"] = "output.weight" not in tensor_names
    config["dtype"] = "float32"  # quantized tensors dequantize to float32 exactly
    return {**config, **arch.defaults}


def _vocab_size(fields: dict[str, Any], source: str) -> int:
    tokens = fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise MalformedConfig(f"{source} has neither a vocab_size key nor tokenizer.ggml.tokens to count")
    return tokens  # an array is given as its length (kernelbay_gguf.header)


ROPE_FACTOR_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


def _rope_scaling(fields: dict[str, Any], name: str, config: dict, tensor_names: set[str], source: str) -> dict | None:
    """The config's rope_scaling: linear scaling maps (Gemma 3's global layers, linear-scaled Llamas); any other
    scaling, per-frequency factors or partial rotary embeddings are refused rather than silently run unscaled."""
    kind = fields.get(f"{name}.rope.scaling.type", "none")
    factors = [t for t in ROPE_FACTOR_TENSORS if t in tensor_names]
    if factors:
        raise MalformedConfig(
            f"{source} uses per-frequency rope factors ({factors[0]}), which kernelbay-gguf does not map yet"
        )
    rotary = fields.get(f"{name}.rope.dimension_count")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if rotary is not None and rotary != head_dim:
        raise MalformedConfig(
            f"{source}: {name}.rope.dimension_count {rotary} differs from the head size {head_dim} (partial rotary "
            f"embeddings), which kernelbay-gguf does not map yet; convert the model to a safetensors folder"
        )
    if kind in ("none", None):
        return None
    factor = fields.get(f"{name}.rope.scaling.factor")
    if kind != "linear" or factor is None:
        what = f"rope scaling {kind!r}" + ("" if kind != "linear" else f" without {name}.rope.scaling.factor")
        raise MalformedConfig(f"{source} uses {what}, which kernelbay-gguf does not map yet (it maps 'linear')")
    return {"rope_type": "linear", "factor": float(factor)}
