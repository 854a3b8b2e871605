"""What a layer group needs from an attention backend: a hashable record, so selection can be cached."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ..dtypes import normalize_dtype, normalize_kv_cache_dtype
from ._geometry import AttentionGeometry
from ._types import SPARSE_DSA, SPARSE_NONE, AttentionType, KVLayout


@dataclass(frozen=True, slots=True)
class AttentionRequirements:
    """Every capability a backend must have for one group of layers."""

    head_size: int
    """Query/key head size (MLA: qk_nope_head_dim + qk_rope_head_dim)."""
    dtype: str = "bfloat16"
    """Model compute dtype: float32, bfloat16 or float16."""
    kv_cache_dtype: str = "auto"
    attn_type: AttentionType = AttentionType.FULL
    use_mla: bool = False
    sliding_window: bool = False
    chunked_attention: bool = False
    logit_softcap: bool = False
    sinks: bool = False
    """Per-head attention sink logits in the softmax denominator (GPT-OSS)."""
    sparse_mode: str = SPARSE_NONE
    block_size: int | None = None
    """A block size the engine insists on; None lets the backend pick its preferred one."""
    kv_layout: KVLayout | None = None
    fused_rope: bool = False
    fused_qkv: bool = False
    platform: str | None = None
    """Platform name; `select_attention_backend` fills it from the detected platform when None."""

    def __post_init__(self):
        if not isinstance(self.head_size, int) or self.head_size < 1:
            raise ValueError(f"head_size must be a positive int, got {self.head_size!r}")
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        object.__setattr__(self, "kv_cache_dtype", normalize_kv_cache_dtype(self.kv_cache_dtype))
        object.__setattr__(self, "attn_type", AttentionType.parse(self.attn_type))
        if self.kv_layout is not None:
            object.__setattr__(self, "kv_layout", KVLayout.parse(self.kv_layout))
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block_size must be >= 1 or None, got {self.block_size}")
        if self.attn_type is AttentionType.SLIDING and not self.sliding_window:
            object.__setattr__(self, "sliding_window", True)
        if self.attn_type is AttentionType.CHUNKED and not self.chunked_attention:
            object.__setattr__(self, "chunked_attention", True)

    def with_platform(self, platform: str) -> AttentionRequirements:
        return replace(self, platform=platform)

    def describe(self) -> str:
        parts = [self.attn_type.value, f"head_size={self.head_size}", self.dtype, f"kv={self.kv_cache_dtype}"]
        parts += [flag for flag in ("use_mla", "logit_softcap") if getattr(self, flag)]
        return "layers (" + ", ".join(parts) + ")"

    def to_dict(self) -> dict:
        out = asdict(self)
        out["attn_type"] = self.attn_type.value
        out["kv_layout"] = self.kv_layout.value if self.kv_layout else None
        return out

    @classmethod
    def from_geometry(cls, geometry: AttentionGeometry, dtype: str = "bfloat16", **runtime) -> AttentionRequirements:
        """Requirements of one constructed layer (runtime: kv_cache_dtype, block_size, platform, ...)."""
        runtime.setdefault("sparse_mode", SPARSE_DSA if geometry.indexer is not None else SPARSE_NONE)
        return cls(
            head_size=geometry.head_dim,
            dtype=dtype,
            attn_type=geometry.attn_type,
            use_mla=geometry.mla is not None,
            sliding_window=geometry.sliding_window is not None,
            chunked_attention=geometry.chunk_size is not None,
            logit_softcap=geometry.logit_softcap is not None,
            sinks=geometry.sinks,
            **runtime,
        )

    @classmethod
    def from_model_config(
        cls,
        cfg,
        layer_kind: str | AttentionType,
        kv_cache_dtype: str | None = "auto",
        dtype: str | None = None,
        **runtime,
    ) -> AttentionRequirements:
        """Requirements of the `layer_kind` layers of a resolved `kernelbay.config.ModelConfig`."""
        kind, sparse = _kind_and_sparse(str(getattr(layer_kind, "value", layer_kind)))
        runtime.setdefault("sparse_mode", sparse)
        mla = getattr(cfg, "mla", None)
        head_size = mla.qk_nope_head_dim + mla.qk_rope_head_dim if mla is not None else cfg.head_dim
        return cls(
            head_size=head_size,
            dtype=dtype or cfg.dtype,
            kv_cache_dtype=kv_cache_dtype or "auto",
            attn_type=kind,
            use_mla=mla is not None,
            logit_softcap=getattr(cfg, "attn_logit_softcapping", None) is not None,
            sinks=getattr(cfg, "attention_sinks", False),
            **runtime,
        )


# Config layer kinds that are a sparse mode of full attention rather than a mask shape.
_SPARSE_KINDS = {"blocksparse_attention": "blocksparse", "indexed_attention": SPARSE_DSA}


def _kind_and_sparse(layer_kind: str) -> tuple[AttentionType, str]:
    if layer_kind == "no_attention":
        raise ValueError("no_attention layers have no attention backend; skip them when selecting")
    if layer_kind in _SPARSE_KINDS:
        return AttentionType.FULL, _SPARSE_KINDS[layer_kind]
    return AttentionType.parse(layer_kind), SPARSE_NONE
