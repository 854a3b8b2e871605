"""Drive one backend class through a paged cache the way an engine does, with the core contract only:
`create_attention`, the backend's KV-cache spec, `KVCacheSpec.allocate`, `attach_kv_cache`, `prepare`,
`write_kv` and `forward`. Block tables are the kit's own."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import torch

from ..attention import AttentionBackend, AttentionForwardArgs, create_attention
from ..dtypes import torch_dtype
from .reference import reference_attention
from .specs import BatchSpec


@dataclass
class StepData:
    """Random inputs for a spec: every request's whole keys/values (context + new) and the step's queries."""

    keys: list[torch.Tensor]
    """Per request [seq_len, kv_heads, head_dim] (MLA: latent [seq_len, kv_lora_rank])."""
    values: list[torch.Tensor]
    """Per request [seq_len, kv_heads, head_dim] (MLA: k_pe [seq_len, qk_rope_head_dim])."""
    queries: torch.Tensor
    """[T, num_heads, head_dim], the step's new tokens packed request after request."""
    kv_b_proj: torch.nn.Module | None
    """MLA only: latent [*, kv_lora_rank] -> [*, num_heads * (qk_nope_head_dim + v_head_dim)]."""
    sinks: torch.Tensor | None = None
    """Sinks specs only: [num_heads] sink logits, passed as AttentionForwardArgs.sinks."""
    topk_indices: torch.Tensor | None = None
    """DSA specs only: [T, index_topk] int32 key positions each query may see (-1 pads), AttentionForwardArgs'."""
    index_keys: list[torch.Tensor] | None = None
    """DSA specs only: per request [seq_len, index_head_dim], the indexer keys the cache keeps beside the latent."""

    def to(self, device) -> StepData:
        """A copy on `device` (this one is left where it is, for the reference)."""
        proj = copy.deepcopy(self.kv_b_proj).to(device) if self.kv_b_proj is not None else None
        return StepData(
            [k.to(device) for k in self.keys],
            [v.to(device) for v in self.values],
            self.queries.to(device),
            proj,
            self.sinks.to(device) if self.sinks is not None else None,
            self.topk_indices.to(device) if self.topk_indices is not None else None,
            [k.to(device) for k in self.index_keys] if self.index_keys is not None else None,
        )


