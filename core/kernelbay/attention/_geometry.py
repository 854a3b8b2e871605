"""The resolved shape of one attention layer, validated once at construction, and the small vocabularies of
the protocol: layer kinds, KV layouts, sparse modes (dtypes: kernelbay.dtypes)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


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


_MLA_FIELDS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@dataclass(frozen=True, slots=True)
class MLASpec:
    """Multi-head latent attention geometry (DeepSeek-V2/V3). `q_lora_rank` may be None (V2-Lite)."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    def __post_init__(self):
        _require_positive("MLA", self, ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"))
        if not isinstance(self.qk_rope_head_dim, int) or self.qk_rope_head_dim < 0:
            raise ValueError(f"MLA qk_rope_head_dim must be an int >= 0, got {self.qk_rope_head_dim!r}")
        if self.q_lora_rank is not None:
            _require_positive("MLA", self, ("q_lora_rank",), " or None")

    @property
    def latent_dim(self) -> int:
        """What the cache stores per token: kv_lora_rank + qk_rope_head_dim."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @classmethod
    def from_any(cls, mla) -> MLASpec:
        """From an MLASpec, a config `MLAGeometry`-like object or a mapping; names every missing field."""
        if isinstance(mla, cls):
            return mla
        found = _fields_of(mla, (*_MLA_FIELDS, "q_lora_rank"))
        missing = [f for f in _MLA_FIELDS if found[f] is None]
        if missing:
            raise ValueError(
                f"MLA geometry is incomplete: missing {', '.join(missing)} "
                f"(MLA needs {', '.join(_MLA_FIELDS)}; q_lora_rank may be None)"
            )
        return cls(**found)


def _fields_of(record, names: tuple[str, ...]) -> dict[str, Any]:
    """`names` read off a mapping or an object (None where absent)."""
    get: Callable[[str], Any] = record.get if isinstance(record, Mapping) else (lambda k: getattr(record, k, None))
    return {name: get(name) for name in names}


def _require_positive(what: str, record, names: tuple[str, ...], alternative: str = "") -> None:
    for name in names:
        value = getattr(record, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} {name} must be a positive int{alternative}, got {value!r}")


_INDEXER_FIELDS = ("index_n_heads", "index_head_dim", "index_topk")


@dataclass(frozen=True, slots=True)
class IndexerSpec:
    """DeepSeek sparse attention (V3.2): a lightning indexer scores every cached key with `index_n_heads`
    heads of `index_head_dim` and each query attends to its `index_topk` best. The indexer caches one
    `index_head_dim` key per token beside the MLA latent (model dtype here; fp8 in DeepSeek's kernels)."""

    index_n_heads: int
    index_head_dim: int
    index_topk: int

    def __post_init__(self):
        _require_positive("indexer", self, _INDEXER_FIELDS)

    @classmethod
    def from_any(cls, indexer) -> IndexerSpec:
        """From an IndexerSpec, a config `IndexerGeometry`-like object or a mapping; names every missing field."""
        if isinstance(indexer, cls):
            return indexer
        found = _fields_of(indexer, _INDEXER_FIELDS)
        missing = [f for f in _INDEXER_FIELDS if found[f] is None]
        if missing:
            raise ValueError(f"indexer geometry is incomplete: missing {', '.join(missing)}")
        return cls(**found)


@dataclass(frozen=True, slots=True)
class AttentionGeometry:
    """Everything about a layer that does not change from step to step."""

    layer_idx: int
    num_heads: int
    head_dim: int
    """Query/key head size; for MLA qk_nope_head_dim + qk_rope_head_dim."""
    num_kv_heads: int
    scale: float
    attn_type: AttentionType = AttentionType.FULL
    sliding_window: int | None = None
    """Keys at most `sliding_window - 1` positions behind the query are visible (HF convention)."""
    chunk_size: int | None = None
    """Chunked attention (Llama 4): a query sees keys of its own `chunk_size`-aligned chunk only."""
    logit_softcap: float | None = None
    mla: MLASpec | None = None
    indexer: IndexerSpec | None = None
    """DSA layers: the indexer whose top-k keys each query attends to (sparse mode "dsa"); MLA only."""
    sinks: bool = False
    """Attention sinks (GPT-OSS): a learned logit per query head joins each softmax denominator with no value,
    so a query may attend to "nothing"; the values reach the backend as `AttentionForwardArgs.sinks`."""

    def __post_init__(self):
        object.__setattr__(self, "attn_type", AttentionType.parse(self.attn_type))
        if self.mla is not None:
            object.__setattr__(self, "mla", MLASpec.from_any(self.mla))
        if self.indexer is not None:
            object.__setattr__(self, "indexer", IndexerSpec.from_any(self.indexer))
        problem = self._problem()
        if problem:
            raise ValueError(f"layer {self.layer_idx}: {problem}")

    def _problem(self) -> str | None:
        """The first thing wrong with this geometry, said so it can be fixed."""
        for name in ("num_heads", "head_dim", "num_kv_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                return f"{name} must be a positive int, got {value!r}"
        kind, mla = self.attn_type, self.mla
        if self.num_heads % self.num_kv_heads:
            return f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
        if not self.scale > 0:
            return f"scale must be > 0, got {self.scale}"
        for needs, field in ((AttentionType.SLIDING, "sliding_window"), (AttentionType.CHUNKED, "chunk_size")):
            value = getattr(self, field)
            if kind is needs and not (value or 0) >= 1:
                return f"a {needs.value} layer needs {field} >= 1, got {value}"
            if kind is not needs and value is not None:
                return f"{field}={value} given for a {kind.value} layer; use attn_type='{needs.value}' or drop {field}"
        if self.logit_softcap is not None and not self.logit_softcap > 0:
            return f"logit_softcap must be > 0 or None, got {self.logit_softcap}"
        if mla is not None and self.head_dim != mla.qk_head_dim:
            return f"MLA head_dim must be qk_nope_head_dim + qk_rope_head_dim = {mla.qk_head_dim}, got {self.head_dim}"
        if self.indexer is not None and mla is None:
            return "an indexer (DSA) needs MLA geometry: its keys are cached beside the MLA latent"
        return None

    @property
    def layer_kind(self) -> str:
        """The config layer kind (`ModelConfig.layer_types`) this geometry serves: its selection group."""
        return "indexed_attention" if self.indexer is not None else self.attn_type.value

    @property
    def v_head_dim(self) -> int:
        return self.mla.v_head_dim if self.mla else self.head_dim

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads
