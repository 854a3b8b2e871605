"""The runner's KV-cache side: pick a backend per layer group, size each layer's cache spec, allocate and bind it.

Planning and allocation are split (as vLLM sizes its pages before allocating): `plan_cache` fixes every
layer's backend and `KVCacheSpec`, so the engine can price one block (`CachePlan.bytes_per_block`) and
decide how many fit before `CachePlan.bind` allocates that many in every layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from kernelbay.attention import (
    SPARSE_DSA,
    SPARSE_NONE,
    AttentionBackend,
    KVCacheSpec,
    KVLayout,
    LayerGroupSelection,
    LayerKind,
)
from kernelbay.errors import ConfigError
from kernelbay_engine.attention import Attention
from kernelbay_engine.options import AttentionOptions, validate_options
from kernelbay_engine.selection import select_attention


@dataclass(frozen=True, slots=True)
class LayerCache:
    """One attention layer, the backend chosen for it and the spec of the cache that backend allocates."""

    layer: Attention
    backend_cls: type[AttentionBackend]
    spec: KVCacheSpec


@dataclass(frozen=True, slots=True)
class CachePlan:
    """Every layer's backend and cache spec, the backend building each step's metadata, and the layout."""

    selection: LayerGroupSelection
    metadata_backend: type[AttentionBackend]  # one backend class whose `prepare` builds the step's (single) metadata
    layout: KVLayout
    layers: tuple[LayerCache, ...]
    kv_cache_dtype: str | None
    options: Mapping

    @property
    def storage_key(self) -> str:
        """What every block's bytes depend on besides its tokens: the layers' cache dtypes and layout (the root of the
        prefix cache's block hashes)."""
        dtypes = sorted({str(entry.spec.dtype) for entry in self.layers})
        return f"{','.join(dtypes)}/{self.layout.value}"

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block takes across every layer's cache: the sum of the specs' page_size_bytes."""
        return sum(entry.spec.page_size_bytes for entry in self.layers)

    def bind(self, num_blocks: int, device: torch.device) -> None:
        """Allocate `num_blocks` blocks of each layer's spec and bind the layer to its cache tensor."""
        for entry in self.layers:
            cache = entry.spec.allocate(num_blocks, device=device)
            entry.layer.bind(
                entry.backend_cls, cache, self.kv_cache_dtype, options=self.options.get(entry.backend_cls.name)
            )


def _layout_for(backend_classes: list[type[AttentionBackend]]) -> KVLayout:
    for layout in (KVLayout.NHD, KVLayout.HND):
        if all(layout in cls.kv_layouts for cls in backend_classes):
            return layout
    names = ", ".join(cls.name for cls in backend_classes)
    raise ConfigError(
        f"the backends chosen for this model ({names}) share no KV layout; "
        f"request one backend for every layer with attention_backend=..."
    )


def _one_metadata_backend(selection: LayerGroupSelection) -> type[AttentionBackend]:
    classes: set[type[AttentionBackend]] = {result.backend_cls for _, result in selection.groups}
    metadata_types = {cls.Metadata for cls in classes}
    if len(metadata_types) > 1:
        chosen = ", ".join(f"{group}: {r.backend_name}" for group, r in selection.groups)
        raise ConfigError(
            f"layer groups chose backends with different metadata types ({chosen}); one step "
            f"builds one metadata, so request a single backend with attention_backend=..."
        )
    return next(iter(classes))


def check_options(
    config, *, model_dtype: str, block_size: int, kv_cache_dtype: str | None, options: Mapping | None
) -> None:
    """The whole attention option set, checked at once (names, combinations, per-backend options); the requested
    backend's capabilities are the selector's business, with its own error."""
    kinds = set(config.layer_types)
    validate_options(
        AttentionOptions(
            dtype=model_dtype,
            kv_cache_dtype=kv_cache_dtype or "auto",
            block_size=block_size,
            head_size=config.head_dim,
            sliding_window=LayerKind.SLIDING in kinds,
            chunked_attention=LayerKind.CHUNKED in kinds,
            attention_chunk_size=config.attention_chunk_size,
            logit_softcap=config.attn_logit_softcapping is not None,
            mla=config.mla,
            sparse_mode=SPARSE_DSA if LayerKind.INDEXED in kinds else SPARSE_NONE,
            backend_options=dict(options or {}),
        )
    )


def _check_made_for(selection: LayerGroupSelection, model_dtype: str, block_size: int) -> None:
    """A selection handed in must be for this model's dtype and block size: never a kernel chosen for another."""
    for group, result in selection.groups:
        req = result.requirements
        if (req.dtype, req.block_size) != (model_dtype, block_size):
            raise ValueError(
                f"the attention selection for {group} was made for dtype {req.dtype}, block_size {req.block_size}; "
                f"this model runs {model_dtype} in blocks of {block_size}: select for it (or pass no selection)"
            )


def plan_cache(
    layers: Mapping[str, Attention],
    config,
    *,
    model_dtype: str,
    block_size: int,
    requested: str | None,
    kv_cache_dtype: str | None,
    options: Mapping | None,
    selection: LayerGroupSelection | None = None,
) -> CachePlan:
    """Select backends for the config's layer groups (or take the caller's `selection`, made for this very
    model: `LLM` selects once, before any weight is read) and the cache spec each layer's backend allocates."""
    check_options(
        config, model_dtype=model_dtype, block_size=block_size, kv_cache_dtype=kv_cache_dtype, options=options
    )
    if selection is None:
        selection = select_attention(
            config, kv_cache_dtype=kv_cache_dtype, requested=requested, dtype=model_dtype, block_size=block_size
        )
    _check_made_for(selection, model_dtype, block_size)
    layout = _layout_for([result.backend_cls for _, result in selection.groups])
    entries = []
    for layer in layers.values():
        backend_cls: type[AttentionBackend] = selection.backend_for(layer.geometry.layer_kind).backend_cls
        spec = backend_cls.get_kv_cache_spec(layer.geometry, model_dtype, kv_cache_dtype, block_size, layout)
        if spec.block_size != block_size:  # the scheduler's block tables page in block_size tokens
            raise ConfigError(
                f"{backend_cls.name} returned a cache spec paged in blocks of {spec.block_size} "
                f"tokens for block_size={block_size}; its get_kv_cache_spec must honour block_size"
            )
        entries.append(LayerCache(layer, backend_cls, spec))
    return CachePlan(
        selection, _one_metadata_backend(selection), layout, tuple(entries), kv_cache_dtype, dict(options or {})
    )
