"""Small vocabularies shared by the attention protocol: layer kinds, KV layouts, dtype names."""

from __future__ import annotations

import enum


class AttentionType(str, enum.Enum):
    """What an attention layer attends to; values match `ModelConfig.layer_types`."""

    FULL = "full_attention"
    SLIDING = "sliding_attention"
    CHUNKED = "chunked_attention"
    ENCODER = "encoder_attention"
    """Bidirectional (vision encoders): no causal mask."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: "str | AttentionType") -> "AttentionType":
        try:
            return cls(value)
        except ValueError:
            known = ", ".join(t.value for t in cls)
            raise ValueError(f"unknown attention type {value!r}; use one of: {known}") from None


class KVLayout(str, enum.Enum):
    """How one cache block stores its tokens: NHD = [block_size, kv_heads, head_dim], HND = [kv_heads, block_size, head_dim]."""

    NHD = "NHD"
    HND = "HND"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: "str | KVLayout") -> "KVLayout":
        try:
            return cls(str(value).upper())
        except ValueError:
            raise ValueError(f"unknown KV layout {value!r}; use 'NHD' or 'HND'") from None


MODEL_DTYPES = ("float32", "bfloat16", "float16")
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "fp8_e4m3")
_KV_ALIASES = {"fp8": "fp8_e4m3", "fp8-e4m3": "fp8_e4m3", "fp8_e4m3fn": "fp8_e4m3", "e4m3": "fp8_e4m3",
               "fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8_e4m3": 1}
SPARSE_NONE = "none"


def normalize_dtype(name: str) -> str:
    """Canonical model dtype name ("float32", "bfloat16", "float16")."""
    canon = _KV_ALIASES.get(str(name).lower().removeprefix("torch."), str(name).lower().removeprefix("torch."))
    if canon not in MODEL_DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of: {', '.join(MODEL_DTYPES)}")
    return canon


def normalize_kv_cache_dtype(name: str | None) -> str:
    """Canonical KV-cache dtype name; None means "auto" (the model dtype)."""
    if name is None:
        return "auto"
    canon = str(name).lower().removeprefix("torch.")
    canon = _KV_ALIASES.get(canon, canon)
    if canon not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown KV-cache dtype {name!r}; use one of: {', '.join(KV_CACHE_DTYPES)}")
    return canon


def storage_dtype(kv_cache_dtype: str | None, model_dtype: str) -> str:
    """The dtype the cache really stores: "auto" resolves to the model dtype."""
    kv = normalize_kv_cache_dtype(kv_cache_dtype)
    return normalize_dtype(model_dtype) if kv == "auto" else kv
