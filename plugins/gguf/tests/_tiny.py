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
}
