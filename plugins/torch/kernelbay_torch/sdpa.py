"""SDPA: `torch.nn.functional.scaled_dot_product_attention` over the paged cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernelbay.attention import ANY, SPARSE_NONE, AttentionBackend, AttentionForwardArgs, AttentionMetadata, KVLayout
from kernelbay.attention import _cache_ops as ops
from kernelbay.dtypes import KV_CACHE_DTYPES, MODEL_DTYPES

from ._masks import allowed_keys, request_spans
from ._workspace import scratch

# Below this many keys per request, one batched SDPA over a gathered copy beats one call per request
# on zero-copy views (per-call overhead dominates). With heads stored outermost the views won from
# ~160 keys at batch 1, 8 and 32 (gathering won at 64 keys, batch 8); see benchmarks/RESULTS-attention.md.
MIN_KEYS_FOR_VIEWS = 128


@dataclass(frozen=True, slots=True)
class SdpaMetadata(AttentionMetadata):
    """Adds the decode batch's padded gather index, computed once per step for every layer."""

    decode_index: torch.Tensor | None = None
    """(B, max_seq_len) int64 flat slots per request, padded with the request's slot 0; None unless decode-only."""
    decode_key_pos: torch.Tensor | None = None
    """(B, max_seq_len) int64 key positions, padding marked max_seq_len (never visible); None when all equal."""

    @classmethod
    def _extras(cls, md: AttentionMetadata) -> dict:
        if not md.is_decode_only:
            return {}
        width = md.max_seq_len
        if all(s == width for s in md.seq_lens_host):
            return {"decode_index": md.kv_gather_index.view(md.num_reqs, width)}
        pos = torch.arange(width, device=md.kv_start_loc.device).expand(md.num_reqs, width)
        valid = pos < md.seq_lens.to(torch.int64).unsqueeze(1)
        flat = (md.kv_start_loc[:-1].unsqueeze(1) + pos).clamp(max=md.kv_gather_index.numel() - 1)
        index = torch.where(valid, md.kv_gather_index[flat], md.kv_gather_index[md.kv_start_loc[:-1]].unsqueeze(1))
        return {"decode_index": index, "decode_key_pos": torch.where(valid, pos, width)}