def make_data(spec: BatchSpec, seed: int = 0) -> StepData:
    """Standard-normal inputs in the spec's dtype (MLA: a kv_b_proj scaled to keep scores O(1))."""
    gen = torch.Generator().manual_seed(seed)
    dtype = torch_dtype(spec.dtype)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    proj = None
    if spec.mla is not None:
        m = spec.mla
        keys = [rand(q + c, m.kv_lora_rank) for q, c in spec.requests]
        values = [rand(q + c, m.qk_rope_head_dim) for q, c in spec.requests]
        proj = torch.nn.Linear(m.kv_lora_rank, spec.num_heads * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        with torch.no_grad():
            proj.weight.copy_(torch.randn(proj.weight.shape, generator=gen) * m.kv_lora_rank**-0.5)
        proj = proj.to(dtype)
    else:
        keys = [rand(q + c, spec.num_kv_heads, spec.head_dim) for q, c in spec.requests]
        values = [rand(q + c, spec.num_kv_heads, spec.head_dim) for q, c in spec.requests]
    queries = rand(spec.num_tokens, spec.num_heads, spec.head_dim)
    # drawn last, so every other spec's data stays as it was; x2: some heads lean on the sink, some ignore it
    sinks = (rand(spec.num_heads).float() * 2).to(dtype) if spec.sinks else None
    picks, index_keys = _dsa_data(spec, gen, rand) if spec.indexer is not None else (None, None)
    return StepData(keys, values, queries, proj, sinks, picks, index_keys)


def _dsa_data(spec: BatchSpec, gen: torch.Generator, rand):
    """Random top-k picks among each query's visible keys, in random order (a row seeing fewer pads with -1),
    and random indexer keys."""
    assert spec.indexer is not None
    topk, rows = spec.indexer.index_topk, []
    for q_len, ctx in spec.requests:
        for pos in range(ctx, ctx + q_len):
            chosen = torch.randperm(pos + 1, generator=gen)[:topk]
            rows.append(torch.cat([chosen, chosen.new_full((topk - chosen.numel(),), -1)]))
    keys = [rand(q + c, spec.indexer.index_head_dim) for q, c in spec.requests]
    return torch.stack(rows).to(torch.int32), keys


def block_tables(spec: BatchSpec, seed: int = 0) -> tuple[int, list[tuple[int, ...]]]:
    """(num_blocks, per-request block tables): scattered at random, or runs with a free block between
    (block 0 and the gaps stay unused, so a backend reading the wrong block reads zeros)."""
    counts = [-(-(q + c) // spec.block_size) for q, c in spec.requests]
    num_blocks = sum(counts) + len(counts) + 1
    order = list(range(num_blocks))
    if not spec.contiguous_blocks:
        random.Random(seed).shuffle(order)
    tables, at = [], 1
    for n in counts:
        tables.append(tuple(order[at : at + n]))
        at += n + 1
    return num_blocks, tables


def build_layer(backend, spec: BatchSpec, data: StepData, options=None) -> AttentionBackend:
    """Layer 0 with the spec's geometry on `backend` (a class or an installed name)."""
    return create_attention(
        0,
        spec.num_heads,
        spec.head_dim,
        spec.num_kv_heads,
        backend=backend,
        scale=spec.scale,
        attn_type=spec.attn_type,
        sliding_window=spec.sliding_window,
        chunk_size=spec.chunk_size,
        logit_softcap=spec.logit_softcap,
        sinks=spec.sinks,
        mla=spec.mla,
        indexer=spec.indexer,
        kv_b_proj=data.kv_b_proj,
        kv_cache_dtype=spec.kv_cache_dtype,
        options=options,
    )


def _new_tokens(spec: BatchSpec, per_request: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([x[c:] for x, (_, c) in zip(per_request, spec.requests, strict=True)])


def _cache_contexts(layer: AttentionBackend, spec: BatchSpec, data: StepData, tables, device) -> None:
    """Write every request's context into its blocks, as earlier steps would have."""
    cached = [i for i, (_, c) in enumerate(spec.requests) if c > 0]
    if not cached:
        return
    rows = [(spec.requests[i][1], 0, tables[i]) for i in cached]
    keys = torch.cat([data.keys[i][: spec.requests[i][1]] for i in cached])
    values = torch.cat([data.values[i][: spec.requests[i][1]] for i in cached])
    layer.write_kv(keys, values, type(layer).prepare(rows, spec.block_size, spec.layout, device))


def run_step(
    layer: AttentionBackend,
    spec: BatchSpec,
    data: StepData,
    seed: int = 0,
    kv_scales: tuple[float, float] = (1.0, 1.0),
    device: str = "cpu",
) -> torch.Tensor:
    """Allocate and attach the layer's cache, cache the contexts, run the step: [T, num_heads, v_head_dim].
    `data` (and the layer's kv_b_proj) must already be on `device`."""
    num_blocks, tables = block_tables(spec, seed)
    cache = layer.kv_cache_spec(spec.dtype, spec.block_size, spec.layout).allocate(num_blocks, device)
    layer.attach_kv_cache(cache, *kv_scales)
    with torch.no_grad():
        _cache_index_keys(layer, spec, data, tables, device)
        _cache_contexts(layer, spec, data, tables, device)
        md = type(layer).prepare(
            [(q, c, t) for (q, c), t in zip(spec.requests, tables, strict=True)], spec.block_size, spec.layout, device
        )
        args = AttentionForwardArgs(sinks=data.sinks, topk_indices=data.topk_indices)
        out = layer.forward(data.queries, _new_tokens(spec, data.keys), _new_tokens(spec, data.values), md, args)
        _check_index_keys(layer, data, md)
        return out


def _cache_index_keys(layer: AttentionBackend, spec: BatchSpec, data: StepData, tables, device) -> None:
    """DSA: write every request's indexer keys (context and new tokens) first, as a model's indexer does."""
    if data.index_keys is None:
        return
    rows = [(q + c, 0, t) for (q, c), t in zip(spec.requests, tables, strict=True)]
    layer.write_index_keys(torch.cat(data.index_keys), type(layer).prepare(rows, spec.block_size, spec.layout, device))


def _check_index_keys(layer: AttentionBackend, data: StepData, md) -> None:
    """DSA: the indexer keys read back as written, after the latents were written beside them."""
    if data.index_keys is None:
        return
    want = torch.cat(data.index_keys)
    got = layer.read_index_keys(md.kv_gather_index, md.layout, want.dtype)
    if not torch.equal(got, want):
        raise AssertionError(
            f"the indexer keys read back differ from those written (max diff {(got - want).abs().max().item():.3g}): "
            "the cache spec must keep index_head_dim per token after the latent, and write_kv leave it alone"
        )


def run_backend(
    backend,
    spec: BatchSpec,
    seed: int = 0,
    options=None,
    data: StepData | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> torch.Tensor:
    """One spec's step on `backend` (a class or an installed name), on CPU."""
    data = data or make_data(spec, seed)
    return run_step(build_layer(backend, spec, data, options), spec, data, seed, kv_scales)


def reference_output(spec: BatchSpec, data: StepData, kv_scales: tuple[float, float] = (1.0, 1.0)) -> torch.Tensor:
    """What a correct backend returns for this spec and data (float64)."""
    with torch.no_grad():
        return reference_attention(
            spec.geometry(),
            data.queries,
            [q for q, _ in spec.requests],
            data.keys,
            data.values,
            kv_b_proj=data.kv_b_proj,
            kv_cache_dtype=spec.kv_cache_dtype,
            kv_scales=kv_scales,
            sinks=data.sinks,
            topk_indices=data.topk_indices,
        )
