"""`ModelConfig`: a checkpoint's geometry with every default resolved once, frozen; the one home of its bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelbay.attention import IndexerSpec, KVCacheSpec, LayerKind, MLASpec
from kernelbay.dtypes import MODEL_DTYPES, storage_dtype
from kernelbay.errors import ConfigError

from ._fields import MAX_DIMENSION, MAX_LAYERS
from ._layers import CACHELESS_KINDS, LAYER_KINDS
from ._moe import MoEConfig
from ._records import BlockSparseGeometry, QuantConfig, Record, RopeConfig

MODEL_KINDS = ("model", "draft_model", "vision_encoder")
POSITION_EMBEDDINGS = ("rope", "alibi", "learned")


@dataclass(frozen=True, slots=True)
class ModelConfig(Record):
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
    layer_types: tuple[LayerKind, ...]  # (num_hidden_layers,) what each layer runs
    layer_num_kv_heads: tuple[int, ...]  # (num_hidden_layers,) KV heads per layer, 0 where nothing is cached
    sliding_window: int | None = None  # tokens a "sliding_attention" layer sees
    attention_chunk_size: int | None = None  # chunk of a "chunked_attention" layer
    mla: MLASpec | None = None
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
    indexer: IndexerSpec | None = None  # DSA lightning indexer of "indexed_attention" layers (V3.2)
    moe: MoEConfig | None = None  # the mixture-of-experts layers; None for a dense model
    not_built: str | None = None  # why no first-party model serves this architecture (its family plugin says)
    model_kind: str = "model"  # registry slot kind: "model" | "draft_model" | "vision_encoder"
    draft_vocab_size: int | None = None  # set for EAGLE-3 drafts
    notes: tuple[str, ...] = ()  # how defaults and quirks were resolved, in words
    source: str | None = None  # the folder it was read from
    hf_config: Any = field(default=None, compare=False, hash=False, repr=False)
    NOT_IN_DICT = ("layer_types", "hf_config")  # layer_groups says the first; the second is not JSON

    def __post_init__(self) -> None:
        problems = _size_problems(self) + _value_problems(self) + _layer_problems(self)
        if problems:
            raise ConfigError(f"Inconsistent model config for {self.source or self.architecture}", problems)

    # ---- construction -----------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls, path: str | Path, trust_remote_code: bool = False, *, encoder_only: bool = False
    ) -> ModelConfig:
        """Read `path/config.json` through transformers (folder code runs only if trusted) and resolve it."""
        from ._build import build_from_folder

        return build_from_folder(cls, path, trust_remote_code=trust_remote_code, encoder_only=encoder_only)

    @classmethod
    def from_hf_config(cls, hf_config, *, encoder_only: bool = False) -> ModelConfig:
        """Resolve a transformers `PretrainedConfig` already in memory."""
        from ._build import build_from_hf_config

        return build_from_hf_config(cls, hf_config, encoder_only=encoder_only)

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

    def layer_geometry(self, index: int, *, scale: float | None = None, head_dim: int | None = None):
        """Layer `index`'s `AttentionGeometry`: the one record its `Attention` module, its backend's cache spec and
        `explain` are built from (`scale`, `head_dim`: what a module states over the config, as transformers'
        modules do for the fallback). A layer without attention is a ValueError."""
        from kernelbay.attention import AttentionGeometry

        kind, mla = LayerKind.parse(self.layer_types[index]), self.mla
        return AttentionGeometry(
            layer_idx=index,
            num_heads=self.num_attention_heads,
            head_dim=mla.qk_head_dim if mla is not None else (head_dim or self.head_dim),
            num_kv_heads=self.num_attention_heads if mla is not None else self._attention_kv_heads(index),
            scale=self.attention_scale if scale is None else scale,
            attn_type=kind.attention_type,
            sliding_window=self.sliding_window if kind is LayerKind.SLIDING else None,
            chunk_size=self.attention_chunk_size if kind is LayerKind.CHUNKED else None,
            logit_softcap=self.attn_logit_softcapping,
            mla=mla,
            indexer=self.indexer if kind is LayerKind.INDEXED else None,
            sinks=self.attention_sinks,
        )

    def _attention_kv_heads(self, index: int) -> int:
        return self.layer_num_kv_heads[index] or self.num_key_value_heads  # an encoder layer caches nothing

    def layer_kv_cache_spec(self, index: int, kv_cache_dtype: str | None = None, block_size: int = 16):
        """The default `KVCacheSpec` of layer `index` (what `AttentionBackend.get_kv_cache_spec` builds before a
        backend adds to it), or None for a layer that caches nothing: the one home of the KV arithmetic."""
        if self.layer_types[index] in CACHELESS_KINDS or not (self.mla or self.layer_num_kv_heads[index]):
            return None
        indexed = self.indexer is not None and self.layer_types[index] == LayerKind.INDEXED
        try:
            return KVCacheSpec(
                num_kv_heads=1 if self.mla else self.layer_num_kv_heads[index],
                head_dim=self.mla.cache_width if self.mla else self.head_dim,
                dtype=storage_dtype(kv_cache_dtype, self.dtype),
                block_size=block_size,
                mla=self.mla is not None,
                index_head_dim=self.indexer.cache_width if indexed and self.indexer else 0,
            )
        except ValueError as err:
            raise ConfigError(f"kv_cache_dtype: {err}") from None

    def layer_kv_bytes_per_token(self, kv_cache_dtype: str | None = None) -> tuple[int, ...]:
        """(num_hidden_layers,) bytes one token adds to each layer's KV cache (`KVCacheSpec.bytes_per_token`)."""
        specs = (self.layer_kv_cache_spec(i, kv_cache_dtype) for i in range(self.num_hidden_layers))
        return tuple(spec.bytes_per_token if spec else 0 for spec in specs)

    def kv_bytes_per_token(self, kv_cache_dtype: str | None = None) -> int:
        """Bytes one token adds to the KV cache over all layers (MLA: the latent, not K and V)."""
        return sum(self.layer_kv_bytes_per_token(kv_cache_dtype))

    def indexer_kv_bytes_per_token(self, kv_cache_dtype: str | None = None) -> int:
        """The DSA indexer keys' share of `kv_bytes_per_token` (0 without an indexer)."""
        specs = (self.layer_kv_cache_spec(i, kv_cache_dtype) for i in range(self.num_hidden_layers))
        return sum(spec.index_bytes_per_token for spec in specs if spec)

    def parameter_counts(self) -> dict[str, int]:
        """{"total": ..., "active_per_token": ...}: weights in the model and those one token reads (MoE: top-k
        routed + shared experts). Embeddings (and an untied LM head), attention projections, FFNs (gate, up and
        down; up and down where `gated_ffn` is False), routers and experts; norms, biases and rotary tables are
        left out (under 0.1% for the models here)."""
        embed = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        attention = self._attention_parameters() * sum(kind != LayerKind.NO_ATTENTION for kind in self.layer_types)
        dense_ffn = (3 if self.gated_ffn else 2) * self.hidden_size * self.intermediate_size
        moe = self.moe
        if moe is None:
            total = embed + attention + dense_ffn * self.num_hidden_layers
            return {"total": total, "active_per_token": total}
        expert = 3 * self.hidden_size * moe.intermediate_size
        shared = 3 * self.hidden_size * moe.shared_intermediate_size + self.hidden_size * moe.num_experts  # + router
        n_moe = moe.num_moe_layers
        common = embed + attention + dense_ffn * (self.num_hidden_layers - n_moe) + shared * n_moe
        return {
            "total": common + expert * moe.num_experts * n_moe,
            "active_per_token": common + expert * moe.top_k * n_moe,
        }

    def _attention_parameters(self) -> int:
        hidden, heads, mla = self.hidden_size, self.num_attention_heads, self.mla
        if mla is None:
            kv = self.num_key_value_heads
            return hidden * heads * self.head_dim + 2 * hidden * kv * self.head_dim + heads * self.v_head_dim * hidden
        q_width = heads * mla.qk_head_dim
        q = hidden * mla.q_lora_rank + mla.q_lora_rank * q_width if mla.q_lora_rank else hidden * q_width
        kv = hidden * mla.cache_width + mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        return q + kv + heads * mla.v_head_dim * hidden

    def derived(self) -> dict:
        """What `to_dict()` (a JSON-safe summary) adds to the fields: the derived views."""
        return {
            "is_draft": self.is_draft,
            "is_encoder_only": self.is_encoder_only,
            "layer_groups": [{"kind": kind, "layers": list(idx)} for kind, idx in self.layer_groups()],
            "parameters": self.parameter_counts(),
            "kv_bytes_per_token": self.kv_bytes_per_token(),
        }


