"""Reading and writing the paged cache tensor (see `KVCacheSpec.cache_shape`), shared by backends."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._geometry import KVLayout

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def _to_storage(x: torch.Tensor, storage: torch.dtype, scale: float) -> torch.Tensor:
    if storage == torch.float8_e4m3fn:
        return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(storage)
    return x if x.dtype == storage else x.to(storage)  # a same-dtype .to() is still a dispatched call


def _bytes_view(x: torch.Tensor) -> torch.Tensor:
    """fp8 tensors lack index kernels on CPU; move their bytes as uint8 instead."""
    return x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x


@dataclass(frozen=True, slots=True)
class CacheViews:
    """Views of one layer's cache tensor, made once per cache (a view costs aten calls, and every layer of
    every step would otherwise rebuild them): a step's write is then one index_copy_ per plane, a run of
    consecutive slots one zero-copy slice per plane, a decode gather one index_select for both planes."""

    by_slot: tuple[torch.Tensor, ...] | None
    """Per plane, [num_blocks * block_size, kv_heads, dim]; None when a block's offsets do not merge with
    the block index (an HND cache stored block-major): writes and reads then index (block, offset)."""
    by_head: tuple[torch.Tensor, ...] | None
    """Per plane, [1, kv_heads, num_blocks * block_size, dim] (what SDPA takes); None when by_slot is."""
    heads_flat: torch.Tensor | None
    """[planes * kv_heads, num_blocks * block_size, dim] when the planes' heads merge too (heads outermost in
    memory, as SDPA stores them): one index_select along dim 1 gathers the keys and values of every head."""


def cache_views(cache: torch.Tensor, layout: KVLayout) -> CacheViews:
    """The `CacheViews` of a [planes, blocks, ...] cache tensor in `layout` (see `KVCacheSpec.cache_shape`)."""
    by_block = cache if layout is KVLayout.NHD else cache.transpose(2, 3)  # [planes, blocks, offsets, heads, dim]
    planes, nb, bs, h, d = by_block.shape
    if by_block.stride(1) != bs * by_block.stride(2):
        return CacheViews(None, None, None)
    merged = by_block.view(planes, nb * bs, h, d)
    by_head = merged.permute(0, 2, 1, 3)  # [planes, heads, slots, dim]
    heads_flat = by_head.view(planes * h, nb * bs, d) if by_head.stride(0) == h * by_head.stride(1) else None
    return CacheViews(tuple(merged.unbind(0)), tuple(p.unsqueeze(0) for p in by_head.unbind(0)), heads_flat)


def write_planes(
    cache: torch.Tensor,
    views: CacheViews,
    values: tuple[torch.Tensor, ...],
    slots: torch.Tensor,
    layout: KVLayout,
    scales: tuple[float, ...],
) -> None:
    """Store `values[i]` [T, kv_heads, dim] at flat `slots` [T] of plane i (one index_copy_ each on the views)."""
    for i, (x, scale) in enumerate(zip(values, scales, strict=True)):
        if views.by_slot is None:
            write_plane(cache[i], x, slots, layout, scale)
            continue
        flat = views.by_slot[i]
        _bytes_view(flat).index_copy_(0, slots, _bytes_view(_to_storage(x, flat.dtype, scale)))


def write_plane(
    plane: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, layout: KVLayout, scale: float = 1.0
) -> None:
    """Store `values` [T, kv_heads, dim] at flat `slots` [T] of one cache plane."""
    stored = _bytes_view(_to_storage(values, plane.dtype, scale))
    plane = _bytes_view(plane)
    if layout is KVLayout.NHD:
        nb, bs, h, d = plane.shape
        plane.view(nb * bs, h, d).index_copy_(0, slots, stored)
        return
    bs = plane.shape[2]
    plane[torch.div(slots, bs, rounding_mode="floor"), :, slots % bs, :] = stored


def read_plane(
    plane: torch.Tensor,
    slots: torch.Tensor,
    layout: KVLayout,
    dtype: torch.dtype,
    scale: float = 1.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gather `slots` [N] of one cache plane as [N, kv_heads, dim] in `dtype` (fp8 dequantised)."""
    if plane.dtype == torch.float8_e4m3fn:
        raw = read_plane(plane.view(torch.uint8), slots, layout, torch.uint8)
        return raw.view(torch.float8_e4m3fn).to(dtype).mul_(scale)
    if layout is KVLayout.NHD and _heads_outermost(plane):
        gathered = _read_heads_outermost(plane, slots, out if plane.dtype == dtype else None)
    elif layout is KVLayout.NHD:
        nb, bs, h, d = plane.shape
        flat = plane.view(nb * bs, h, d)
        if out is not None and plane.dtype == dtype:
            return torch.index_select(flat, 0, slots, out=out)
        gathered = flat.index_select(0, slots)
    else:
        bs = plane.shape[2]
        gathered = plane[torch.div(slots, bs, rounding_mode="floor"), :, slots % bs, :]
    if gathered.dtype == dtype and scale == 1.0:
        return gathered
    result = gathered.to(dtype)
    return result.mul_(scale) if scale != 1.0 else result


def _heads_outermost(plane: torch.Tensor) -> bool:
    """True for an NHD plane stored heads-first (stride order (3, 1, 2, 4) within the plane)."""
    return plane.shape[2] > 1 and plane.permute(2, 0, 1, 3).is_contiguous()


def _read_heads_outermost(plane: torch.Tensor, slots: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """Gather per head from [kv_heads, slots, dim] storage, so each head's keys land contiguous too.

    Returns [N, kv_heads, dim] with heads outermost in memory; `out` (any contiguous buffer of N *
    kv_heads * dim elements) is reused as that memory."""
    nb, bs, h, d = plane.shape
    by_head = plane.permute(2, 0, 1, 3).view(h, nb * bs, d)
    if out is None:
        return by_head.index_select(1, slots).permute(1, 0, 2)
    return torch.index_select(by_head, 1, slots, out=out.view(h, slots.numel(), d)).permute(1, 0, 2)
