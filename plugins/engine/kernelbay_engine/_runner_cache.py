"""The runner's KV-cache side: pick a backend per layer group, allocate each layer's cache, bind it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from kernelbay_engine.attention import Attention
from kernelbay.attention import AttentionOptions, KVLayout, LayerGroupSelection, select_for_model, validate_options
from kernelbay_engine.kv_cache import KVCacheExhausted, KVCacheManager
from kernelbay.errors import ConfigError


@dataclass(frozen=True, slots=True)
class CacheSetup:
    """What the runner needs after binding: the backend building each step's metadata, and the layout."""

    selection: LayerGroupSelection
    metadata_backend: type  # one backend class whose `prepare` builds the step's (single) metadata
    layout: KVLayout
    cache_bytes: int  # total bytes of every layer's cache tensor


def _layout_for(backend_classes: list[type]) -> KVLayout:
    for layout in (KVLayout.NHD, KVLayout.HND):
        if all(cls.supports_kv_layout(layout) for cls in backend_classes):
            return layout
    names = ", ".join(cls.name for cls in backend_classes)
    raise ConfigError(f"the backends chosen for this model ({names}) share no KV layout; "
                      f"request one backend for every layer with attention_backend=...")


def _one_metadata_backend(selection: LayerGroupSelection) -> type:
    classes = {result.backend_cls for _, result in selection.groups}
    metadata_types = {cls.Metadata for cls in classes}
    if len(metadata_types) > 1:
        chosen = ", ".join(f"{group}: {r.backend_name}" for group, r in selection.groups)
        raise ConfigError(f"layer groups chose backends with different metadata types ({chosen}); one step "
                          f"builds one metadata, so request a single backend with attention_backend=...")
    return next(iter(classes))


def check_options(config, *, model_dtype: str, block_size: int, kv_cache_dtype: str | None,
                  options: Mapping | None) -> None:
    """The whole attention option set, checked at once (names, combinations, per-backend options, plugin
    rules); the requested backend's capabilities are the selector's business, with its own error."""
    kinds = set(config.layer_types)
    validate_options(AttentionOptions(
        dtype=model_dtype, kv_cache_dtype=kv_cache_dtype or "auto", block_size=block_size, head_size=config.head_dim,
        sliding_window="sliding_attention" in kinds, chunked_attention="chunked_attention" in kinds,
        attention_chunk_size=config.attention_chunk_size, logit_softcap=config.attn_logit_softcapping is not None,
        mla=config.mla, backend_options=dict(options or {})))


def bind_attention(layers: Mapping[str, Attention], config, *, model_dtype: str, num_blocks: int,
                   block_size: int, requested: str | None, kv_cache_dtype: str | None,
                   options: Mapping | None, device: torch.device) -> CacheSetup:
    """Select backends for the config's layer groups and bind every layer to its own cache tensor."""
    check_options(config, model_dtype=model_dtype, block_size=block_size, kv_cache_dtype=kv_cache_dtype,
                  options=options)
    selection = select_for_model(config, kv_cache_dtype=kv_cache_dtype, requested=requested, dtype=model_dtype,
                                 block_size=block_size)
    backend_classes = [result.backend_cls for _, result in selection.groups]
    layout, total = _layout_for(backend_classes), 0
    for layer in layers.values():
        backend_cls = selection.backend_for(layer.attn_type.value).backend_cls
        spec = backend_cls.get_kv_cache_spec(layer.geometry, model_dtype, kv_cache_dtype, block_size, layout)
        cache = spec.allocate(num_blocks, device=device)
        total += cache.numel() * cache.element_size()
        layer.bind(backend_cls, cache, kv_cache_dtype, options=(options or {}).get(backend_cls.name))
    return CacheSetup(selection, _one_metadata_backend(selection), layout, total)


def _extra_blocks(manager: KVCacheManager, rid, start: int, n: int) -> int:
    """Blocks request `rid` needs to take `n` tokens at `start`; checks that `start` continues its cache."""
    if rid not in manager:
        if start != 0:
            raise ValueError(f"request {rid!r} is new (nothing cached) but start_pos is {start}; start at 0")
        return manager.blocks_needed(n)
    cached = manager.num_tokens(rid)
    if start != cached:
        raise ValueError(f"request {rid!r}: start_pos {start} but {cached} tokens are cached; "
                         f"send the tokens from position {cached}")
    return manager.blocks_needed(cached + n) - len(manager.block_table(rid))


def reserve_blocks(manager: KVCacheManager, batch: list[tuple[object, int, int]]) -> None:
    """Grow every request of the step by its new tokens, all or nothing.

    `batch`: (request_id, start_pos, num_new_tokens). A new request must start at position 0; a known
    one must continue exactly where its cache ends.
    """
    needed = sum(_extra_blocks(manager, rid, start, n) for rid, start, n in batch)
    if needed > manager.num_free_blocks:
        raise KVCacheExhausted(f"this step needs {needed} more KV-cache block(s) but only "
                               f"{manager.num_free_blocks} of {manager.num_blocks} are free; run fewer "
                               f"requests per step or free finished ones (ModelRunner.free)")
    for rid, _, n in batch:
        if rid in manager:
            manager.append(rid, n)
        else:
            manager.allocate(rid, n)
