"""Which keys a query may see: causal, sliding window, chunked, DSA top-k; shared by the torch backends."""

from __future__ import annotations

import torch

from kernelbay.attention import AttentionGeometry


def allowed_keys(
    q_pos: torch.Tensor, k_pos: torch.Tensor, geometry: AttentionGeometry, causal: bool
) -> torch.Tensor | None:
    """Bool [..., Tq, S] mask (True = attend) from q_pos [..., Tq] and k_pos [..., S]; None when all allowed."""
    q, k = q_pos.unsqueeze(-1), k_pos.unsqueeze(-2)
    mask = None
    if causal:
        mask = k <= q
    if geometry.sliding_window is not None:
        mask = _and(mask, (q - k) < geometry.sliding_window)
    if geometry.chunk_size is not None:
        mask = _and(
            mask,
            torch.div(k, geometry.chunk_size, rounding_mode="floor")
            == torch.div(q, geometry.chunk_size, rounding_mode="floor"),
        )
    return mask


def selected_keys(topk: torch.Tensor, num_keys: int) -> torch.Tensor:
    """Bool [Tq, S] mask (True = attend) of the keys each row of DSA indices [Tq, k] names (-1 pads)."""
    picked = torch.zeros(topk.shape[0], num_keys + 1, dtype=torch.bool, device=topk.device)
    columns = torch.where(topk >= 0, topk, num_keys).to(torch.int64)  # a pad lands in the spare last column
    return picked.scatter_(1, columns, True)[:, :num_keys]


def _and(mask: torch.Tensor | None, more: torch.Tensor) -> torch.Tensor:
    return more if mask is None else mask & more


def request_spans(md) -> list[tuple[int, int, int, int]]:
    """(q_start, q_end, kv_start, kv_end) per request, from host copies (no device sync)."""
    spans, q0, k0 = [], 0, 0
    for q_len, s_len in zip(md.query_lens_host, md.seq_lens_host, strict=True):
        spans.append((q0, q0 + q_len, k0, k0 + s_len))
        q0, k0 = q0 + q_len, k0 + s_len
    return spans