OPTIONAL_SIZES = ("sliding_window", "attention_chunk_size")
WIDTHS = ("hidden_size", "num_attention_heads", "head_dim", "v_head_dim", "intermediate_size", "vocab_size")
SIZES = (*WIDTHS, "num_hidden_layers", "max_position_embeddings", *OPTIONAL_SIZES)


def _size_problems(c: ModelConfig) -> list[str]:
    """Every size an integer within bounds (the layer cap keeps per-layer tuples from exhausting memory); a vision
    encoder has no vocabulary (0), a window and a chunk may be unset."""
    problems = []
    for name in SIZES:
        value, low = getattr(c, name), 0 if name == "vocab_size" and c.is_encoder_only else 1
        high = MAX_LAYERS if name == "num_hidden_layers" else MAX_DIMENSION
        if value is None and name in OPTIONAL_SIZES:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            problems.append(f"{name}={value!r} must be an integer from {low} to {high}")
    return problems


def _value_problems(c: ModelConfig) -> list[str]:
    """Heads that group, a known dtype and kinds, finite scales (a soft-cap of 0 divides by zero, NaN poisons
    every logit), an epsilon that neither divides by zero nor swamps the variance."""
    heads, cached = c.num_attention_heads, zip(c.layer_types, c.layer_num_kv_heads, strict=False)
    kv_heads = {c.num_key_value_heads} | {kv for kind, kv in cached if kind not in CACHELESS_KINDS}
    problems = [
        f"num_key_value_heads={kv} must divide num_attention_heads={heads} (each KV head serves a group of query heads)"
        for kv in sorted(kv_heads)
        if kv <= 0 or heads % kv
    ]
    choices = {"dtype": MODEL_DTYPES, "model_kind": MODEL_KINDS, "position_embedding": POSITION_EMBEDDINGS}
    problems += [
        f"{name}={getattr(c, name)!r} must be one of {', '.join(known)}"
        for name, known in choices.items()
        if getattr(c, name) not in known
    ]
    if not 0 < c.rms_norm_eps < 1:
        problems.append(f"rms_norm_eps={c.rms_norm_eps!r} must be in (0, 1)")
    for name in ("attention_scale", "attn_logit_softcapping", "final_logit_softcapping"):
        value, optional = getattr(c, name), name != "attention_scale"
        if not (optional and value is None) and not (value > 0 and math.isfinite(value)):
            problems.append(f"{name}={value!r} must be a positive finite number{' or null (no cap)' * optional}")
    if c.rope is not None and c.rope.rotary_dim > c.head_dim:
        problems.append(f"rotary_dim={c.rope.rotary_dim} exceeds head_dim={c.head_dim}")
    if c.indexer is not None and c.mla is None:
        problems.append(
            f"{LayerKind.INDEXED} (DSA) layers need MLA geometry: the indexer keys are cached beside the latent"
        )
    return problems


