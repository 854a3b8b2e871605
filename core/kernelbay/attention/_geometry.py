"""The resolved shape of one attention layer, validated once at construction, and the small vocabularies of
the protocol: layer kinds and mask types, KV layouts, sparse modes (dtypes: kernelbay.dtypes)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar


class _Vocabulary(str, enum.Enum):
    """A closed vocabulary of names: `str()` is the name, `parse` refuses an unknown one listing the known."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value):
        try:
            return cls(value)
        except ValueError:
            known = ", ".join(t.value for t in cls)
            raise ValueError(f"unknown {cls.what()} {value!r}; use one of: {known}") from None

    @classmethod
    def what(cls) -> str:
        return "name"


class AttentionType(_Vocabulary):
    """What an attention layer attends to (its mask); values match `LayerKind`'s."""

    FULL = "full_attention"
    SLIDING = "sliding_attention"
    CHUNKED = "chunked_attention"
    ENCODER = "encoder_attention"  # bidirectional (vision encoders): no causal mask

    @classmethod
    def what(cls) -> str:
        return "attention type"


class LayerKind(_Vocabulary):
    """What one layer of a model runs: the one vocabulary of layer kinds (`ModelConfig.layer_types`, selection
    groups, `explain`). The first four are also mask shapes (`AttentionType`); the others map onto one."""

    FULL = "full_attention"
    SLIDING = "sliding_attention"
    CHUNKED = "chunked_attention"
    ENCODER = "encoder_attention"  # bidirectional, no KV cache (vision encoders)
    BLOCKSPARSE = "blocksparse_attention"  # Phi-3-small: local + strided blocks over a full KV cache
    INDEXED = "indexed_attention"  # DeepSeek V3.2: MLA over the top-k tokens a lightning indexer picks
    NO_ATTENTION = "no_attention"  # no attention, no KV cache (Nemotron-NAS no-op / linear blocks)

    @classmethod
    def what(cls) -> str:
        return "layer kind"

    @property
    def has_attention(self) -> bool:
        """False for layers no attention backend serves."""
        return self is not LayerKind.NO_ATTENTION

    @property
    def has_kv_cache(self) -> bool:
        return self not in (LayerKind.NO_ATTENTION, LayerKind.ENCODER)

    @property
    def attention_type(self) -> AttentionType:
        """The mask its attention applies (block-sparse and indexed layers: full attention, sparsely)."""
        if not self.has_attention:
            raise ValueError(f"{self.value} layers have no attention")
        return AttentionType(self.value) if self.value in _MASKS else AttentionType.FULL

    @property
    def sparse_mode(self) -> str:
        return _SPARSE_MODES.get(self, SPARSE_NONE)


class KVLayout(str, enum.Enum):
    """How one cache block stores its tokens: NHD = [block_size, kv_heads, head_dim], HND = [kv_heads, block_size,
    head_dim]."""

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
SPARSE_DSA = "dsa"  # DeepSeek sparse attention: each query attends to the top-k keys its indexer picked
SPARSE_BLOCKSPARSE = "blocksparse"  # Phi-3-small's local + strided blocks
_MASKS = frozenset(t.value for t in AttentionType)
_SPARSE_MODES = {LayerKind.BLOCKSPARSE: SPARSE_BLOCKSPARSE, LayerKind.INDEXED: SPARSE_DSA}


class _Spec:
    """What the geometry records share: `from_any` (a mapping of the fields) and `to_dict` (`explain --json`)."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every subclass is a dataclass
    REQUIRED: ClassVar[tuple[str, ...]]  # the fields without a default
    WHAT: ClassVar[str]  # its name in messages
    cache_width: int  # elements cached per token and layer

    @classmethod
    def from_any(cls, value):
        """From an instance or a mapping of the fields; names every missing one."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"{cls.WHAT} geometry must be {cls.__name__} or a mapping of its fields, got {value!r}")
        missing = [name for name in cls.REQUIRED if value.get(name) is None]
        if missing:
            optional = "".join(f"; {name} may be None" for name in cls.__dataclass_fields__ if name not in cls.REQUIRED)
            raise ValueError(
                f"{cls.WHAT} geometry is incomplete: missing {', '.join(missing)} "
                f"({cls.WHAT} needs {', '.join(cls.REQUIRED)}{optional})"
            )
        return cls(**{name: value.get(name) for name in cls.__dataclass_fields__})

    def to_dict(self) -> dict:
        return {**asdict(self), "cache_width": self.cache_width}


