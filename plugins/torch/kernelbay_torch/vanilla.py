"""VANILLA: the reference backend. Plain torch math over the paged cache, one request at a time."""

from __future__ import annotations

import torch

from kernelbay.attention import (
    ANY,
    SPARSE_DSA,
    SPARSE_NONE,
    AttentionBackend,
    AttentionForwardArgs,
    AttentionMetadata,
    KVLayout,
)
from kernelbay.dtypes import KV_CACHE_DTYPES, MODEL_DTYPES

from ._masks import allowed_keys, request_spans, selected_keys


class VanillaBackend(AttentionBackend[AttentionMetadata]):
    """Readable and complete rather than fast: every other backend is tested against it."""

    name = "VANILLA"
    head_sizes = ANY  # plain torch: any head size, block size and platform torch runs on
    dtypes = frozenset(MODEL_DTYPES)
    kv_cache_dtypes = frozenset(KV_CACHE_DTYPES)
    block_sizes = ANY
    kv_layouts = frozenset(KVLayout)
    platforms = ANY
    mla = True
    sliding_window = True
    chunked_attention = True
    encoder = True
    logit_softcap = True
    sinks = True
    sparse_modes = frozenset({SPARSE_NONE, SPARSE_DSA})  # DSA: the mask keeps only the indexer's top-k keys

    def _attend(self, q: torch.Tensor, md: AttentionMetadata, args: AttentionForwardArgs) -> torch.Tensor:
        g = self.geometry
        out = q.new_empty(q.shape[0], g.num_heads, g.v_head_dim)
        causal = self.is_causal(args)
        for q0, q1, k0, k1 in request_spans(md):
            keys, values = self._keys_values(md.kv_gather_index[k0:k1], md, q.dtype)
            k_pos = torch.arange(k1 - k0, device=q.device)
            mask = allowed_keys(md.positions[q0:q1], k_pos, g, causal)
            if args.topk_indices is not None:
                picked = selected_keys(args.topk_indices[q0:q1], k1 - k0)
                mask = picked if mask is None else mask & picked
            out[q0:q1] = self._attend_one(q[q0:q1], keys, values, mask, args.sinks).to(q.dtype)
        return out

    def _keys_values(self, slots: torch.Tensor, md: AttentionMetadata, dtype: torch.dtype):
        """[S, H, qk_dim] keys and [S, H, v_dim] values, kv heads repeated for GQA/MQA."""
        k, v = self.read_kv(slots, md.layout, dtype)
        if self.geometry.mla is not None:
            return self._decompress(k, v)
        group = self.geometry.num_queries_per_kv
        return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def _decompress(self, latent: torch.Tensor, k_pe: torch.Tensor):
        """Naive MLA: kv_b_proj(latent) -> per-head k_nope ‖ v; the shared k_pe joins every head."""
        g, mla = self.geometry, self.geometry.mla
        kv = self.kv_b_proj(latent).view(latent.shape[0], g.num_heads, mla.qk_nope_head_dim + mla.v_head_dim)
        k_nope, v = kv.split([mla.qk_nope_head_dim, mla.v_head_dim], dim=-1)
        k_pe = k_pe.unsqueeze(1).expand(-1, g.num_heads, -1)
        return torch.cat([k_nope, k_pe], dim=-1), v

    def _attend_one(self, q, k, v, mask, sinks=None):
        """q [Tq, H, D], k [S, H, D], v [S, H, Dv], mask [Tq, S] or None, sinks [H] or None -> [Tq, H, Dv],
        in float32."""
        scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * self.geometry.scale
        cap = self.geometry.logit_softcap
        if cap is not None:
            scores = cap * torch.tanh(scores / cap)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        if sinks is not None:  # one more logit per head in the denominator, with no value: dropped after softmax
            sink = sinks.float().view(-1, 1, 1).expand(-1, scores.shape[1], 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a query that sees no key outputs zeros
        return torch.einsum("hqk,khd->qhd", probs, v.float())
