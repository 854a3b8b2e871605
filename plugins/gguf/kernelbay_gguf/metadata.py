"""GGUF metadata -> the Hugging Face config.json fields kernelbay reads, per architecture it serves.

Key names follow llama.cpp's `gguf` constants (`{arch}.embedding_length`, ...). A key the model
needs and the file lacks is an error naming it; an architecture without a mapping here is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kernelbay.errors import MalformedConfig, UnsupportedArchitecture


@dataclass(frozen=True, slots=True)
class Architecture:
    """One GGUF architecture: the HF class it loads as, and how llama.cpp's converter changed its tensors."""

    hf_architecture: str
    model_type: str
    permuted_qk: bool  # convert_hf_to_gguf interleaves Q/K rows for its rotary layout (Llama only)
    block_names: Mapping[str, str] = field(default_factory=dict)  # GGUF block tensor -> HF name, where not Llama's
    norm_offset: float = 0.0  # added back to every norm weight on read (Gemma's converter stores 1 + w)


_GEMMA2_BLOCKS = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
ARCHITECTURES = {
    "llama": Architecture("LlamaForCausalLM", "llama", permuted_qk=True),
    "qwen2": Architecture("Qwen2ForCausalLM", "qwen2", permuted_qk=False),
    "qwen3": Architecture("Qwen3ForCausalLM", "qwen3", permuted_qk=False),
    "gemma2": Architecture("Gemma2ForCausalLM", "gemma2", False, _GEMMA2_BLOCKS, norm_offset=-1.0),
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
    """The file's `general.architecture` and kernelbay's mapping for it."""
    name = fields.get("general.architecture")
    if not isinstance(name, str):
        raise MalformedConfig(f"{source} has no general.architecture key; it is not a model GGUF file")
    arch = ARCHITECTURES.get(name)
    if arch is None:
        raise UnsupportedArchitecture(
            f"{source}: GGUF architecture {name!r} is not supported by kernelbay-gguf "
            f"(supported: {', '.join(sorted(ARCHITECTURES))}); convert the model to a safetensors folder instead"
        )
    return name, arch


def config_dict(fields: dict[str, Any], tensor_names: set[str], source: str) -> dict[str, Any]:
    """config.json as the file's metadata says it (`fields`: key -> decoded value)."""
    name, arch = architecture(fields, source)
    missing = [f"{name}.{key}" for key in REQUIRED_KEYS if f"{name}.{key}" not in fields]
    if missing:
        raise MalformedConfig(f"{source} lacks the metadata key(s) {', '.join(missing)}; the file is incomplete")
    config: dict[str, Any] = {"model_type": arch.model_type, "architectures": [arch.hf_architecture]}
    for key, hf_field in {**REQUIRED_KEYS, **OPTIONAL_KEYS}.items():
        if f"{name}.{key}" in fields:
            config[hf_field] = fields[f"{name}.{key}"]
    for key, hf_field in TOKEN_KEYS.items():
        if f"tokenizer.ggml.{key}" in fields:
            config[hf_field] = fields[f"tokenizer.ggml.{key}"]
    if "vocab_size" not in config:
        config["vocab_size"] = _vocab_size(fields, source)
    _check_rope_scaling(fields, name, tensor_names, source)
    config["tie_word_embeddings"] = "output.weight" not in tensor_names
    config["dtype"] = "float32"  # quantized tensors dequantize to float32 exactly
    if arch.model_type == "qwen2":
        config["use_sliding_window"] = False  # a Qwen2 GGUF carries no window: full attention everywhere
    return config


def _vocab_size(fields: dict[str, Any], source: str) -> int:
    tokens = fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise MalformedConfig(f"{source} has neither a vocab_size key nor tokenizer.ggml.tokens to count")
    return len(tokens)


def _check_rope_scaling(fields: dict[str, Any], name: str, tensor_names: set[str], source: str) -> None:
    """Scaled rotary embeddings are refused rather than silently run unscaled."""
    kind = fields.get(f"{name}.rope.scaling.type", "none")
    if kind not in ("none", None) or "rope_freqs.weight" in tensor_names:
        what = f"rope scaling {kind!r}" if kind not in ("none", None) else "per-frequency rope factors (rope_freqs)"
        raise MalformedConfig(f"{source} uses {what}, which kernelbay-gguf does not map yet")