@dataclass(frozen=True, slots=True)
class MLASpec(_Spec):
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): per token and layer the cache holds the latent
    `[kv_lora_rank]` and the shared rotary key `[qk_rope_head_dim]`. `q_lora_rank` None: queries are projected
    directly (DeepSeek-V2-Lite)."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    REQUIRED = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    WHAT = "MLA"

    def __post_init__(self):
        _require_positive("MLA", self, ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"))
        if not isinstance(self.qk_rope_head_dim, int) or self.qk_rope_head_dim < 0:
            raise ValueError(f"MLA qk_rope_head_dim must be an int >= 0, got {self.qk_rope_head_dim!r}")
        if self.q_lora_rank is not None:
            _require_positive("MLA", self, ("q_lora_rank",), " or None")

    latent_dim = cache_width = property(lambda self: self.kv_lora_rank + self.qk_rope_head_dim, doc="cached per token")
    qk_head_dim = property(lambda self: self.qk_nope_head_dim + self.qk_rope_head_dim, doc="one query/key head")


@dataclass(frozen=True, slots=True)
class IndexerSpec(_Spec):
    """DeepSeek sparse attention (V3.2): a lightning indexer scores every cached key with `index_n_heads` heads
    of `index_head_dim`, each query attends to its `index_topk` best; its key is cached beside the MLA latent."""

    index_n_heads: int
    index_head_dim: int
    index_topk: int
    REQUIRED = ("index_n_heads", "index_head_dim", "index_topk")
    WHAT = "indexer"

    def __post_init__(self):
        _require_positive("indexer", self, self.REQUIRED)

    cache_width = property(lambda self: self.index_head_dim, doc="its key, cached per token and layer")


def _require_positive(what: str, record, names: tuple[str, ...], alternative: str = "") -> None:
    for name in names:
        value = getattr(record, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} {name} must be a positive int{alternative}, got {value!r}")


@dataclass(frozen=True, slots=True)
class AttentionGeometry:
    """Everything about a layer that does not change from step to step."""

    layer_idx: int
    num_heads: int
    head_dim: int  # query/key head size (MLA: qk_nope_head_dim + qk_rope_head_dim)
    num_kv_heads: int
    scale: float
    attn_type: AttentionType = AttentionType.FULL
    sliding_window: int | None = None  # keys at most sliding_window - 1 positions behind are visible (as HF)
    chunk_size: int | None = None  # chunked attention (Llama 4): a query sees its own chunk_size-aligned chunk
    logit_softcap: float | None = None
    mla: MLASpec | None = None
    indexer: IndexerSpec | None = None  # DSA layers (MLA only): each query attends to the indexer's top-k keys
    sinks: bool = False  # GPT-OSS: a learned logit per head joins each softmax (`AttentionForwardArgs.sinks`)

    def __post_init__(self):
        object.__setattr__(self, "attn_type", AttentionType.parse(self.attn_type))
        for name, spec in (("mla", MLASpec), ("indexer", IndexerSpec)):
            if getattr(self, name) is not None:  # a mapping of its fields is taken too
                object.__setattr__(self, name, spec.from_any(getattr(self, name)))
        _require_positive(f"layer {self.layer_idx}:", self, ("num_heads", "head_dim", "num_kv_heads"))
        problem = self._problem()
        if problem:
            raise ValueError(f"layer {self.layer_idx}: {problem}")

    def _problem(self) -> str | None:
        """The first thing wrong with this geometry, said so it can be fixed."""
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
    def layer_kind(self) -> LayerKind:
        """The layer kind (`ModelConfig.layer_types`) this geometry serves: its selection group."""
        return LayerKind.INDEXED if self.indexer is not None else LayerKind(self.attn_type.value)

    v_head_dim = property(lambda self: self.mla.v_head_dim if self.mla else self.head_dim)
    num_queries_per_kv = property(lambda self: self.num_heads // self.num_kv_heads)
