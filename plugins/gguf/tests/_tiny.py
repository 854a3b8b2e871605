"""Tiny configs of the GGUF architectures kernelbay-gguf maps (kept beside its tests).

A field GGUF has no key for takes its class default in both readers, so these configs keep the defaults
there (Qwen-MoE expert widths: transformers' GGUF reader ignores `expert_feed_forward_length`)."""

from __future__ import annotations

import transformers

from tests.models._tiny import COMMON, Tiny

_MOE = dict(num_experts=4, num_experts_per_tok=2)
TINY_GGUF: dict[str, tuple[str, Tiny]] = {
    # name -> (GGUF architecture, tiny HF config)
    "llama": ("llama", Tiny("smollm2-135m", lambda: transformers.LlamaConfig(**COMMON, rope_theta=100000.0))),
    "qwen2": ("qwen2", Tiny("qwen2-0.5b", lambda: transformers.Qwen2Config(**COMMON, tie_word_embeddings=True))),
    "qwen3": (
        "qwen3",
        # head_dim 128 as in Qwen3: transformers' GGUF reader ignores attention.key_length (kernelbay maps it)
        Tiny("qwen3-0.6b", lambda: transformers.Qwen3Config(**COMMON, head_dim=128, tie_word_embeddings=True)),
    ),
    "gemma2": (
        "gemma2",
        # query_pre_attn_scalar: GGUF has no key for it, transformers (and kernelbay) take the class default 256
        Tiny(
            "gemma-2-2b",
            lambda: transformers.Gemma2Config(
                **COMMON, head_dim=24, sliding_window=5, attn_logit_softcapping=50.0, final_logit_softcapping=30.0
            ),
        ),
    ),
    "gemma3": (
        "gemma3",
        # six layers: the default pattern makes every sixth global; the local rope base has no key (default)
        Tiny(
            "gemma-3-1b-it",
            lambda: transformers.Gemma3TextConfig(**{**COMMON, "num_hidden_layers": 6}, head_dim=16, sliding_window=5),
        ),
    ),
    "phi3": (
        "phi3",
        # Phi-3's vocabulary: GGUF has no pad key, and transformers' class default pad id 32000 must fit in it
        Tiny("phi-3-mini-4k-instruct", lambda: transformers.Phi3Config(**{**COMMON, "vocab_size": 32064})),
    ),
    "qwen2moe": ("qwen2moe", Tiny("qwen1.5-moe-a2.7b", lambda: transformers.Qwen2MoeConfig(**COMMON, **_MOE))),
    "qwen3moe": (
        "qwen3moe",
        # norm_topk_prob: llama.cpp renormalises Qwen3-MoE's top-k, transformers' GGUF reader defaults to it
        Tiny("qwen3-30b-a3b", lambda: transformers.Qwen3MoeConfig(**COMMON, **_MOE, head_dim=16, norm_topk_prob=True)),
    ),
}