def _layer_problems(c: ModelConfig) -> list[str]:
    """One kind and one KV head count per layer; each optional part set exactly when something uses it."""
    n = c.num_hidden_layers
    problems = [
        f"{name} has {len(value)} entries for num_hidden_layers={n}"
        for name, value in (("layer_types", c.layer_types), ("layer_num_kv_heads", c.layer_num_kv_heads))
        if len(value) != n
    ]
    unknown = sorted(set(c.layer_types) - set(LAYER_KINDS))
    if unknown:
        problems.append(f"unknown layer kinds {unknown}; known: {', '.join(LAYER_KINDS)}")
    needed = {  # field -> (whether it must be set, when)
        "sliding_window": (LayerKind.SLIDING in c.layer_types, f"a layer is {LayerKind.SLIDING}"),
        "attention_chunk_size": (LayerKind.CHUNKED in c.layer_types, f"a layer is {LayerKind.CHUNKED}"),
        "blocksparse": (LayerKind.BLOCKSPARSE in c.layer_types, f"a layer is {LayerKind.BLOCKSPARSE}"),
        "indexer": (LayerKind.INDEXED in c.layer_types, f"a layer is {LayerKind.INDEXED} (DSA)"),
        "rope": (c.position_embedding == "rope", "position_embedding is 'rope'"),
        "draft_vocab_size": (c.is_draft, "the model is a draft model"),
    }
    for name, (wanted, when) in needed.items():
        value = getattr(c, name)
        if wanted != (value is not None):
            problems.append(f"{name} must be set exactly when {when} (it is {'unset' if value is None else 'set'})")
    return problems
