"""`ModelConfig`: a checkpoint's geometry with every default resolved once, frozen."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..dtypes import MODEL_DTYPES, element_bytes
from ..errors import ConfigError
from ._layers import CACHELESS_KINDS, CHUNKED, INDEXED, LAYER_KINDS, SLIDING
from ._limits import MAX_DIMENSION, MAX_LAYERS
from ._moe import MoEConfig
from ._records import BlockSparseGeometry, IndexerGeometry, MLAGeometry, QuantConfig, RopeConfig

MODEL_KINDS = ("model", "draft_model", "vision_encoder")
POSITION_EMBEDDINGS = ("rope", "alibi", "learned")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Everything kernelbay needs to pick a model class and attention kernels, read once from config.json.

    Build it with `ModelConfig.from_pretrained(folder)` or `ModelConfig.from_hf_config(config)`.
    """

    architecture: str  # the slot to resolve: architectures[0], or EAGLE3<Arch> for a draft
    architectures: tuple[str, ...]  # as written in config.json
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int  # of an attention layer; the most any layer has when they differ
    head_dim: int  # query/key head width (MLA: qk_nope_head_dim + qk_rope_head_dim)
    vocab_size: int  # 0 for a vision encoder
    intermediate_size: int  # dense FFN width (the widest, when layers differ)
    max_position_embeddings: int
    rms_norm_eps: float  # the norm epsilon, RMSNorm or LayerNorm
    tie_word_embeddings: bool
    dtype: str  # checkpoint dtype: "float32" | "bfloat16" | "float16"
    layer_types: tuple[str, ...]  # (num_hidden_layers,) attention kind per layer, see LAYER_KINDS
    layer_num_kv_heads: tuple[int, ...]  # (num_hidden_layers,) KV heads per layer, 0 where nothing is cached
    sliding_window: int | None = None  # tokens a "sliding_attention" layer sees
    attention_chunk_size: int | None = None  # chunk of a "chunked_attention" layer
    mla: MLAGeometry | None = None
    rope: RopeConfig | None = None  # None unless position_embedding == "rope"
    position_embedding: str = "rope"  # "rope" | "alibi" | "learned"
    attention_scale: float = 0.0  # softmax scale applied to q·k
    v_head_dim: int = 0  # value head width (differs from head_dim under MLA)
    attn_logit_softcapping: float | None = None
    gated_ffn: bool = True  # FFN matrices gate, up and down; False (a family rule): up and down only
    attention_sinks: bool = False  # per-head sink logits in every attention softmax (a family rule says so)
    final_logit_softcapping: float | None = None
    quantization: QuantConfig | None = None
    blocksparse: BlockSparseGeometry | None = None  # geometry of "blocksparse_attention" layers
    indexer: IndexerGeometry | None = None  # DSA lightning indexer of "indexed_attention" layers (V3.2)
    moe: MoEConfig | None = None  # the mixture-of-experts layers; None for a dense model
    model_kind: str = "model"  # registry slot kind: "model" | "draft_model" | "vision_encoder"
    draft_vocab_size: int | None = None  # set for EAGLE-3 drafts
    notes: tuple[str, ...] = ()  # how defaults and quirks were resolved, in words
    source: str | None = None  # the folder it was read from
    hf_config: Any = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        problems = _sizes_problems(self) + _layer_problems(self) + _kind_problems(self)
        if problems:
            raise ConfigError(f"Inconsistent model config for {self.source or self.architecture}", problems)

    # ---- construction -----------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls, path: str | Path, trust_remote_code: bool = False, *, encoder_only: bool = False
    ) -> ModelConfig:
        """Read `path/config.json` through transformers (folder code runs only if trusted) and resolve it."""
        from ._build import build_from_folder

        return build_from_folder(path, trust_remote_code=trust_remote_code, encoder_only=encoder_only)

    @classmethod
    def from_hf_config(cls, hf_config, *, encoder_only: bool = False) -> ModelConfig:
        """Resolve a transformers `PretrainedConfig` already in memory."""
        from ._build import build_from_hf_config

        return build_from_hf_config(hf_config, encoder_only=encoder_only)

    # ---- derived views ----------------------------------------------------------------------
    @property
    def is_draft(self) -> bool:
        return self.model_kind == "draft_model"

    @property
    def is_encoder_only(self) -> bool:
        return self.model_kind == "vision_encoder"

    def layer_groups(self) -> list[tuple[str, tuple[int, ...]]]:
        """Attention kind -> the layer indices that use it, in order of first appearance."""
        groups: dict[str, list[int]] = {}
        for index, kind in enumerate(self.layer_types):
            groups.setdefault(kind, []).append(index)
        return [(kind, tuple(indices)) for kind, indices in groups.items()]

    def layer_kv_bytes_per_token(self, kv_cache_dtype: str | None = None) -> tuple[int, ...]:
        """(num_hidden_layers,) bytes one token adds to each layer's KV cache."""
        element = self._kv_element_bytes(kv_cache_dtype)
        return tuple(self._layer_cache_width(i) * element for i in range(self.num_hidden_layers))

    def kv_bytes_per_token(self, kv_cache_dtype: str | None = None) -> int:
        """Bytes one token adds to the KV cache over all layers (MLA: the latent, not K and V)."""
        return sum(self.layer_kv_bytes_per_token(kv_cache_dtype))

    def indexer_kv_bytes_per_token(self, kv_cache_dtype: str | None = None) -> int:
        """The DSA indexer keys' share of `kv_bytes_per_token` (0 without an indexer)."""
        if self.indexer is None:
            return 0
        return self.indexer.cache_width * self._kv_element_bytes(kv_cache_dtype) * self.layer_types.count(INDEXED)

    def _kv_element_bytes(self, kv_cache_dtype: str | None) -> int:
        try:
            return element_bytes(kv_cache_dtype, self.dtype)
        except ValueError as err:
            raise ConfigError(f"kv_cache_dtype: {err}") from None

    def _layer_cache_width(self, index: int) -> int:
        if self.layer_types[index] in CACHELESS_KINDS:
            return 0
        indexer = self.indexer.cache_width if self.indexer and self.layer_types[index] == INDEXED else 0
        if self.mla is not None:
            return self.mla.cache_width + indexer
        return 2 * self.layer_num_kv_heads[index] * self.head_dim + indexer

    def parameter_counts(self) -> dict[str, int]:
        """Weights in the model and those one token reads (MoE: top-k routed + shared experts); see `_params`."""
        from ._params import parameter_counts

        return parameter_counts(self)

    def to_dict(self) -> dict:
        """A JSON-safe summary (what `kernelbay explain --json` prints)."""
        return {
            "architecture": self.architecture,
            "architectures": list(self.architectures),
            "model_type": self.model_type,
            "model_kind": self.model_kind,
            "is_draft": self.is_draft,
            "is_encoder_only": self.is_encoder_only,
            "source": self.source,
            **{name: getattr(self, name) for name in _PLAIN_FIELDS},
            "layer_groups": [{"kind": kind, "layers": list(idx)} for kind, idx in self.layer_groups()],
            "layer_num_kv_heads": list(self.layer_num_kv_heads),
            "mla": self.mla.to_dict() if self.mla else None,
            "rope": self.rope.to_dict() if self.rope else None,
            "quantization": self.quantization.to_dict() if self.quantization else None,
            "blocksparse": self.blocksparse.to_dict() if self.blocksparse else None,
            "indexer": self.indexer.to_dict() if self.indexer else None,
            "moe": self.moe.to_dict() if self.moe else None,
            "parameters": self.parameter_counts(),
            "kv_bytes_per_token": self.kv_bytes_per_token(),
            "notes": list(self.notes),
        }


