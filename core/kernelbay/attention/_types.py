"""Small vocabularies of the attention protocol: layer kinds, KV layouts, sparse modes (dtypes: kernelbay.dtypes)."""

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
    def parse(cls, value: str | AttentionType) -> AttentionType:
        try:
            return cls(value)
        except ValueError:
            known = ", ".join(t.value for t in cls)
            raise ValueError(f"unknown attention type {value!r}; use one of: {known}") from None


class KVLayout(str, enum.Enum):
    """How one cache block stores its tokens.

    NHD = [block_size, kv_heads, head_dim], HND = [kv_heads, block_size, head_dim].
    """

    NHD = "NHD"
    HND = "HND"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: str | KVLayout) -> KVLayout:
        try:
            return cls(str(value).upper())
        except ValueError:
            raise ValueError(f"unknown KV layout {value!r}; use 'NHD' or 'HND'") from None


SPARSE_NONE = "none"
SPARSE_DSA = "dsa"
"""DeepSeek sparse attention: each query attends to the top-k keys its layer's lightning indexer picked."""
