#!/usr/bin/env python
"""Check every FlashInfer path against VANILLA on a CUDA machine, and time it against SDPA.

    python plugins/flashinfer/gpu_check.py                 # all specs, on cuda
    python plugins/flashinfer/gpu_check.py --specs small_decode,mla_512_64
    python plugins/flashinfer/gpu_check.py --device cpu    # the harness alone (SDPA vs VANILLA, no timing)

Each batch spec caches every request's context in a fragmented paged cache, then runs one step (prefill,
decode or mixed) through VANILLA (the reference), FLASHINFER (or FLASHINFER_MLA) and SDPA on identical
inputs. Exit status: 0 all match, 1 a mismatch (or a backend refused a spec it should run), 2 FlashInfer
cannot run here (the reason is printed).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from kernelbay import resolve
from kernelbay.attention import AttentionForwardArgs, AttentionRequirements, MLASpec, create_attention
from kernelbay.errors import UnknownNameError
from kernelbay_engine.kv_cache import KVCacheManager

MLA_GEOMETRY = MLASpec(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
TOLERANCE = {"bfloat16": 2e-2, "float16": 5e-3}


@dataclass(frozen=True)
class Spec:
    """One step: `requests` are (query_len, context_len); the context is cached before the step."""

    name: str
    requests: tuple[tuple[int, int], ...]
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype: str = "bfloat16"
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    layout: str = "NHD"
    attn_type: str = "full_attention"
    sliding_window: int | None = None
    logit_softcap: float | None = None
    mla: MLASpec | None = None

    @property
    def backend(self) -> str:
        return "FLASHINFER_MLA" if self.mla else "FLASHINFER"


MIXED = ((1, 200), (37, 0), (1, 1500), (16, 300), (1, 33))
SPECS = {
    s.name: s
    for s in (
        Spec("small_prefill", ((9, 0), (130, 0))),
        Spec("small_decode", ((1, 12), (1, 300), (1, 77))),
        Spec("mixed_prefill_decode", MIXED),
        Spec("long_prefill", ((2048, 0),)),
        Spec("batch_decode_64x1k", ((1, 1024),) * 64),
        Spec("long_decode", ((1, 8000), (1, 4096))),
        Spec("mha", MIXED, num_kv_heads=32),
        Spec("mqa", MIXED, num_kv_heads=1),
        Spec("gqa_6", MIXED, num_heads=48, num_kv_heads=8),  # not a CUDA-core decode group: tensor-core path
        Spec("head_64", MIXED, head_dim=64),
        Spec("head_256", MIXED, num_heads=8, num_kv_heads=4, head_dim=256),
        Spec("sliding_window", (*MIXED, (1, 700)), attn_type="sliding_attention", sliding_window=256),
        Spec("sliding_decode", ((1, 700), (1, 90)), attn_type="sliding_attention", sliding_window=256),
        Spec("softcap", MIXED, logit_softcap=30.0),
        Spec("fp8_kv", MIXED, kv_cache_dtype="fp8_e4m3"),
        Spec("fp16", MIXED, dtype="float16"),
        Spec("block_32", MIXED, block_size=32),
        Spec("block_1", ((5, 20), (1, 9)), block_size=1),
        Spec("hnd", MIXED, layout="HND"),
        Spec("hnd_decode", ((1, 500), (1, 60)), layout="HND"),
        Spec("mla_512_64", MIXED, num_heads=16, num_kv_heads=16, head_dim=192, mla=MLA_GEOMETRY),
        Spec(
            "mla_decode", ((1, 900), (1, 40), (1, 2000)), num_heads=16, num_kv_heads=16, head_dim=192, mla=MLA_GEOMETRY
        ),
    )
}


@dataclass
class Inputs:
    keys: list[torch.Tensor]  # per request [seq_len, kv_heads, head_dim] (MLA: latent [seq_len, 512])
    values: list[torch.Tensor]  # per request [seq_len, kv_heads, head_dim] (MLA: k_pe [seq_len, 64])
    queries: torch.Tensor  # [T, num_heads, head_dim]
    kv_b_proj: torch.nn.Module | None


def make_inputs(spec: Spec, device: str, seed: int = 0) -> Inputs:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dtype = getattr(torch, spec.dtype)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    seqs = [q + c for q, c in spec.requests]
    tokens = sum(q for q, _ in spec.requests)
    if spec.mla is None:
        return Inputs(
            [rand(s, spec.num_kv_heads, spec.head_dim) for s in seqs],
            [rand(s, spec.num_kv_heads, spec.head_dim) for s in seqs],
            rand(tokens, spec.num_heads, spec.head_dim),
            None,
        )
    m = spec.mla
    proj = torch.nn.Linear(m.kv_lora_rank, spec.num_heads * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
    with torch.no_grad():
        proj.weight.copy_(torch.randn(proj.weight.shape, generator=gen) * m.kv_lora_rank**-0.5)
    return Inputs(
        [rand(s, m.kv_lora_rank) for s in seqs],
        [rand(s, m.qk_rope_head_dim) for s in seqs],
        rand(tokens, spec.num_heads, spec.head_dim),
        proj.to(device=device, dtype=dtype),
    )


def requirements(spec: Spec, platform: str) -> AttentionRequirements:
    return AttentionRequirements(
        head_size=spec.head_dim,
        dtype=spec.dtype,
        kv_cache_dtype=spec.kv_cache_dtype,
        attn_type=spec.attn_type,
        logit_softcap=spec.logit_softcap is not None,
        use_mla=spec.mla is not None,
        block_size=spec.block_size,
        kv_layout=spec.layout,
        platform=platform,
    )


class Step:
    """One backend's layer with the spec's context cached, ready to run the step (again and again)."""

    def __init__(self, cls, spec: Spec, inputs: Inputs, device: str):
        self.layer = create_attention(
            0,
            spec.num_heads,
            spec.head_dim,
            spec.num_kv_heads,
            backend=cls,
            attn_type=spec.attn_type,
            sliding_window=spec.sliding_window,
            logit_softcap=spec.logit_softcap,
            mla=spec.mla,
            kv_b_proj=inputs.kv_b_proj,
            kv_cache_dtype=spec.kv_cache_dtype,
        )
        manager = _fragmented_manager(spec)
        cache = self.layer.kv_cache_spec(spec.dtype, spec.block_size, spec.layout).allocate(manager.num_blocks, device)
        self.layer.attach_kv_cache(cache, *_fp8_scales(spec))
        _cache_context(self.layer, cls, spec, inputs, manager, device)
        rows = manager.build_step([(i, q) for i, (q, _) in enumerate(spec.requests)])
        self.metadata = cls.prepare(rows, spec.block_size, spec.layout, device)
        self.q = inputs.queries
        self.k = torch.cat([k[c:] for k, (_, c) in zip(inputs.keys, spec.requests, strict=True)])
        self.v = torch.cat([v[c:] for v, (_, c) in zip(inputs.values, spec.requests, strict=True)])

    @torch.no_grad()
    def run(self, write: bool = True) -> torch.Tensor:
        return self.layer.forward(self.q, self.k, self.v, self.metadata, AttentionForwardArgs(update_kv_cache=write))


def _fp8_scales(spec: Spec) -> tuple[float, float]:
    return (0.05, 0.05) if spec.kv_cache_dtype == "fp8_e4m3" else (1.0, 1.0)


def _fragmented_manager(spec: Spec) -> KVCacheManager:
    """Requests get non-contiguous blocks: a one-block filler is allocated before each."""
    need = sum(-(-(q + c) // spec.block_size) + 1 for q, c in spec.requests) + 2
    manager = KVCacheManager(need, spec.block_size, spec.layout)
    for i, (_q, c) in enumerate(spec.requests):
        manager.allocate(("filler", i), 1)
        manager.allocate(i, c)
    for i, (q, _) in enumerate(spec.requests):
        manager.append(i, q)
    return manager


def _cache_context(layer, cls, spec: Spec, inputs: Inputs, manager: KVCacheManager, device: str) -> None:
    cached = [i for i, (_, c) in enumerate(spec.requests) if c > 0]
    if not cached:
        return
    rows = [(spec.requests[i][1], 0, manager.block_table(i)) for i in cached]
    layer.write_kv(
        torch.cat([inputs.keys[i][: spec.requests[i][1]] for i in cached]),
        torch.cat([inputs.values[i][: spec.requests[i][1]] for i in cached]),
        cls.prepare(rows, spec.block_size, spec.layout, device),
    )


def time_ms(step: Step, device: str, iters: int = 20) -> float:
    for _ in range(3):
        step.run(write=False)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        step.run(write=False)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / iters


@dataclass
class Row:
    spec: str
    backend: str
    tokens: int
    error: float | None = None
    ok: bool = False
    ms: float | None = None
    baseline: str = "SDPA"
    baseline_ms: float | None = None
    note: str = ""


def check_spec(spec: Spec, backend: str, device: str, platform: str, timing: bool) -> Row:
    row = Row(spec.name, backend, sum(q for q, _ in spec.requests))
    cls = resolve("attention_backend", backend)
    failures = cls.capability_failures(requirements(spec, platform))
    if failures:
        row.note = "refused: " + "; ".join(failures)
        return row
    inputs = make_inputs(spec, device)
    step = Step(cls, spec, inputs, device)
    got = step.run()
    want = Step(resolve("attention_backend", "VANILLA"), spec, inputs, device).run()
    row.error = (got.float() - want.float()).abs().max().item()
    tolerance = TOLERANCE[spec.dtype] * (10 if spec.kv_cache_dtype == "fp8_e4m3" else 1)
    row.ok = got.shape == want.shape and row.error <= tolerance * max(1.0, want.float().abs().max().item())
    if timing:
        _time_against_baseline(row, step, spec, inputs, device, platform)
    return row


def _time_against_baseline(row: Row, step: Step, spec: Spec, inputs: Inputs, device: str, platform: str) -> None:
    row.ms = time_ms(step, device)
    for baseline in ("SDPA", "VANILLA"):
        cls = resolve("attention_backend", baseline)
        if not cls.capability_failures(requirements(spec, platform)):
            row.baseline, row.baseline_ms = baseline, time_ms(Step(cls, spec, inputs, device), device)
            return


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def render(rows: list[Row]) -> str:
    head = (
        f"{'spec':<22} {'backend':<15} {'tokens':>6} {'max err':>9} {'ok':<4} {'ms':>8} {'baseline':<9} "
        f"{'base ms':>8} {'speedup':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        speedup = r.baseline_ms / r.ms if r.ms and r.baseline_ms else None
        lines.append(
            f"{r.spec:<22} {r.backend:<15} {r.tokens:>6} {_fmt(r.error, '.2e'):>9} "
            f"{('yes' if r.ok else 'NO'):<4} {_fmt(r.ms, '.3f'):>8} {r.baseline:<9} "
            f"{_fmt(r.baseline_ms, '.3f'):>8} {_fmt(speedup, '.2f'):>8}" + (f"  {r.note}" if r.note else "")
        )
    return "\n".join(lines)


def ensure_flashinfer_backends() -> None:
    """Use the installed kernelbay-flashinfer, or register this checkout's copy at runtime."""
    try:
        resolve("attention_backend", "FLASHINFER")
    except UnknownNameError:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from kernelbay import register_attention_backend

        register_attention_backend("FLASHINFER", target="kernelbay_flashinfer.backend:FlashInferBackend")
        register_attention_backend("FLASHINFER_MLA", target="kernelbay_flashinfer.mla:FlashInferMLABackend")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (checks the harness with SDPA)")
    parser.add_argument("--specs", help=f"comma-separated subset of: {', '.join(SPECS)}")
    parser.add_argument("--no-timing", action="store_true", help="correctness only")
    args = parser.parse_args(argv)
    names = args.specs.split(",") if args.specs else list(SPECS)
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        parser.error(f"unknown spec(s) {', '.join(unknown)}; known: {', '.join(SPECS)}")
    ensure_flashinfer_backends()
    if args.device == "cpu":  # correctness of the harness only: timing SDPA against itself says nothing
        return _report(
            [check_spec(_cpu_spec(SPECS[n]), "SDPA", "cpu", "cpu", timing=False) for n in names if SPECS[n].mla is None]
        )
    available, reason = resolve("attention_backend", "FLASHINFER").is_available()
    if not available:
        print(f"FlashInfer cannot run here: {reason}")
        return 2
    torch.cuda.manual_seed_all(0)
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    return _report([check_spec(SPECS[n], SPECS[n].backend, args.device, "cuda", not args.no_timing) for n in names])


def _cpu_spec(spec: Spec) -> Spec:
    """The harness on CPU: shorter sequences, so a check takes seconds."""
    return replace(spec, requests=tuple((min(q, 64), min(c, 96)) for q, c in spec.requests[:4]), kv_cache_dtype="auto")


def _report(rows: list[Row]) -> int:
    print(render(rows))
    bad = [r.spec for r in rows if not r.ok]
    print(f"\n{len(rows) - len(bad)}/{len(rows)} specs match VANILLA" + (f"; FAILED: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
