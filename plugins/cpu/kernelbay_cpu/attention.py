"""CPU_PAGED: native calls that write a step's keys and values into the paged cache and attend a request's few new
tokens (decode, a speculative verify row) over its cached ones; a longer prompt goes to torch's SDPA."""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

import torch
import torch.nn.functional as F

from kernelbay.attention import ANY, AttentionBackend, AttentionForwardArgs, AttentionMetadata, KVLayout
from kernelbay.dtypes import MODEL_DTYPES

from .build import NativeLibrary

# A request adding at most this many tokens is attended by the native kernel, query by query over its keys (each
# query's bits are the same whatever else is in the call: decoding and verifying a speculation agree); a longer
# one (a prompt) by one SDPA call, whose blocked matmuls win there.
NATIVE_QUERIES = 16

LIBRARY = NativeLibrary(
    "kernelbay_cpu_paged",
    [Path(__file__).with_name("paged.cpp")],
    owner="kernelbay-cpu",
    what="CPU_PAGED attention kernel",
    fallback="the attention selector takes the next capable backend (SDPA)",
)


@dataclass(frozen=True, slots=True)
class CpuPagedMetadata(AttentionMetadata):
    """Adds which requests the native kernel attends, worked out once per step for every layer."""

    native_requests: torch.Tensor | None = None
    """int64 ids of the requests adding at most NATIVE_QUERIES tokens."""
    prompt_requests: tuple[int, ...] = ()
    """The others, each attended by one SDPA call."""

    @classmethod
    def _extras(cls, md: AttentionMetadata) -> dict:
        short = [i for i, n in enumerate(md.query_lens_host) if n <= NATIVE_QUERIES]
        return {
            "native_requests": torch.tensor(short, dtype=torch.int64, device=md.query_lens.device),
            "prompt_requests": tuple(i for i, n in enumerate(md.query_lens_host) if n > NATIVE_QUERIES),
        }


