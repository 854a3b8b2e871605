"""SDPA: `torch.nn.functional.scaled_dot_product_attention` over the paged cache."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kernelbay.attention import (
    ANY,
    SPARSE_NONE,
    AttentionBackend,
    AttentionForwardArgs,
    AttentionMetadata,
    KVLayout,
    padded_slots,
)
from kernelbay.attention import cache_ops as ops
from kernelbay.dtypes import KV_CACHE_DTYPES, MODEL_DTYPES

from ._masks import allowed_keys, request_spans
from ._workspace import scratch

# Below this many keys per request, one batched SDPA over a gathered copy beats one call per request
# on zero-copy views (per-call overhead dominates). With heads stored outermost the views won from
# ~160 keys at batch 1, 8 and 32 (gathering won at 64 keys, batch 8); see benchmarks/RESULTS-attention.md.
MIN_KEYS_FOR_VIEWS = 128
# A request adding at most this many tokens after cached ones (a speculative verify row: its last token and the
# guesses) attends query by query through the decode path: one SDPA call over all its queries sums in another
# order (CPU flash blocks, a mask), and those last bits, amplified by int8 activations, flipped greedy tokens on
# SmolLM2 Q4_1 after 56 tokens; per query, verifying gives decoding's bits and speculation stays lossless.
MAX_QUERIES_DECODED_EACH = 16


@dataclass(frozen=True, slots=True)
class SdpaMetadata(AttentionMetadata):
    """Adds the decode batch's padded gather index, computed once per step for every layer."""

    decode_index: torch.Tensor | None = None
    """(B, max_seq_len) int64 flat slots per request, padded with the request's slot 0; None unless decode-only."""
    shared: dict = field(default_factory=dict, compare=False)
    """What the batched decode derives from the above, built by the step's first layer that needs it and reused by
    the others: ("mask", sliding_window, chunk_size) -> [B, 1, 1, width] bool or None (every key visible), and
    ("index", sinks) -> the flat gather index (with sinks, each row's slot 0 once more: the sink's key)."""

    @classmethod
    def _extras(cls, md: AttentionMetadata) -> dict:
        return {"decode_index": padded_slots(md, md.max_seq_len)} if md.is_decode_only else {}


