"""VANILLA against attention written out plainly, one query at a time."""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelbay.dtypes import torch_dtype
from tests.attention._harness import MLA_SPECS, SPECS, BatchSpec, assert_close, make_data, run_backend


def _visible(p: int, j: int, spec: BatchSpec) -> bool:
    if spec.attn_type == "encoder_attention":
        return True
    if j > p:
        return False
    if spec.sliding_window is not None and p - j >= spec.sliding_window:
        return False
    return spec.chunk_size is None or j // spec.chunk_size == p // spec.chunk_size


def _fp8_round_trip(x: torch.Tensor) -> torch.Tensor:
    return x.float().clamp(-448, 448).to(torch.float8_e4m3fn).float().to(x.dtype)


def _request_kv(spec: BatchSpec, data, i: int):
    """Per-head keys [S, H, D] and values [S, H, Dv] of request i, as the cache would hold them."""
    k, v = data.keys[i], data.values[i]
    if spec.kv_cache_dtype == "fp8_e4m3":
        k, v = _fp8_round_trip(k), _fp8_round_trip(v)
    if spec.mla is None:
        group = spec.num_heads // spec.num_kv_heads
        return k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    m = spec.mla
    kv = data.kv_b_proj(k).view(k.shape[0], spec.num_heads, m.qk_nope_head_dim + m.v_head_dim)
    pe = v.unsqueeze(1).expand(-1, spec.num_heads, -1)
    return torch.cat([kv[..., : m.qk_nope_head_dim], pe], -1), kv[..., m.qk_nope_head_dim :]


def dense_attention(spec: BatchSpec, data) -> torch.Tensor:
    """Softmax(q·k * scale) · v for every query, every head, written with loops."""
    outs, t = [], 0
    scale = 1 / math.sqrt(spec.head_dim)
    for i, (q_len, ctx) in enumerate(spec.requests):
        keys, values = _request_kv(spec, data, i)
        for p in range(ctx, ctx + q_len):
            q = data.queries[t].float()
            t += 1
            vis = [j for j in range(ctx + q_len) if _visible(p, j, spec)]
            if spec.indexer is not None:  # DSA: only the keys this query's top-k row names
                vis = [j for j in vis if j in data.topk_indices[t - 1].tolist()]
            scores = torch.einsum("hd,jhd->hj", q, keys[vis].float()) * scale
            if spec.logit_softcap is not None:
                scores = spec.logit_softcap * torch.tanh(scores / spec.logit_softcap)
            weights = scores.exp()  # written out: a sink adds exp(sink) to the denominator and no value
            sink = data.sinks.float().exp().unsqueeze(-1) if spec.sinks else 0.0
            outs.append(
                torch.einsum("hj,jhd->hd", weights / (weights.sum(-1, keepdim=True) + sink), values[vis].float())
            )
    return torch.stack(outs).to(torch_dtype(spec.dtype))


def test_vanilla_matches_dense_on_every_named_spec():
    """VANILLA equals the plain loop on every named spec (all layouts, dtypes, window, chunk, soft-cap, sinks, fp8,
    MLA, DSA)."""
    for spec in [*SPECS.values(), *MLA_SPECS.values()]:
        data = make_data(spec)
        with torch.no_grad():
            want = dense_attention(spec, data)
        assert_close("VANILLA", spec, run_backend("VANILLA", spec, data=data), want)


@st.composite
def batch_specs(draw) -> BatchSpec:
    kv_heads = draw(st.sampled_from([1, 2, 4]))
    requests = tuple(draw(st.lists(st.tuples(st.integers(1, 9), st.integers(0, 40)), min_size=1, max_size=4)))
    kind = draw(st.sampled_from(["full_attention", "sliding_attention", "chunked_attention"]))
    return BatchSpec(
        "hypothesis",
        requests,
        num_heads=kv_heads * draw(st.sampled_from([1, 2, 3])),
        num_kv_heads=kv_heads,
        head_dim=draw(st.sampled_from([8, 16, 24])),
        block_size=draw(st.sampled_from([1, 4, 16])),
        layout=draw(st.sampled_from(["NHD", "HND"])),
        attn_type=kind,
        sliding_window=draw(st.integers(1, 20)) if kind == "sliding_attention" else None,
        chunk_size=draw(st.integers(1, 20)) if kind == "chunked_attention" else None,
        logit_softcap=draw(st.sampled_from([None, 3.0])),
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=batch_specs(), seed=st.integers(0, 2**16))
def test_vanilla_matches_dense_on_random_batches(spec, seed):
    """VANILLA equals the plain loop for random geometries, block sizes and prefill/decode mixes."""
    data = make_data(spec, seed)
    with torch.no_grad():
        want = dense_attention(spec, data)
    assert_close("VANILLA", spec, run_backend("VANILLA", spec, data=data), want)
