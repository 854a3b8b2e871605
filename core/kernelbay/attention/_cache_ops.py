"""Reading and writing the paged cache tensor (see `KVCacheSpec.cache_shape`), shared by backends."""

from __future__ import annotations

import torch

from ._geometry import KVLayout

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def _to_storage(x: torch.Tensor, storage: torch.dtype, scale: float) -> torch.Tensor:
    if storage == torch.float8_e4m3fn:
        return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(storage)
    return x.to(storage)


def _bytes_view(x: torch.Tensor) -> torch.Tensor:
    """fp8 tensors lack index kernels on CPU; move their bytes as uint8 instead."""
    return x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x


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


def plane_run(
    plane: torch.Tensor, layout: KVLayout, start_slot: int | None, length: int, dtype: torch.dtype, scale: float = 1.0
) -> torch.Tensor | None:
    """A zero-copy [length, kv_heads, dim] view of consecutive slots, or None when a copy is unavoidable
    (HND layout, a non-run, or a cache dtype that needs converting)."""
    if start_slot is None or layout is not KVLayout.NHD or plane.dtype != dtype or scale != 1.0:
        return None
    nb, bs, h, d = plane.shape
    return plane.view(nb * bs, h, d)[start_slot : start_slot + length]
