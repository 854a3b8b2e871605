"""Paged attention backends against `scaled_dot_product_attention` on contiguous tensors (the no-paging ideal).

For each backend: decode steps at several batch sizes and contexts, and causal prefill, each reported as
ideal_time / backend_time (1.0 = as fast as contiguous SDPA), measured interleaved in the same run; plus
`prepare()` (per-step metadata) cost in microseconds. Block placement is either what KVCacheManager hands
out ("manager": requests stay one run of blocks while the cache has room) or scattered at random (a long
fragmented run). Usage:

    python benchmarks/attention.py --quick
    python benchmarks/attention.py --backends SDPA,VANILLA --batches 1,8,32 --contexts 128,512,2048,4096
    python benchmarks/attention.py --quick --backends SDPA --sinks   # GPT-OSS layers (the ideal stays sink-free)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from kernelbay import resolve
from kernelbay.attention import AttentionForwardArgs, create_attention
from kernelbay.dtypes import torch_dtype
from kernelbay_engine.kv_cache import KVCacheManager


@dataclass(frozen=True)
class Geometry:
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 64
    dtype: str = "float32"
    block_size: int = 16
    sinks: bool = False  # layers with per-head sink logits (GPT-OSS)


@dataclass
class Row:
    backend: str
    kind: str  # "decode" | "prefill"
    batch: int
    context: int
    placement: str
    backend_us: float
    ideal_us: float
    ratio: float
    prepare_us: float
    first_call_us: float  # the first forward, compile included (FLEX)


def median_us(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def interleaved(backend_fn, ideal_fn, repeats: int) -> tuple[float, float]:
    """Alternate the two so machine noise hits both alike (after a warm-up: compiles excluded)."""
    ideal_fn()
    pairs = [(median_us(backend_fn, 1), median_us(ideal_fn, 1)) for _ in range(repeats)]
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def block_tables(lengths: list[int], geo: Geometry, placement: str) -> tuple[int, list[tuple[int, ...]]]:
    """Tables for requests of `lengths` tokens, with 25% spare blocks in the cache."""
    needed = sum(-(-n // geo.block_size) for n in lengths)
    num_blocks = needed + needed // 4 + 1
    if placement == "manager":
        mgr = KVCacheManager(num_blocks, geo.block_size)
        return num_blocks, [mgr.allocate(i, n) for i, n in enumerate(lengths)]
    free = random.Random(0).sample(range(num_blocks), needed)
    tables, at = [], 0
    for n in lengths:
        count = -(-n // geo.block_size)
        tables.append(tuple(free[at : at + count]))
        at += count
    return num_blocks, tables


def ideal_sdpa(q, k, v, causal: bool):
    """Contiguous SDPA, the better of its two GQA forms (enable_gqa, or query heads folded per KV head)."""
    batch, heads, q_len, dim = q.shape
    kv_heads = k.shape[1]

    def gqa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=heads != kv_heads)

    def folded():
        return F.scaled_dot_product_attention(q.view(batch, kv_heads, heads // kv_heads, dim), k, v)

    return [gqa] if causal or q_len > 1 else [gqa, folded]


def measure(backend: str, kind: str, batch: int, context: int, geo: Geometry, placement: str, repeats: int) -> Row:
    cls = resolve("attention_backend", backend)
    dtype = torch_dtype(geo.dtype)
    q_len = 1 if kind == "decode" else context
    cached = context - q_len
    num_blocks, tables = block_tables([context] * batch, geo, placement)
    layer = create_attention(0, geo.num_heads, geo.head_dim, geo.num_kv_heads, backend=cls, sinks=geo.sinks)
    args = AttentionForwardArgs(sinks=torch.randn(geo.num_heads, dtype=dtype)) if geo.sinks else None
    cache = layer.kv_cache_spec(geo.dtype, geo.block_size).allocate(num_blocks).normal_()
    layer.attach_kv_cache(cache)
    requests = [(q_len, cached, t) for t in tables]
    md = cls.prepare(requests, geo.block_size)
    q = torch.randn(batch * q_len, geo.num_heads, geo.head_dim, dtype=dtype)
    k_new = torch.randn(batch * q_len, geo.num_kv_heads, geo.head_dim, dtype=dtype)
    v_new = torch.randn_like(k_new)
    dense_k = torch.randn(batch, geo.num_kv_heads, context, geo.head_dim, dtype=dtype)
    dense_v = torch.randn_like(dense_k)
    dense_q = q.view(batch, q_len, geo.num_heads, geo.head_dim).transpose(1, 2).contiguous()
    with torch.no_grad():
        candidates = ideal_sdpa(dense_q, dense_k, dense_v, causal=kind == "prefill")
        ideal_fn = min(candidates, key=lambda fn: median_us(fn, 3))
        step = lambda: layer.forward(q, k_new, v_new, md, args)  # noqa: E731
        first_us = median_us(step, 1)
        backend_us, ideal_us = interleaved(step, ideal_fn, repeats)
    prepare_us = median_us(lambda: cls.prepare(requests, geo.block_size), max(repeats, 5))
    return Row(
        backend,
        kind,
        batch,
        context,
        placement,
        round(backend_us),
        round(ideal_us),
        round(ideal_us / backend_us, 3),
        round(prepare_us, 1),
        round(first_us),
    )


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="SDPA,VANILLA,FLEX")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--contexts", default="128,512,2048,4096")
    p.add_argument("--prefill", default="512,2048", help="prefill lengths (batch 1)")
    p.add_argument("--placements", default="manager,scattered")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    p.add_argument("--quick", action="store_true", help="batch 8 / context 2048 decode and prefill 512 only")
    p.add_argument("--sinks", action="store_true", help="layers with attention sinks (GPT-OSS)")
    p.add_argument("--json", help="also write the rows to this file")
    return p.parse_args()


def grid(args) -> list[tuple[str, int, int]]:
    if args.quick:
        return [("decode", 8, 2048), ("prefill", 1, 512)]
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    decode = [("decode", b, c) for b in ints(args.batches) for c in ints(args.contexts)]
    return decode + [("prefill", 1, n) for n in ints(args.prefill)]


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    geo = Geometry(dtype=args.dtype, sinks=args.sinks)
    print(f"# {geo}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        f"{'backend':8} {'kind':7} {'B':>3} {'ctx':>5} {'placement':9} {'backend_us':>11} {'ideal_us':>9} "
        f"{'ratio':>6} {'prepare_us':>10} {'first_call_us':>13}"
    )
    rows = []
    for backend in args.backends.split(","):
        for kind, batch, context in grid(args):
            for placement in args.placements.split(","):
                row = measure(backend, kind, batch, context, geo, placement, args.repeats)
                rows.append(row)
                print(
                    f"{row.backend:8} {row.kind:7} {row.batch:>3} {row.context:>5} {row.placement:9} "
                    f"{row.backend_us:>11} {row.ideal_us:>9} {row.ratio:>6.2f} {row.prepare_us:>10} "
                    f"{row.first_call_us:>13}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([asdict(r) for r in rows], fh, indent=1)


if __name__ == "__main__":
    main()
