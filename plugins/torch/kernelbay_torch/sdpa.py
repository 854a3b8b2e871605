"""SDPA: `torch.nn.functional.scaled_dot_product_attention` over the paged cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernelbay.attention import AttentionBackend, AttentionForwardArgs, AttentionMetadata, KVLayout
from kernelbay.attention._types import KV_CACHE_DTYPES
from kernelbay.attention import _cache_ops as ops

from ._masks import allowed_keys, request_spans
from ._workspace import scratch


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
    """Batched decode in one SDPA call over a gathered (preallocated) buffer; prefill per request.

    Honest capabilities: no logit soft-cap (SDPA cannot apply tanh capping), no MLA.
    """

    name = "SDPA"
    Metadata = SdpaMetadata
    kv_cache_dtypes = frozenset(KV_CACHE_DTYPES)
    sliding_window = True
    chunked_attention = True
    encoder = True

    def _attend(self, q: torch.Tensor, md: SdpaMetadata, args: AttentionForwardArgs) -> torch.Tensor:
        if md.decode_index is not None:
            return self._decode(q, md, args)
        g = self.geometry
        out = q.new_empty(q.shape[0], g.num_heads, g.head_dim)
        causal = self.is_causal(args)
        for q0, q1, k0, k1 in request_spans(md):
            k, v = self.read_kv(md.kv_gather_index[k0:k1], md.layout, q.dtype)
            mask = self._prefill_mask(md.positions[q0:q1], k1 - k0, q1 - q0, causal)
            out[q0:q1] = self._sdpa(q[q0:q1].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), mask,
                                    is_causal=mask is None and causal).transpose(0, 1)
        return out

    def _prefill_mask(self, q_pos, seq_len: int, q_len: int, causal: bool):
        """None when plain causal from position 0 (SDPA's is_causal), else an explicit bool mask."""
        g = self.geometry
        if causal and seq_len == q_len and g.sliding_window is None and g.chunk_size is None:
            return None
        return allowed_keys(q_pos, torch.arange(seq_len, device=q_pos.device), g, causal)

    def _decode(self, q: torch.Tensor, md: SdpaMetadata, args: AttentionForwardArgs) -> torch.Tensor:
        g = self.geometry
        batch, width = md.decode_index.shape
        k = self._gather("k", 0, md.decode_index, md.layout, q.dtype, self.k_scale)
        v = self._gather("v", 1, md.decode_index, md.layout, q.dtype, self.v_scale)
        k = k.view(batch, width, g.num_kv_heads, g.head_dim).transpose(1, 2)
        v = v.view(batch, width, g.num_kv_heads, g.head_dim).transpose(1, 2)
        mask = self._decode_mask(md)
        out = self._sdpa(q.unsqueeze(2), k, v, mask, is_causal=False)
        return out.squeeze(2)

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
        # decode queries are the last token, so "causal" only hides padding, whatever args.causal says
        mask = allowed_keys(md.positions.unsqueeze(1), key_pos, g, True)
        return mask.view(md.num_reqs, 1, 1, width)

    def _sdpa(self, q, k, v, mask, is_causal: bool):
        """q [..., H, Tq, D], k/v [..., Hkv, S, D]; GQA handled by SDPA itself."""
        gqa = self.geometry.num_heads != self.geometry.num_kv_heads
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                              scale=self.geometry.scale, enable_gqa=gqa)
