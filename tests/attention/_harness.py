"""Named batch specs and a runner that drives any backend through the paged cache like an engine would."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import torch

from kernelbay import resolve
from kernelbay.attention import MLASpec, create_attention
from kernelbay.attention._cache_ops import torch_dtype


@dataclass(frozen=True)
class BatchSpec:
    """One step's batch: `requests` are (query_len, context_len); the context is cached before the step."""

    name: str
    requests: tuple[tuple[int, int], ...]
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    dtype: str = "float32"
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    layout: str = "NHD"
    attn_type: str = "full_attention"
    sliding_window: int | None = None
    chunk_size: int | None = None
    logit_softcap: float | None = None
    mla: MLASpec | None = None
    contiguous_blocks: bool = False
    """True: each request's blocks are one run of consecutive ids (zero-copy paths); False: scattered."""

    def but(self, **changes) -> "BatchSpec":
        return dataclasses.replace(self, **changes)


MIXED = ((1, 20), (6, 0), (1, 33), (4, 10))
SPECS = {
    "small_prefill": BatchSpec("small_prefill", ((9, 0), (5, 0))),
    "small_decode": BatchSpec("small_decode", ((1, 12), (1, 30), (1, 7))),
    "mixed_prefill_decode": BatchSpec("mixed_prefill_decode", MIXED),
    "long_decode": BatchSpec("long_decode", ((1, 300), (1, 517))),
    "uniform_decode": BatchSpec("uniform_decode", ((1, 40), (1, 40), (1, 40))),
    "gqa": BatchSpec("gqa", MIXED, num_heads=8, num_kv_heads=2),
    "mqa": BatchSpec("mqa", MIXED, num_heads=4, num_kv_heads=1),
    "head_80": BatchSpec("head_80", MIXED, head_dim=80),
    "head_128": BatchSpec("head_128", MIXED, head_dim=128),
    "head_256": BatchSpec("head_256", MIXED, head_dim=256),
    "sliding_window": BatchSpec("sliding_window", MIXED + ((1, 70),), attn_type="sliding_attention",
                                sliding_window=8),
    "chunked": BatchSpec("chunked", MIXED + ((3, 40),), attn_type="chunked_attention", chunk_size=16),
    "softcap": BatchSpec("softcap", MIXED, logit_softcap=5.0),
    "fp8_kv": BatchSpec("fp8_kv", MIXED, kv_cache_dtype="fp8_e4m3"),
    "block_32": BatchSpec("block_32", MIXED + ((1, 70),), block_size=32),
    "block_64": BatchSpec("block_64", MIXED + ((1, 70),), block_size=64),
    "hnd": BatchSpec("hnd", MIXED, layout="HND"),
    "hnd_decode": BatchSpec("hnd_decode", ((1, 12), (1, 30)), layout="HND"),
    "runs_decode": BatchSpec("runs_decode", ((1, 600), (1, 530)), contiguous_blocks=True),
    "runs_uniform_decode": BatchSpec("runs_uniform_decode", ((1, 520), (1, 520)), contiguous_blocks=True),
    "runs_sliding_decode": BatchSpec("runs_sliding_decode", ((1, 600), (1, 530)), contiguous_blocks=True,
                                     attn_type="sliding_attention", sliding_window=64),
    "runs_chunked_decode": BatchSpec("runs_chunked_decode", ((1, 600), (1, 530)), contiguous_blocks=True,
                                     attn_type="chunked_attention", chunk_size=256),
    "runs_mixed": BatchSpec("runs_mixed", MIXED, contiguous_blocks=True),
    "encoder": BatchSpec("encoder", ((5, 0), (7, 0)), attn_type="encoder_attention"),
    "bf16": BatchSpec("bf16", MIXED, dtype="bfloat16"),
    "fp16": BatchSpec("fp16", MIXED, dtype="float16"),
}
_MLA = MLASpec(kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=24)
MLA_SPECS = {
    "mla": BatchSpec("mla", MIXED, num_heads=4, num_kv_heads=4, head_dim=48, mla=_MLA),
    "mla_fp8_hnd": BatchSpec("mla_fp8_hnd", MIXED, num_heads=4, num_kv_heads=4, head_dim=48, mla=_MLA,
                             kv_cache_dtype="fp8_e4m3", layout="HND"),
    "mla_no_rope": BatchSpec("mla_no_rope", ((1, 9), (3, 0)), num_heads=2, num_kv_heads=2, head_dim=16,
                             mla=MLASpec(kv_lora_rank=8, qk_nope_head_dim=16, qk_rope_head_dim=0, v_head_dim=8)),
}

TOLERANCE = {"float32": 2e-5, "bfloat16": 3e-2, "float16": 5e-3}


