"""Reusable scratch tensors, so a per-step gather does not allocate (and page-fault) every call.

Layers run one after another, so one buffer per (purpose, dtype, device) serves every layer.
"""

from __future__ import annotations

import torch

_BUFFERS: dict[tuple, torch.Tensor] = {}


def scratch(purpose: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of `shape`, carved from a cached flat buffer that only ever grows."""
    key = (purpose, dtype, str(device))
    numel = 1
    for size in shape:
        numel *= size
    buf = _BUFFERS.get(key)
    # A buffer made under torch.inference_mode() (ModelRunner.step) cannot be written outside it.
    stale = buf is not None and buf.is_inference() and not torch.is_inference_mode_enabled()
    if buf is None or buf.numel() < numel or stale:
        buf = torch.empty(numel, dtype=dtype, device=device)
        _BUFFERS[key] = buf
    return buf[:numel].view(shape)


def release_scratch() -> None:
    """Drop every cached buffer (tests, or to give memory back)."""
    _BUFFERS.clear()