_PLAIN_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "v_head_dim",
    "vocab_size",
    "intermediate_size",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "dtype",
    "sliding_window",
    "attention_chunk_size",
    "position_embedding",
    "attention_scale",
    "attn_logit_softcapping",
    "attention_sinks",
    "final_logit_softcapping",
    "draft_vocab_size",
)


def _sizes_problems(c: ModelConfig) -> list[str]:
    sizes = {
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "head_dim": c.head_dim,
        "v_head_dim": c.v_head_dim,
        "intermediate_size": c.intermediate_size,
        "max_position_embeddings": c.max_position_embeddings,
    }
    problems = [
        f"{name}={value!r} must be a positive integer"
        for name, value in sizes.items()
        if not (isinstance(value, int) and value > 0)
    ]
    problems += [f"{name}={value!r} exceeds {MAX_DIMENSION}" for name, value in sizes.items() if value > MAX_DIMENSION]
    if c.num_hidden_layers > MAX_LAYERS:
        problems.append(f"num_hidden_layers={c.num_hidden_layers} exceeds {MAX_LAYERS}")
    if c.vocab_size <= 0 and c.model_kind != "vision_encoder":
        problems.append(f"vocab_size={c.vocab_size} must be positive for a language model")
    if c.vocab_size > MAX_DIMENSION:
        problems.append(f"vocab_size={c.vocab_size} exceeds {MAX_DIMENSION}")
    if c.num_key_value_heads <= 0 or c.num_attention_heads % c.num_key_value_heads:
        problems.append(
            f"num_key_value_heads={c.num_key_value_heads} must divide num_attention_heads={c.num_attention_heads}"
        )
    if c.dtype not in MODEL_DTYPES:
        problems.append(f"dtype={c.dtype!r} must be one of {', '.join(MODEL_DTYPES)}")
    if not (c.attention_scale > 0 and math.isfinite(c.attention_scale)):
        problems.append(f"attention_scale={c.attention_scale} must be a positive finite number")
    return problems + _float_problems(c)


