"""`create_attention`: a backend instance for one layer, geometry validated at construction."""

from __future__ import annotations

from ._backend import AttentionBackend
from ._geometry import AttentionGeometry, IndexerSpec, MLASpec
from ._types import AttentionType


def backend_class(backend: str | type[AttentionBackend]) -> type[AttentionBackend]:
    """A backend class from a class or an installed backend name."""
    if isinstance(backend, type):
        if not issubclass(backend, AttentionBackend):
            raise TypeError(f"{backend.__name__} is not an AttentionBackend subclass")
        return backend
    from ..registry import resolve

    return resolve("attention_backend", backend)


def create_attention(
    layer_idx: int,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int | None = None,
    *,
    backend: str | type[AttentionBackend],
    scale: float | None = None,
    attn_type: str = "full_attention",
    sliding_window: int | None = None,
    chunk_size: int | None = None,
    logit_softcap: float | None = None,
    mla=None,
    indexer=None,
    sinks: bool = False,
    kv_b_proj=None,
    quant_config=None,
    kv_cache_dtype: str | None = "auto",
    options=None,
) -> AttentionBackend:
    """Validate the geometry (MLA completeness, chunked on an incapable backend, ...) and build the backend.

    Every problem is a ValueError that says what to change; nothing falls back to full attention.
    """
    mla_spec = MLASpec.from_any(mla) if mla is not None else None
    geometry = AttentionGeometry(
        layer_idx,
        num_heads,
        head_dim,
        num_kv_heads or num_heads,
        scale or head_dim**-0.5,
        AttentionType.parse(attn_type),
        sliding_window,
        chunk_size,
        logit_softcap,
        mla_spec,
        IndexerSpec.from_any(indexer) if indexer is not None else None,
        sinks,
    )
    return build_backend(
        backend,
        geometry,
        kv_b_proj=kv_b_proj,
        quant_config=quant_config,
        kv_cache_dtype=kv_cache_dtype,
        options=options,
    )


def build_backend(
    backend: str | type[AttentionBackend],
    geometry: AttentionGeometry,
    *,
    kv_b_proj=None,
    quant_config=None,
    kv_cache_dtype: str | None = "auto",
    options=None,
) -> AttentionBackend:
    """A backend instance for a layer whose geometry record is already built (and validated)."""
    g = geometry
    return backend_class(backend)(
        g.layer_idx,
        g.num_heads,
        g.head_dim,
        g.num_kv_heads,
        quant_config,
        geometry=g,
        kv_b_proj=kv_b_proj,
        kv_cache_dtype=kv_cache_dtype,
        options=options,
    )