class SdpaBackend(AttentionBackend[SdpaMetadata]):
    """Decode: one SDPA call over a gathered (preallocated) buffer, or one call per request on zero-copy
    views when every request's blocks are one run of an NHD cache. Prefill: one call per request.
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
        g = self.geometry
        if md.decode_index is not None and (g.sinks or not self._views_pay_off(md, q.dtype)):
            return self._decode_batched(q, md, args.sinks)  # sinks: the gathered copy takes their column anyway
        out = q.new_empty(q.shape[0], g.num_heads, g.head_dim)
        causal = self.is_causal(args)
        for i, (q0, q1, k0, k1) in enumerate(request_spans(md)):
            k, v = self._request_kv(md, i, k0, k1, q.dtype)
            if g.sinks:
                out[q0:q1] = self._sinks_one(q[q0:q1], k, v, md.positions[q0:q1], causal, args.sinks)
            elif q1 - q0 == 1 and causal:
                out[q0] = self._decode_one(q[q0], k, v, md.seq_lens_host[i] - 1)
            else:
                out[q0:q1] = self._prefill_one(q[q0:q1], k, v, md.positions[q0:q1], causal)
        return out

    def _views_pay_off(self, md: SdpaMetadata, dtype: torch.dtype) -> bool:
        return (
            md.layout is KVLayout.NHD
            and None not in md.run_start_slots
            and self.kv_cache.dtype == dtype
            and self.k_scale == self.v_scale == 1.0
            and min(md.seq_lens_host) >= MIN_KEYS_FOR_VIEWS
        )

    def _request_kv(self, md: SdpaMetadata, i: int, k0: int, k1: int, dtype: torch.dtype):
        """[S, kv_heads, D] keys and values: a zero-copy view when the request is one run, else a gather."""
        start, length = md.run_start_slots[i], k1 - k0
        k = ops.plane_run(self.kv_cache[0], md.layout, start, length, dtype, self.k_scale)
        v = ops.plane_run(self.kv_cache[1], md.layout, start, length, dtype, self.v_scale)
        if k is None or v is None:
            return self.read_kv(md.kv_gather_index[k0:k1], md.layout, dtype)
        return k, v

    def _first_visible(self, pos: int) -> int:
        """The oldest key a query at `pos` sees under this layer's window / chunk."""
        g, first = self.geometry, 0
        if g.sliding_window is not None:
            first = max(first, pos - g.sliding_window + 1)
        if g.chunk_size is not None:
            first = max(first, pos // g.chunk_size * g.chunk_size)
        return first

    def _decode_one(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int) -> torch.Tensor:
        """q [H, D] of the request's last token over k/v [S, kv_heads, D] -> [H, D]."""
        g = self.geometry
        first = self._first_visible(pos)
        k, v = _heads_first(k[first : pos + 1]), _heads_first(v[first : pos + 1])
        folded = q.view(1, g.num_kv_heads, g.num_queries_per_kv, g.head_dim)
        out = F.scaled_dot_product_attention(folded, k, v, scale=g.scale)
        return out.reshape(g.num_heads, g.head_dim)

    def _prefill_one(self, q, k, v, q_pos, causal: bool) -> torch.Tensor:
        """q [Tq, H, D] over k/v [S, kv_heads, D] -> [Tq, H, D]; SDPA's is_causal when it means the same."""
        g = self.geometry
        seq_len, q_len = k.shape[0], q.shape[0]
        plain_causal = causal and seq_len == q_len and g.sliding_window is None and g.chunk_size is None
        mask = None if plain_causal else allowed_keys(q_pos, torch.arange(seq_len, device=q.device), g, causal)
        out = F.scaled_dot_product_attention(
            _heads_first(q),
            _heads_first(k),
            _heads_first(v),
            attn_mask=mask,
            is_causal=plain_causal,
            scale=g.scale,
            enable_gqa=g.num_heads != g.num_kv_heads,
        )
        return out[0].transpose(0, 1)

    def _sinks_one(self, q, k, v, q_pos, causal: bool, sinks: torch.Tensor) -> torch.Tensor:
        """q [Tq, H, D] over k/v [S, kv_heads, D] with sinks [H] -> [Tq, H, D]. The sink is one more key, seen by
        every query, that scores exactly the head's sink: each query gains a component sink / scale, the sink key is
        the unit vector on it (real keys are 0 there), and its value is zero -- the same softmax, with a bool mask
        shared by the heads instead of a per-head float one (whose [H, Tq, S + 1] build costs as much as SDPA)."""
        g = self.geometry
        seq_len = k.shape[0]
        keep = allowed_keys(q_pos, torch.arange(seq_len, device=q.device), g, causal)
        if keep is not None:
            keep = torch.cat([keep, keep.new_ones(keep.shape[0], 1)], dim=1)
        lifted = (sinks.to(q.dtype) / g.scale).view(1, -1, 1).expand(q.shape[0], -1, 1)
        k_ext = F.pad(k, (0, 1, 0, 0, 0, 1))  # [S + 1, kv_heads, D + 1]
        k_ext[-1, :, -1] = 1.0
        out = F.scaled_dot_product_attention(
            _heads_first(torch.cat([q, lifted], dim=-1)),
            _heads_first(k_ext),
            _heads_first(F.pad(v, (0, 1, 0, 0, 0, 1))),  # SDPA's fused kernels want one head size for q, k, v
            attn_mask=keep,
            scale=g.scale,
            enable_gqa=g.num_heads != g.num_kv_heads,
        )
        return out[0].transpose(0, 1)[..., : g.head_dim]

    def _decode_batched(self, q: torch.Tensor, md: SdpaMetadata, sinks: torch.Tensor | None) -> torch.Tensor:
        """Every request's last token in one call over a gathered [B, kv_heads, width, D] buffer (sinks: one more
        key per request, gathered then zeroed, its logit the sink, as in `_sinks_one`: no extra copy)."""
        g = self.geometry
        index = md.decode_index
        if sinks is not None:
            index = torch.cat([index, index[:, :1]], dim=1)
        batch, width = index.shape
        k = self._gather("k", 0, index, md.layout, q.dtype, self.k_scale).view(batch, width, g.num_kv_heads, -1)
        v = self._gather("v", 1, index, md.layout, q.dtype, self.v_scale).view(batch, width, g.num_kv_heads, -1)
        folded = q.view(batch, g.num_kv_heads, g.num_queries_per_kv, g.head_dim)
        mask = self._decode_mask(md)
        if sinks is not None:
            k[:, -1], v[:, -1] = 0.0, 0.0
            shape = (batch if mask is not None else 1, *folded.shape[1:3], width)
            mask = _sink_bias(mask, sinks.view(g.num_kv_heads, g.num_queries_per_kv), shape, q.dtype)
        out = F.scaled_dot_product_attention(
            folded, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=g.scale
        )
        return out.reshape(batch, g.num_heads, g.head_dim)

    def _gather(self, purpose: str, plane: int, index: torch.Tensor, layout: KVLayout, dtype, scale: float):
        """[B * width, kv_heads, head_dim] keys or values into a reused buffer."""
        g = self.geometry
        buf = scratch(f"sdpa-{purpose}", (index.numel(), g.num_kv_heads, g.head_dim), dtype, index.device)
        return ops.read_plane(self.kv_cache[plane], index.reshape(-1), layout, dtype, scale, out=buf)

    def _decode_mask(self, md: SdpaMetadata):
        """[B, 1, 1, width] bool, or None when every padded key is visible."""
        g = self.geometry
        needs = md.decode_key_pos is not None or g.sliding_window is not None or g.chunk_size is not None
        if not needs:
            return None
        width = md.decode_index.shape[1]
        key_pos = md.decode_key_pos
        if key_pos is None:
            key_pos = torch.arange(width, device=md.positions.device).expand(md.num_reqs, -1)
        # decode queries are each request's last token, so "causal" only hides the padding
        mask = allowed_keys(md.positions.unsqueeze(1), key_pos, g, True)
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