def _float_problems(c: ModelConfig) -> list[str]:
    """Epsilon and soft-caps: finite and positive (a cap of 0 divides by zero, NaN poisons every logit)."""
    problems = [] if 0 < c.rms_norm_eps < 1 else [f"rms_norm_eps={c.rms_norm_eps!r} must be in (0, 1)"]
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = getattr(c, name)
        if value is not None and not (value > 0 and math.isfinite(value)):
            problems.append(f"{name}={value!r} must be a positive finite number or null (no cap)")
    return problems


def _layer_problems(c: ModelConfig) -> list[str]:
    n = c.num_hidden_layers
    problems = [
        f"{name} has {len(value)} entries for num_hidden_layers={n}"
        for name, value in (("layer_types", c.layer_types), ("layer_num_kv_heads", c.layer_num_kv_heads))
        if len(value) != n
    ]
    unknown = sorted(set(c.layer_types) - set(LAYER_KINDS))
    if unknown:
        problems.append(f"unknown layer kinds {unknown}; known: {', '.join(LAYER_KINDS)}")
    for name in ("sliding_window", "attention_chunk_size"):
        value = getattr(c, name)
        if value is not None and not 0 < value <= MAX_DIMENSION:
            problems.append(f"{name}={value!r} must be an integer from 1 to {MAX_DIMENSION}")
    if (SLIDING in c.layer_types) != (c.sliding_window is not None):
        problems.append(f"sliding_window={c.sliding_window} must be set exactly when a layer is sliding_attention")
    if (INDEXED in c.layer_types) != (c.indexer is not None):
        problems.append("indexer must be set exactly when a layer is indexed_attention (DSA)")
    if c.indexer is not None and c.mla is None:
        problems.append(
            "indexed_attention (DSA) layers need MLA geometry: the indexer keys are cached beside the latent"
        )
    if (CHUNKED in c.layer_types) != (c.attention_chunk_size is not None):
        problems.append(
            f"attention_chunk_size={c.attention_chunk_size} must be set exactly when a layer is chunked_attention"
        )
    return problems


def _kind_problems(c: ModelConfig) -> list[str]:
    problems = []
    if c.model_kind not in MODEL_KINDS:
        problems.append(f"model_kind={c.model_kind!r} must be one of {', '.join(MODEL_KINDS)}")
    if c.position_embedding not in POSITION_EMBEDDINGS:
        problems.append(f"position_embedding={c.position_embedding!r} must be one of {', '.join(POSITION_EMBEDDINGS)}")
    if (c.position_embedding == "rope") != (c.rope is not None):
        problems.append("rope must be set exactly when position_embedding is 'rope'")
    if c.rope is not None and c.rope.rotary_dim > c.head_dim:
        problems.append(f"rotary_dim={c.rope.rotary_dim} exceeds head_dim={c.head_dim}")
    if (c.model_kind == "draft_model") != (c.draft_vocab_size is not None):
        problems.append("draft_vocab_size must be set exactly for a draft model")
    return problems
