"""Dense reference attention in plain torch (float64), request by request: what every backend must compute.

Written from the protocol's definitions alone (`AttentionGeometry`), never from a backend: causal masking
(none for encoder layers), GQA/MQA head groups, the sliding window (keys at most `sliding_window - 1`
positions behind the query), chunked attention (same `chunk_size`-aligned chunk), logit soft-cap, scale,
attention sinks (a per-head logit in the softmax denominator, with no value), MLA (a per-head k_nope || v from
`kv_b_proj(latent)`, the shared k_pe joining every head) and the KV-cache storage round trip (fp8 e4m3:
divided by the layer's scale, clamped to +-448, rounded, multiplied back). DSA (sparse mode "dsa"): a query
also sees only the keys its row of top-k indices names.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..attention import AttentionGeometry, AttentionType
from ..attention.cache_ops import FP8_MAX
from ..dtypes import dtype_name, storage_dtype, torch_dtype


def stored(x: torch.Tensor, kv_cache_dtype: str, scale: float = 1.0) -> torch.Tensor:
    """`x` as a correct paged cache hands it back (in x's dtype) after storing it as `kv_cache_dtype`."""
    storage = storage_dtype(kv_cache_dtype, dtype_name(x.dtype))
    if storage == "fp8_e4m3":
        fp8 = (x.double() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return (fp8.double() * scale).to(x.dtype)
    return x.to(torch_dtype(storage)).to(x.dtype)


def visible(geometry: AttentionGeometry, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Bool [Tq, S], True where the query at q_pos [Tq] may see the key at k_pos [S]."""
    q, k = q_pos.unsqueeze(1), k_pos.unsqueeze(0)
    keep = torch.ones(q.shape[0], k.shape[1], dtype=torch.bool)
    if geometry.attn_type is not AttentionType.ENCODER:
        keep &= k <= q
    if geometry.sliding_window is not None:
        keep &= q - k < geometry.sliding_window
    if geometry.chunk_size is not None:
        keep &= k // geometry.chunk_size == q // geometry.chunk_size
    return keep


def picked(rows: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Bool [Tq, S], True at the keys each row of DSA top-k indices [Tq, k] names (-1 pads a row)."""
    keep = torch.zeros(rows.shape[0], seq_len, dtype=torch.bool)
    for i, row in enumerate(rows.tolist()):
        keep[i, [key for key in row if key >= 0]] = True
    return keep


def _heads(geometry: AttentionGeometry, keys: torch.Tensor, values: torch.Tensor, kv_b_proj, dtype: torch.dtype):
    """Per query head keys [S, H, head_dim] and values [S, H, v_head_dim], float64."""
    mla = geometry.mla
    if mla is None:
        group = geometry.num_queries_per_kv
        return keys.double().repeat_interleave(group, 1), values.double().repeat_interleave(group, 1)
    kv = kv_b_proj(keys.to(dtype)).double().view(keys.shape[0], geometry.num_heads, -1)
    k_nope, v = kv.split([mla.qk_nope_head_dim, mla.v_head_dim], dim=-1)
    k_pe = values.double().unsqueeze(1).expand(-1, geometry.num_heads, -1)
    return torch.cat([k_nope, k_pe], dim=-1), v


def _attend(
    geometry: AttentionGeometry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks=None, topk=None
) -> torch.Tensor:
    """One request: q [Tq, H, D] (its last Tq positions) over k [S, H, D], v [S, H, Dv] -> [Tq, H, Dv]."""
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * geometry.scale
    cap = geometry.logit_softcap
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)
    seq_len = k.shape[0]
    mask = visible(geometry, torch.arange(seq_len - q.shape[0], seq_len), torch.arange(seq_len))
    if topk is not None:
        mask &= picked(topk, seq_len)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        probs = scores.softmax(dim=-1).nan_to_num(0.0)
    else:
        sink = sinks.double().view(-1, 1, 1).expand(-1, scores.shape[1], 1)
        probs = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]  # the sink's share goes to no value
    return torch.einsum("hqk,khd->qhd", probs, v)


def reference_attention(
    geometry: AttentionGeometry,
    queries: torch.Tensor,
    query_lens: Sequence[int],
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    *,
    kv_b_proj=None,
    kv_cache_dtype: str = "auto",
    kv_scales: tuple[float, float] = (1.0, 1.0),
    sinks: torch.Tensor | None = None,
    topk_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of a packed step, float64 [T, num_heads, v_head_dim].

    queries [T, num_heads, head_dim], packed request after request, `query_lens` [B] tokens each; keys and
    values per request over its whole sequence (context, then the step's new tokens): [seq_len, kv_heads,
    head_dim] each (MLA: latent [seq_len, kv_lora_rank] and k_pe [seq_len, qk_rope_head_dim]). A request's
    queries are its last query_len positions. `sinks` [num_heads]: the layer's sink logits (geometry.sinks).
    `topk_indices` [T, index_topk]: a DSA layer's picks (geometry.indexer), key positions per request, -1 pads.
    """
    if geometry.sinks != (sinks is not None):
        raise ValueError(
            f"geometry.sinks is {geometry.sinks} but sinks {'were not' if geometry.sinks else 'were'} given"
        )
    if (geometry.indexer is not None) != (topk_indices is not None):
        raise ValueError(
            f"geometry.indexer is {geometry.indexer} but topk_indices were {'not ' * (topk_indices is None)}given"
        )
    k_scale, v_scale = kv_scales if geometry.mla is None else (kv_scales[0], kv_scales[0])
    if sum(query_lens) != queries.shape[0]:
        raise ValueError(f"queries hold {queries.shape[0]} tokens but query_lens add up to {sum(query_lens)}")
    out, start = [], 0
    for q_len, k, v in zip(query_lens, keys, values, strict=True):
        k, v = stored(k, kv_cache_dtype, k_scale), stored(v, kv_cache_dtype, v_scale)
        k, v = _heads(geometry, k, v, kv_b_proj, queries.dtype)
        topk = topk_indices[start : start + q_len].cpu() if topk_indices is not None else None
        out.append(_attend(geometry, queries[start : start + q_len], k, v, sinks, topk))
        start += q_len
    return torch.cat(out)