class CpuPagedBackend(AttentionBackend[CpuPagedMetadata]):
    """Decoder attention on CPUs: `write_kv` and the attention of short requests are one native call each (AVX-512
    where the CPU has it, plain C++ elsewhere; float32, bfloat16 or float16, computed in float32); a prompt of more
    than NATIVE_QUERIES tokens is one SDPA call.

    Honest capabilities: sliding windows, chunks and encoder (bidirectional) layers, but no scaled (fp8) cache,
    soft-cap, sinks, sparsity or MLA; the selector gives such layers another backend.
    Unavailable (with the build's reason) where the kernel cannot be built or KERNELBAY_NATIVE=0.
    """

    name = "CPU_PAGED"
    Metadata = CpuPagedMetadata
    head_sizes = ANY
    dtypes = frozenset(MODEL_DTYPES)
    kv_cache_dtypes = frozenset({"auto", *MODEL_DTYPES})  # not fp8: a scaled cache is SDPA's
    block_sizes = ANY
    kv_layouts = frozenset(KVLayout)
    platforms = frozenset({"cpu"})
    sliding_window = True
    chunked_attention = True
    encoder = True
    _plane_views: tuple | None = None

    def attach_kv_cache(self, kv_cache: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
        if k_scale != 1.0 or v_scale != 1.0:
            raise ValueError(
                f"layer {self.geometry.layer_idx}: CPU_PAGED keeps keys and values unscaled, so k_scale and "
                f"v_scale must be 1.0 (got {k_scale}, {v_scale}); a scaled (fp8) cache needs another backend (SDPA)"
            )
        super().attach_kv_cache(kv_cache, k_scale, v_scale)

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        if LIBRARY.ops() is None:
            return False, LIBRARY.status()
        return True, "available"

    @classmethod
    def get_kv_cache_stride_order(cls, layout: KVLayout | str = KVLayout.NHD) -> tuple[int, ...]:
        """Heads outermost within a plane: a request's keys of one head are, block run by block run, one
        sequential stream for the kernel (and one [tokens, head_dim] matrix for a prompt's SDPA call)."""
        return (0, 3, 1, 2, 4) if KVLayout.parse(layout) is KVLayout.NHD else (0, 2, 1, 3, 4)

    def _planes(self, layout: KVLayout) -> tuple[torch.Tensor, torch.Tensor]:
        """The cache's key and value planes as [num_blocks, block_size, kv_heads, head_dim] views (made once)."""
        cache = self._attached_cache()
        memo = self._plane_views
        if memo is None or memo[0] is not cache or memo[1] is not layout:
            nhd = layout is KVLayout.NHD
            planes = tuple(plane if nhd else plane.transpose(1, 2) for plane in (cache[0], cache[1]))
            memo = self._plane_views = (cache, layout, planes)
        return memo[2]

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, metadata: AttentionMetadata) -> None:
        k_plane, v_plane = self._planes(metadata.layout)
        if k.dtype != k_plane.dtype:  # a cache kept in another float type than the model's
            k, v = k.to(k_plane.dtype), v.to(v_plane.dtype)
        _ops().write_kv(k, v, k_plane, v_plane, metadata.slot_mapping)

    def _attend(self, q: torch.Tensor, md: CpuPagedMetadata, args: AttentionForwardArgs) -> torch.Tensor:
        g, causal = self.geometry, self.is_causal(args)
        if md.num_reqs == 1 and md.prompt_requests:  # one prompt: SDPA's answer is the output, no copy into a buffer
            return self._prompt(q, *self._request_keys(md, 0, q.dtype), md.positions, causal)
        out = q.new_empty(q.shape[0], g.num_heads, g.head_dim)
        if md.native_requests is not None and md.native_requests.numel():
            k_plane, v_plane = self._planes(md.layout)
            _ops().attend(
                q, k_plane, v_plane, md.block_tables, md.query_start_loc, md.seq_lens, md.native_requests,
                g.scale, causal, g.sliding_window or 0, g.chunk_size or 0, out,
            )  # fmt: skip
        if md.prompt_requests:
            q_starts = (0, *accumulate(md.query_lens_host))
            for i in md.prompt_requests:
                q0, q1 = q_starts[i], q_starts[i + 1]
                k, v = self._request_keys(md, i, q.dtype)
                out[q0:q1] = self._prompt(q[q0:q1], k, v, md.positions[q0:q1], causal)
        return out

    def _request_keys(self, md: CpuPagedMetadata, i: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Request i's keys and values as [1, kv_heads, S, D]: a zero-copy slice of the cache when its blocks are one
        run and the cache holds `dtype` (a prompt's usual case), else a gather."""
        views, start, seq = self.cache_views(md.layout), md.run_start_slots[i], md.seq_lens_host[i]
        if start is not None and views.by_head is not None and self._attached_cache().dtype == dtype:
            k_heads, v_heads = views.by_head
            return k_heads.narrow(2, start, seq), v_heads.narrow(2, start, seq)
        first = sum(md.seq_lens_host[:i])
        k, v = self.read_kv(md.kv_gather_index[first : first + seq], md.layout, dtype)
        return k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)

    def _prompt(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, causal: bool):
        """q [Tq, H, D] over k/v [1, kv_heads, S, D] by one SDPA call -> [Tq, H, D]."""
        g = self.geometry
        plain = g.sliding_window is None and g.chunk_size is None
        whole = causal and plain and k.shape[2] == q.shape[0]  # a fresh prompt: SDPA's own causal mask
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            k,
            v,
            attn_mask=None if whole else visible_keys(q_pos, k.shape[2], causal, g.sliding_window, g.chunk_size),
            is_causal=whole,
            scale=g.scale,
            enable_gqa=g.num_heads != g.num_kv_heads,
        )
        return out[0].transpose(0, 1)


def visible_keys(q_pos: torch.Tensor, num_keys: int, causal: bool, window: int | None, chunk: int | None):
    """Bool [Tq, S]: which of keys 0 .. S-1 each query at q_pos [Tq] sees (the kernel's rule); None: every key."""
    q, k = q_pos.unsqueeze(1), torch.arange(num_keys, device=q_pos.device)
    rules = [k <= q] if causal else []
    if window is not None:
        rules.append(q - k < window)
    if chunk is not None:
        rules.append(torch.div(k, chunk, rounding_mode="floor") == torch.div(q, chunk, rounding_mode="floor"))
    return functools.reduce(operator.and_, rules) if rules else None


def _ops():
    """The loaded kernel: the selector took this backend only when `is_available()` found it."""
    module = LIBRARY.ops()
    if module is None:
        raise RuntimeError(f"CPU_PAGED was bound without its kernel: {LIBRARY.status()}")
    return module
