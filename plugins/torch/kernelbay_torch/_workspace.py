"""Reusable scratch tensors, so a per-step gather does not allocate (and page-fault) every call.

Layers run one after another, so one buffer per (purpose, dtype, device) serves every layer.
"""

from __future__ import annotations

import torch

_BUFFERS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # key -> (flat buffer, its last shaped view)


def scratch(purpose: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of `shape`, carved from a cached flat buffer that only ever grows (by a quarter at least, so a
    decode whose keys grow by one a step reallocates rarely). The step's layers after the first get the same
    view back, at no aten call."""
    key = (purpose, dtype, str(device))
    numel = 1
    for size in shape:
        numel *= size
    buf, view = _BUFFERS.get(key, (None, None))
    # A buffer made under torch.inference_mode() (ModelRunner.step) cannot be written outside it.
    stale = buf is not None and buf.is_inference() and not torch.is_inference_mode_enabled()
    if buf is None or buf.numel() < numel or stale:
        grown = numel if buf is None or stale else max(numel, buf.numel() * 5 // 4)
        buf, view = torch.empty(grown, dtype=dtype, device=device), None
    if view is None or view.shape != shape:
        view = buf[:numel].view(shape)
        _BUFFERS[key] = (buf, view)
    return view


def release_scratch() -> None:
    """Drop every cached buffer (tests, or to give memory back)."""
    _BUFFERS.clear()