@dataclass
class StepData:
    """Random inputs for a spec: full per-request keys/values (context + new) and the new queries."""

    keys: list[torch.Tensor]  # per request [seq_len, kv_heads, head_dim] (MLA: latent [seq_len, kv_lora])
    values: list[torch.Tensor]  # per request [seq_len, kv_heads, head_dim] (MLA: k_pe [seq_len, rope])
    queries: torch.Tensor  # [T, num_heads, head_dim]
    kv_b_proj: torch.nn.Module | None


def make_data(spec: BatchSpec, seed: int = 0) -> StepData:
    gen = torch.Generator().manual_seed(seed)
    dtype = torch_dtype(spec.dtype)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    if spec.mla is not None:
        m = spec.mla
        keys = [rand(q + c, m.kv_lora_rank) for q, c in spec.requests]
        values = [rand(q + c, m.qk_rope_head_dim) for q, c in spec.requests]
        proj = torch.nn.Linear(m.kv_lora_rank, spec.num_heads * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        with torch.no_grad():
            proj.weight.copy_(torch.randn(proj.weight.shape, generator=gen) * m.kv_lora_rank ** -0.5)
        proj = proj.to(dtype)
    else:
        keys = [rand(q + c, spec.num_kv_heads, spec.head_dim) for q, c in spec.requests]
        values = [rand(q + c, spec.num_kv_heads, spec.head_dim) for q, c in spec.requests]
        proj = None
    tokens = sum(q for q, _ in spec.requests)
    return StepData(keys, values, rand(tokens, spec.num_heads, spec.head_dim), proj)


def block_tables(spec: BatchSpec, seed: int = 0) -> tuple[int, list[tuple[int, ...]]]:
    """(num_blocks, per-request block tables): scattered at random, or runs with a free block between."""
    counts = [-(-(q + c) // spec.block_size) for q, c in spec.requests]
    num_blocks = sum(counts) + len(counts) + 1
    order = list(range(num_blocks))
    if not spec.contiguous_blocks:
        random.Random(seed).shuffle(order)
    tables, at = [], 1
    for n in counts:
        tables.append(tuple(order[at: at + n]))
        at += n + 1
    return num_blocks, tables


def build_backend(backend, spec: BatchSpec, data: StepData, options=None):
    cls = resolve("attention_backend", backend) if isinstance(backend, str) else backend
    return cls, create_attention(0, spec.num_heads, spec.head_dim, spec.num_kv_heads, backend=cls,
                                 attn_type=spec.attn_type, sliding_window=spec.sliding_window,
                                 chunk_size=spec.chunk_size, logit_softcap=spec.logit_softcap, mla=spec.mla,
                                 kv_b_proj=data.kv_b_proj, kv_cache_dtype=spec.kv_cache_dtype, options=options)


def run_backend(backend, spec: BatchSpec, seed: int = 0, options=None, data: StepData | None = None,
                kv_scales: tuple[float, float] = (1.0, 1.0)):
    """Cache every request's context, then run the step; returns [T, num_heads, v_head_dim]."""
    data = data or make_data(spec, seed)
    cls, layer = build_backend(backend, spec, data, options)
    num_blocks, tables = block_tables(spec, seed)
    layer.attach_kv_cache(layer.kv_cache_spec(spec.dtype, spec.block_size, spec.layout).allocate(num_blocks),
                          *kv_scales)
    cached = [i for i, (_, c) in enumerate(spec.requests) if c > 0]
    if cached:
        rows = [(spec.requests[i][1], 0, tables[i]) for i in cached]
        layer.write_kv(torch.cat([data.keys[i][: spec.requests[i][1]] for i in cached]),
                       torch.cat([data.values[i][: spec.requests[i][1]] for i in cached]),
                       cls.prepare(rows, spec.block_size, spec.layout))
    md = cls.prepare([(q, c, t) for (q, c), t in zip(spec.requests, tables)], spec.block_size, spec.layout)
    new_k = torch.cat([k[c:] for k, (_, c) in zip(data.keys, spec.requests)])
    new_v = torch.cat([v[c:] for v, (_, c) in zip(data.values, spec.requests)])
    with torch.no_grad():
        return layer.forward(data.queries, new_k, new_v, md)


def assert_close(name: str, spec: BatchSpec, got: torch.Tensor, want: torch.Tensor) -> None:
    tol = TOLERANCE[spec.dtype] * (20 if spec.kv_cache_dtype == "fp8_e4m3" and spec.dtype != "float32" else 1)
    err = (got.float() - want.float()).abs().max().item()
    assert got.shape == want.shape, f"[{name}] {spec.name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert err <= tol * max(1.0, want.float().abs().max().item()), \
        f"[{name}] {spec.name}: max abs error {err:.3g} > {tol:g}"
