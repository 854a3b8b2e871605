"""ACME_INT8: paged attention that keeps the KV cache in int8 with one scale per (block, kv head).

The kernel never materialises dequantised keys or values: it multiplies the queries by the int8 keys
and applies each key's block scale to the scores, and folds each value's block scale into the
attention weights before multiplying by the int8 values.
"""

from __future__ import annotations

import torch

from kernelbay.attention import ANY, AttentionBackend, AttentionMetadata, KVLayout

from .int8_cache import Int8KVCacheSpec, Int8PagedKV


class AcmeInt8Backend(AttentionBackend):
    name = "ACME_INT8"
    # Honest capabilities: what `_attend` below really implements, nothing more.
    head_sizes = ANY  # the int8 kernel is head-size agnostic
    dtypes = frozenset({"float32", "bfloat16", "float16"})
    kv_cache_dtypes = frozenset({"auto"})  # the cache is always int8 + per-block scales ("auto" = native)
    block_sizes = (16, 32)  # Acme's DMA engine moves whole 16- or 32-token pages
    kv_layouts = frozenset({KVLayout.NHD})
    sliding_window = True
    logit_softcap = True
    platforms = frozenset({"acme"})
    preferred_block_size = 16

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        return True, "pure PyTorch kernel: runs wherever the acme platform is current"

    @classmethod
    def get_kv_cache_spec(
        cls, geometry, model_dtype, kv_cache_dtype="auto", block_size=None, layout=KVLayout.NHD
    ) -> Int8KVCacheSpec:
        return Int8KVCacheSpec(
            num_kv_heads=geometry.num_kv_heads,
            head_dim=geometry.head_dim,
            block_size=block_size or cls.preferred_block_size,
            layout=layout,
        )

    def attach_kv_cache(self, kv_cache: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
        """`kv_cache` is the int8 payload from `Int8KVCacheSpec.allocate`; the scales are kept here."""
        store = Int8PagedKV(kv_cache)
        if store.block_size not in self.block_sizes:
            raise ValueError(
                f"ACME_INT8 pages in blocks of {', '.join(map(str, self.block_sizes))} tokens, got a "
                f"cache with block size {store.block_size}"
            )
        self.store, self.kv_cache = store, kv_cache

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, metadata: AttentionMetadata) -> None:
        self.store.write(0, k, metadata.slot_mapping)
        self.store.write(1, v, metadata.slot_mapping)

    def _attend(self, q: torch.Tensor, metadata: AttentionMetadata, args) -> torch.Tensor:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        starts, kv_starts = metadata.query_start_loc.tolist(), metadata.kv_start_loc.tolist()
        for r, (q_len, seq_len) in enumerate(zip(metadata.query_lens_host, metadata.seq_lens_host, strict=True)):
            slots = metadata.kv_gather_index[kv_starts[r] : kv_starts[r + 1]]
            rows = slice(starts[r], starts[r] + q_len)
            out[rows] = self._attend_one(q[rows], slots, seq_len - q_len, self.is_causal(args)).to(q.dtype)
        return out

    def _attend_one(self, q: torch.Tensor, slots: torch.Tensor, context_len: int, causal: bool) -> torch.Tensor:
        """q [Q, H, D] of one request over its S cached keys at `slots` [S] -> [Q, H, D] float32."""
        g = self.geometry
        k_int, k_scale = self.store.gather(0, slots)  # [S, h, D] int8, [S, h]
        v_int, v_scale = self.store.gather(1, slots)
        group = g.num_queries_per_kv
        qh = q.float().view(q.shape[0], g.num_kv_heads, group, g.head_dim)  # [Q, h, g, D]
        scores = torch.einsum("qhgd,shd->hgqs", qh, k_int.float())
        scores = scores * (k_scale.t()[:, None, None, :] * g.scale)  # key block scales, per kv head
        if g.logit_softcap is not None:
            scores = torch.tanh(scores / g.logit_softcap) * g.logit_softcap
        scores = scores.masked_fill(
            ~self._visible(q.shape[0], slots.shape[0], context_len, causal, q.device), float("-inf")
        )
        weights = torch.softmax(scores, dim=-1) * v_scale.t()[:, None, None, :]  # value block scales folded in
        out = torch.einsum("hgqs,shd->qhgd", weights, v_int.float())
        return out.reshape(q.shape[0], g.num_heads, g.head_dim)

    def _visible(self, q_len: int, kv_len: int, context_len: int, causal: bool, device) -> torch.Tensor:
        """[Q, S] bool: which keys each query may see (causal, and the sliding window if any)."""
        q_pos = torch.arange(context_len, context_len + q_len, device=device)[:, None]
        k_pos = torch.arange(kv_len, device=device)[None, :]
        visible = k_pos <= q_pos if causal else torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
        if self.geometry.sliding_window is not None:
            visible = visible & (q_pos - k_pos < self.geometry.sliding_window)
        return visible