class SdpaBackend(AttentionBackend[SdpaMetadata]):
    """Decode: one SDPA call over a gathered (preallocated) buffer, or one call per request on zero-copy
    views when every request's blocks are one run of an NHD cache. Prefill: one call per request; a request adding a
    few tokens after cached ones (a speculative verify row) one decode call per token, for decoding's bits.
    Decode folds the query heads sharing a KV head into the query length (reads each KV head once).

    Honest capabilities: no logit soft-cap (SDPA cannot apply tanh capping), no MLA. Sinks are exact: one extra
    key per request whose score is the head's sink (a float mask at decode, a lifted query component in prefill)
    and whose value is zero.
    """

    name = "SDPA"
    Metadata = SdpaMetadata
    head_sizes = ANY  # plain torch: any head size, block size and platform torch runs on
    dtypes = frozenset(MODEL_DTYPES)
    kv_cache_dtypes = frozenset(KV_CACHE_DTYPES)
    block_sizes = ANY
    kv_layouts = frozenset(KVLayout)
    platforms = ANY
    sparse_modes = frozenset({SPARSE_NONE})  # not "dsa": DSA runs on MLA, which SDPA does not implement
    sliding_window = True
    chunked_attention = True
    encoder = True
    sinks = True

    @classmethod
    def get_kv_cache_stride_order(cls, layout: KVLayout | str = KVLayout.NHD) -> tuple[int, ...]:
        """Heads outermost within a plane: a request's run of blocks is, per KV head, one contiguous
        [tokens, head_dim] matrix, which SDPA reads like a contiguous tensor (the NHD view strides every
        key by kv_heads * head_dim; measured ~8-15% slower at batch 8 / context 2048)."""
        return (0, 3, 1, 2, 4) if KVLayout.parse(layout) is KVLayout.NHD else (0, 2, 1, 3, 4)

    def _attend(self, q: torch.Tensor, md: SdpaMetadata, args: AttentionForwardArgs) -> torch.Tensor:
        views = self.cache_views(md.layout)
        if md.decode_index is not None and (self.geometry.sinks or not self._views_pay_off(md, q.dtype, views)):
            return self._decode_batched(q, md, args.sinks, views)  # sinks: the gathered copy takes their column
        spans = request_spans(md)
        if len(spans) == 1:  # one request: its answer is the output, no copy into a buffer
            return self._attend_request(q, md, args, 0, spans[0], views)
        out = q.new_empty(q.shape[0], self.geometry.num_heads, self.geometry.head_dim)
        for i, span in enumerate(spans):
            out[span[0] : span[1]] = self._attend_request(q, md, args, i, span, views)
        return out

    def _attend_request(self, q, md: SdpaMetadata, args: AttentionForwardArgs, i: int, span, views) -> torch.Tensor:
        """Request i's queries q[q0:q1] over its keys -> [q1 - q0, H, D]."""
        q0, q1, k0, k1 = span
        k, v = self._request_kv(md, i, k0, k1, q.dtype, views)
        causal, rows = self.is_causal(args), q if q1 - q0 == q.shape[0] else q[q0:q1]  # a slice is a call too
        if self.geometry.sinks:
            return self._sinks_one(rows, k, v, md.positions[q0:q1], causal, args.sinks)
        if q1 - q0 == 1 and causal:
            return self._decode_one(rows, k, v, md.seq_lens_host[i] - 1)
        if causal and q1 - q0 <= MAX_QUERIES_DECODED_EACH and k1 - k0 > q1 - q0:
            return self._decode_each(rows, k, v, md.seq_lens_host[i])
        return self._prefill_one(rows, k, v, md.positions[q0:q1], causal)

    def _zero_copy(self, views: ops.CacheViews, dtype: torch.dtype) -> bool:
        """Whether the cache can be read as is: per-head views exist and hold `dtype` unscaled."""
        return views.by_head is not None and self.kv_cache.dtype == dtype and self.k_scale == self.v_scale == 1.0

    def _views_pay_off(self, md: SdpaMetadata, dtype: torch.dtype, views: ops.CacheViews) -> bool:
        """Decode on zero-copy views (one SDPA call per request) rather than one call over a gathered copy: at
        batch 1 always (no copy, fewer calls), with more requests from MIN_KEYS_FOR_VIEWS keys each."""
        return (
            None not in md.run_start_slots
            and self._zero_copy(views, dtype)
            and (md.num_reqs == 1 or min(md.seq_lens_host) >= MIN_KEYS_FOR_VIEWS)
        )

    def _request_kv(self, md: SdpaMetadata, i: int, k0: int, k1: int, dtype: torch.dtype, views: ops.CacheViews):
        """[1, kv_heads, S, D] keys and values: a zero-copy slice when the request is one run, else a gather."""
        start = md.run_start_slots[i]
        if start is not None and self._zero_copy(views, dtype):
            k_heads, v_heads = views.by_head
            return k_heads.narrow(2, start, k1 - k0), v_heads.narrow(2, start, k1 - k0)
        k, v = self.read_kv(md.kv_gather_index[k0:k1], md.layout, dtype)
        return _heads_first(k), _heads_first(v)

    def _first_visible(self, pos: int) -> int:
        """The oldest key a query at `pos` sees under this layer's window / chunk."""
        g, first = self.geometry, 0
        if g.sliding_window is not None:
            first = max(first, pos - g.sliding_window + 1)
        if g.chunk_size is not None:
            first = max(first, pos // g.chunk_size * g.chunk_size)
        return first

    def _decode_one(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int) -> torch.Tensor:
        """q [1, H, D], the request's last token, over k/v [1, kv_heads, S, D] -> [1, H, D]."""
        g = self.geometry
        first = self._first_visible(pos)
        if first:  # a window or chunk hides the oldest keys
            k, v = k[:, :, first:], v[:, :, first:]
        folded = q.view(1, g.num_kv_heads, g.num_queries_per_kv, g.head_dim)
        out = F.scaled_dot_product_attention(folded, k, v, scale=g.scale)
        return out.view(1, g.num_heads, g.head_dim)

    def _decode_each(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_len: int) -> torch.Tensor:
        """q [Tq, H, D], a request's last Tq tokens, over k/v [1, kv_heads, seq_len, D] -> [Tq, H, D]: each query
        through `_decode_one` over the keys up to its own, so it gets the bits decoding it alone would."""
        out = torch.empty_like(q)
        for j, pos in enumerate(range(seq_len - q.shape[0], seq_len)):
            out[j : j + 1] = self._decode_one(q[j : j + 1], k[:, :, : pos + 1], v[:, :, : pos + 1], pos)
        return out

    def _prefill_one(self, q, k, v, q_pos, causal: bool) -> torch.Tensor:
        """q [Tq, H, D] over k/v [1, kv_heads, S, D] -> [Tq, H, D]; SDPA's is_causal when it means the same."""
        g = self.geometry
        seq_len, q_len = k.shape[2], q.shape[0]
        plain_causal = causal and seq_len == q_len and g.sliding_window is None and g.chunk_size is None
        mask = None if plain_causal else allowed_keys(q_pos, torch.arange(seq_len, device=q.device), g, causal)
        out = F.scaled_dot_product_attention(
            _heads_first(q),
            k,
            v,
            attn_mask=mask,
            is_causal=plain_causal,
            scale=g.scale,
            enable_gqa=g.num_heads != g.num_kv_heads,
        )
        return out[0].transpose(0, 1)

    def _sinks_one(self, q, k, v, q_pos, causal: bool, sinks: torch.Tensor) -> torch.Tensor:
        """q [Tq, H, D] over k/v [1, kv_heads, S, D] with sinks [H] -> [Tq, H, D]. The sink is one more key, seen by
        every query, that scores exactly the head's sink: each query gains a component sink / scale, the sink key is
        the unit vector on it (real keys are 0 there), and its value is zero -- the same softmax, with a bool mask
        shared by the heads instead of a per-head float one (whose [H, Tq, S + 1] build costs as much as SDPA)."""
        g = self.geometry
        seq_len = k.shape[2]
        keep = allowed_keys(q_pos, torch.arange(seq_len, device=q.device), g, causal)
        if keep is not None:
            keep = torch.cat([keep, keep.new_ones(keep.shape[0], 1)], dim=1)
        lifted = (sinks.to(q.dtype) / g.scale).view(1, -1, 1).expand(q.shape[0], -1, 1)
        k_ext = F.pad(k, (0, 1, 0, 1))  # [1, kv_heads, S + 1, D + 1]
        k_ext[:, :, -1, -1] = 1.0
        out = F.scaled_dot_product_attention(
            _heads_first(torch.cat([q, lifted], dim=-1)),
            k_ext,
            F.pad(v, (0, 1, 0, 1)),  # SDPA's fused kernels want one head size for q, k, v
            attn_mask=keep,
            scale=g.scale,
            enable_gqa=g.num_heads != g.num_kv_heads,
        )
        return out[0].transpose(0, 1)[..., : g.head_dim]

    def _decode_batched(
        self, q: torch.Tensor, md: SdpaMetadata, sinks: torch.Tensor | None, views: ops.CacheViews
    ) -> torch.Tensor:
        """Every request's last token in one call over a gathered [B, kv_heads, width, D] copy (sinks: one more
        key per request, gathered then zeroed, its logit the sink, as in `_sinks_one`: no extra copy)."""
        g = self.geometry
        batch, width = md.num_reqs, md.decode_index.shape[1] + (sinks is not None)
        k, v = self._gather(_flat_index(md, sinks is not None), batch, width, md.layout, q.dtype, views)
        folded = q.view(batch, g.num_kv_heads, g.num_queries_per_kv, g.head_dim)
        mask = self._decode_mask(md)
        if sinks is not None:
            k[:, :, -1], v[:, :, -1] = 0.0, 0.0
            shape = (batch if mask is not None else 1, *folded.shape[1:3], width)
            mask = _sink_bias(mask, sinks.view(g.num_kv_heads, g.num_queries_per_kv), shape, q.dtype)
        out = F.scaled_dot_product_attention(folded, k, v, attn_mask=mask, scale=g.scale)
        return out.view(batch, g.num_heads, g.head_dim)

    def _gather(self, index: torch.Tensor, batch: int, width: int, layout: KVLayout, dtype, views: ops.CacheViews):
        """Keys and values at the flat `index` [B * width] as [B, kv_heads, width, head_dim] each, in a reused
        buffer: one index_select over both planes when their heads merge (SDPA's own cache), else one per plane."""
        g = self.geometry
        if views.heads_flat is not None and self._zero_copy(views, dtype):
            flat = views.heads_flat
            buf = scratch("sdpa-kv", (flat.shape[0], index.numel(), g.head_dim), dtype, index.device)
            both = torch.index_select(flat, 1, index, out=buf)  # [2 * kv_heads, B * width, D]
            return both.view(2, g.num_kv_heads, batch, width, g.head_dim).transpose(1, 2).unbind(0)
        shape = (index.numel(), g.num_kv_heads, g.head_dim)
        planes = []
        for plane, (purpose, scale) in enumerate((("k", self.k_scale), ("v", self.v_scale))):
            buf = scratch(f"sdpa-{purpose}", shape, dtype, index.device)
            got = ops.read_plane(self.kv_cache[plane], index, layout, dtype, scale, out=buf)
            planes.append(got.view(batch, width, g.num_kv_heads, g.head_dim).transpose(1, 2))
        return tuple(planes)

    def _decode_mask(self, md: SdpaMetadata) -> torch.Tensor | None:
        """[B, 1, 1, width] bool, or None when every gathered key is visible (once per step and window)."""
        g = self.geometry
        key = ("mask", g.sliding_window, g.chunk_size)
        if key not in md.shared:
            md.shared[key] = _decode_mask(md, g)
        return md.shared[key]


def _flat_index(md: SdpaMetadata, sinks: bool) -> torch.Tensor:
    key = ("index", sinks)
    if key not in md.shared:
        index = md.decode_index
        md.shared[key] = (torch.cat([index, index[:, :1]], dim=1) if sinks else index).view(-1)
    return md.shared[key]


def _decode_mask(md: SdpaMetadata, g) -> torch.Tensor | None:
    width = md.decode_index.shape[1]
    if g.sliding_window is None and g.chunk_size is None and min(md.seq_lens_host) == width:
        return None
    # decode queries are each request's last token, so "causal" hides exactly the padding past its seq_len
    mask = allowed_keys(md.positions.unsqueeze(1), torch.arange(width, device=md.positions.device), g, True)
    return mask.view(md.num_reqs, 1, 1, width)


def _sink_bias(keep: torch.Tensor | None, sinks: torch.Tensor, shape: tuple[int, ...], dtype) -> torch.Tensor:
    """Float SDPA mask `shape` = [..., S + 1]: -inf where `keep` (bool, broadcast to [..., S]) hides a key, the sink
    logits (broadcast to shape[:-1]) in the last column, so the zero sink key scores exactly its sink."""
    bias = torch.zeros(shape, dtype=dtype, device=sinks.device)
    if keep is not None:
        bias[..., :-1].masked_fill_(~keep, float("-inf"))
    bias[..., -1] = sinks.to(dtype)
    return bias


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """[S, heads, D] -> [1, heads, S, D] view (4-D: CPU SDPA's fused kernels skip 3-D inputs)."""
    return x.transpose(0, 1).unsqueeze(0)
