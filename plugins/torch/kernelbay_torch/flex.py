"""FLEX: `torch.nn.attention.flex_attention` with block masks.

Prefill and mixed steps: all requests form one packed query sequence against one packed key sequence;
a block mask keeps each query inside its own request (plus causal / sliding-window / chunked rules), so
fully masked blocks are skipped. Decode-only steps: a [B, kv_heads, width, D] batch gathered from the
cache, the query heads sharing a KV head folded into the query length, a per-request length mask.
Lengths are padded to power-of-two buckets, so the compiled kernel is built once per bucket, never
per step.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from kernelbay.attention import (
    ANY,
    SPARSE_NONE,
    AttentionBackend,
    AttentionForwardArgs,
    AttentionMetadata,
    KVLayout,
    padded_slots,
)
from kernelbay.dtypes import KV_CACHE_DTYPES, MODEL_DTYPES

MIN_BUCKET = 128  # flex_attention's default block size
RECOMPILE_LIMIT = 64  # one compiled kernel per (q bucket, kv bucket, dtype, head geometry)


def bucket(n: int) -> int:
    """Smallest power of two >= max(n, MIN_BUCKET)."""
    return max(MIN_BUCKET, 1 << (max(n, 1) - 1).bit_length())


@dataclass(frozen=True, slots=True)
class FlexOptions:
    compile: bool = True
    """Run the compiled kernel (first call per shape bucket compiles, ~15-40 s on CPU); False: eager (slow)."""


@dataclass(frozen=True, slots=True)
class FlexMetadata(AttentionMetadata):
    """Padded packed-step tensors for the block mask, computed once per step."""

    q_doc: torch.Tensor | None = None
    """(Tp,) int64 request index of each padded query (padding -1)."""
    q_pos: torch.Tensor | None = None
    """(Tp,) int64 position of each padded query."""
    kv_doc: torch.Tensor | None = None
    """(Lp,) int64 request index of each padded key (padding -2, never equal to a query's)."""
    kv_pos: torch.Tensor | None = None
    """(Lp,) int64 position of each padded key in its request."""
    kv_index: torch.Tensor | None = None
    """(Lp,) int64 cache slot of each padded key (padding reads slot of key 0, masked out)."""
    decode_index: torch.Tensor | None = None
    """(B, width) int64 cache slots of each request's keys, width a bucket; decode-only steps, else None."""
    block_masks: dict = field(default_factory=dict, compare=False)
    """Block masks built on first use per (causal, sliding_window, chunk_size[, query heads per KV head])."""

    @classmethod
    def _extras(cls, md: AttentionMetadata) -> dict:
        if md.is_decode_only:
            return {"decode_index": padded_slots(md, bucket(md.max_seq_len))}
        t_pad, l_pad = bucket(md.num_tokens), bucket(int(md.kv_gather_index.numel()))
        reqs = torch.arange(md.num_reqs, device=md.positions.device)
        kv_req = torch.repeat_interleave(reqs, md.seq_lens.to(torch.int64))
        kv_pos = torch.arange(kv_req.numel(), device=kv_req.device) - md.kv_start_loc[kv_req]
        return {
            "q_doc": _pad(torch.repeat_interleave(reqs, md.query_lens.to(torch.int64)), t_pad, -1),
            "q_pos": _pad(md.positions, t_pad, 0),
            "kv_doc": _pad(kv_req, l_pad, -2),
            "kv_pos": _pad(kv_pos, l_pad, 0),
            "kv_index": _pad(md.kv_gather_index, l_pad, 0),
        }

    def block_mask(self, causal: bool, window: int | None, chunk: int | None):
        key = (causal, window, chunk)
        if key not in self.block_masks:
            self.block_masks[key] = _make_block_mask(self, causal, window, chunk)
        return self.block_masks[key]

    def decode_block_mask(self, group: int, window: int | None, chunk: int | None):
        key = ("decode", group, window, chunk)
        if key not in self.block_masks:
            self.block_masks[key] = _make_decode_block_mask(self, group, window, chunk)
        return self.block_masks[key]


def _make_decode_block_mask(md: FlexMetadata, group: int, window: int | None, chunk: int | None):
    """Each request's one query (its last token) sees its own keys, within the window / chunk."""
    from torch.nn.attention.flex_attention import create_block_mask

    seq_lens = md.seq_lens.to(torch.int64)

    def mask_mod(b, h, q_idx, kv_idx):
        last = seq_lens[b] - 1
        keep = kv_idx <= last
        if window is not None:
            keep = keep & (last - kv_idx < window)
        if chunk is not None:
            keep = keep & (kv_idx // chunk == last // chunk)
        return keep

    batch, width = md.decode_index.shape
    return create_block_mask(mask_mod, batch, None, group, width, device=md.decode_index.device)


def _pad(x: torch.Tensor, size: int, value: int) -> torch.Tensor:
    out = torch.full((size,), value, dtype=torch.int64, device=x.device)
    out[: x.numel()] = x
    return out


def _make_block_mask(md: FlexMetadata, causal: bool, window: int | None, chunk: int | None):
    from torch.nn.attention.flex_attention import create_block_mask

    q_doc, q_pos, kv_doc, kv_pos = md.q_doc, md.q_pos, md.kv_doc, md.kv_pos

    def mask_mod(b, h, q_idx, kv_idx):
        qp, kp = q_pos[q_idx], kv_pos[kv_idx]
        keep = q_doc[q_idx] == kv_doc[kv_idx]
        if causal:
            keep = keep & (kp <= qp)
        if window is not None:
            keep = keep & (qp - kp < window)
        if chunk is not None:
            keep = keep & (qp // chunk == kp // chunk)
        return keep

    return create_block_mask(mask_mod, None, None, q_doc.numel(), kv_doc.numel(), device=q_doc.device)


@functools.cache
def _compiled_flex():
    """One compiled flex_attention per process; dynamo caches a kernel per shape bucket."""
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    return torch.compile(flex_attention, dynamic=False)


def _softcap_mod(cap: float):
    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    return score_mod


class FlexBackend(AttentionBackend[FlexMetadata]):
    """Compiled block-sparse attention; sliding window, chunked and soft-cap via mask/score mods.

    No sinks: they need the kernel's log-sum-exp (o * sigmoid(lse - sink)), which compiled flex_attention does not
    return on CPU (torch 2.13: "return_lse is not supported yet")."""

    name = "FLEX"
    Metadata = FlexMetadata
    Options = FlexOptions
    head_sizes = frozenset({16, 32, 64, 80, 96, 128, 256})
    dtypes = frozenset(MODEL_DTYPES)
    kv_cache_dtypes = frozenset(KV_CACHE_DTYPES)
    block_sizes = ANY  # the block mask is built per step from whatever pages the engine uses
    kv_layouts = frozenset(KVLayout)
    platforms = ANY  # torch.compile targets the device the tensors live on
    sliding_window = True
    chunked_attention = True
    encoder = True
    logit_softcap = True
    sparse_modes = frozenset({SPARSE_NONE})  # not "dsa": DSA runs on MLA, which FLEX does not implement

    def _attend(self, q: torch.Tensor, md: FlexMetadata, args: AttentionForwardArgs) -> torch.Tensor:
        if md.decode_index is not None:
            return self._decode(q, md)
        g = self.geometry
        k, v = self.read_kv(md.kv_index, md.layout, q.dtype)
        q_pad = q.new_zeros(md.q_doc.numel(), g.num_heads, g.head_dim)
        q_pad[: q.shape[0]] = q
        mask = md.block_mask(self.is_causal(args), g.sliding_window, g.chunk_size)
        out = self._kernel()(
            _bhsd(q_pad),
            _bhsd(k),
            _bhsd(v),
            block_mask=mask,
            scale=g.scale,
            score_mod=_softcap_mod(g.logit_softcap) if g.logit_softcap else None,
            enable_gqa=g.num_heads != g.num_kv_heads,
        )
        return out[0].transpose(0, 1)[: q.shape[0]]

    def _decode(self, q: torch.Tensor, md: FlexMetadata) -> torch.Tensor:
        """q [B, H, D] (each request's last token) over its gathered keys -> [B, H, D]."""
        g = self.geometry
        batch, width = md.decode_index.shape
        k, v = self.read_kv(md.decode_index.reshape(-1), md.layout, q.dtype)
        k = k.view(batch, width, g.num_kv_heads, g.head_dim).transpose(1, 2)
        v = v.view(batch, width, g.num_kv_heads, g.head_dim).transpose(1, 2)
        folded = q.view(batch, g.num_kv_heads, g.num_queries_per_kv, g.head_dim)
        mask = md.decode_block_mask(g.num_queries_per_kv, g.sliding_window, g.chunk_size)
        out = self._kernel()(
            folded,
            k,
            v,
            block_mask=mask,
            scale=g.scale,
            score_mod=_softcap_mod(g.logit_softcap) if g.logit_softcap else None,
        )
        return out.reshape(batch, g.num_heads, g.head_dim)

    def _kernel(self):
        if self.options.compile:
            return _compiled_flex()
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention


def _bhsd(x: torch.Tensor) -> torch.Tensor:
    """[S, H, D] -> [1, H, S, D]."""
    return x.transpose(0, 1).unsqueeze(0)
