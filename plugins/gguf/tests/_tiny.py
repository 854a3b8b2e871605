"""Tiny configs of the GGUF architectures kernelbay-gguf maps (kept beside its tests)."""

from __future__ import annotations

import transformers

from tests.models._tiny import COMMON, Tiny

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
}
