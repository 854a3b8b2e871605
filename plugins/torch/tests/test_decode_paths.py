"""SDPA's decode paths: a batch-1 request that is one run of blocks is read in place whatever its length or
layout; other decodes gather both planes in one call; each path's aten calls are counted, and every output
matches VANILLA."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernelbay.attention import AttentionForwardArgs
from tests.attention._harness import (
    SPECS,
    BatchSpec,
    StepData,
    assert_close,
    block_tables,
    build_layer,
    make_data,
    run_backend,
)

ONE = BatchSpec("one_run_decode", ((1, 40),), contiguous_blocks=True)
BATCH_ONE_RUNS = {
    "short": ONE,
    "long": ONE.but(requests=((1, 300),)),
    "hnd": ONE.but(layout="HND"),
    "one_block": ONE.but(requests=((1, 5),)),
    "block_1": ONE.but(block_size=1),
    "gqa": ONE.but(num_heads=8, num_kv_heads=2),
    "mqa": ONE.but(num_heads=4, num_kv_heads=1),
    "sliding": ONE.but(requests=((1, 70),), attn_type="sliding_attention", sliding_window=8),
    "chunked": ONE.but(requests=((1, 70),), attn_type="chunked_attention", chunk_size=16),
    "bf16": ONE.but(dtype="bfloat16"),
}


@pytest.mark.parametrize("name", list(BATCH_ONE_RUNS))
def test_batch_one_run_is_read_in_place(name, monkeypatch):
    """One decoding request on one run of blocks: no gather, no copy (any length, both layouts), same output."""
    import kernelbay_torch.sdpa as sdpa

    monkeypatch.setattr(sdpa.SdpaBackend, "_decode_batched", lambda *a: pytest.fail("[SDPA] gathered a copy"))
    monkeypatch.setattr(sdpa.SdpaBackend, "read_kv", lambda *a: pytest.fail("[SDPA] copied keys"))
    spec = BATCH_ONE_RUNS[name]
    assert_close("SDPA", spec, run_backend("SDPA", spec), run_backend("VANILLA", spec))


@pytest.mark.parametrize(
    "spec",
    [
        ONE.but(contiguous_blocks=False, requests=((1, 70),)),  # scattered blocks
        ONE.but(kv_cache_dtype="fp8_e4m3"),  # stored values need converting
        ONE.but(sinks=True),
        SPECS["small_decode"].but(layout="HND"),
        SPECS["small_decode"].but(sinks=True, attn_type="sliding_attention", sliding_window=8),
    ],
    ids=["scattered", "fp8", "sinks", "batch_hnd", "batch_sinks_sliding"],
)
def test_other_decodes_gather_and_match_vanilla(spec):
    """Off a run, through a converting cache, with sinks, or batched: the gathered copy gives VANILLA's output."""
    assert_close("SDPA", spec, run_backend("SDPA", spec), run_backend("VANILLA", spec))


class _Calls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func._schema.name.removeprefix("aten::"))
        return func(*args, **(kwargs or {}))


def _decode_calls(spec: BatchSpec) -> tuple[list[str], list[str]]:
    """aten calls of one layer's KV write and attention in the spec's decode step (past its first call, which
    makes the cache views and the step's shared masks)."""
    data = make_data(spec)
    layer = build_layer("SDPA", spec, data)
    num_blocks, tables = block_tables(spec)
    layer.attach_kv_cache(layer.kv_cache_spec(spec.dtype, spec.block_size, spec.layout).allocate(num_blocks))
    rows = [(q, c, t) for (q, c), t in zip(spec.requests, tables, strict=True)]
    md = type(layer).prepare(rows, spec.block_size, spec.layout)
    k, v = (torch.cat([x[-1:] for x in every]) for every in (data.keys, data.values))
    with torch.inference_mode():
        for _ in range(2):
            with _Calls() as writes:
                layer.write_kv(k, v, md)
            with _Calls() as attend:
                layer._attend(data.queries, md, AttentionForwardArgs())
    return writes.names, attend.names


def test_batch_one_decode_costs_seven_aten_calls_a_layer():
    """The KV write is one index_copy_ per plane; attention two zero-copy narrows, q's fold, SDPA, the output view."""
    writes, attend = _decode_calls(ONE)
    assert writes == ["index_copy_", "index_copy_"]
    assert attend == ["narrow", "narrow", "view", "scaled_dot_product_attention", "view"]


def test_batched_decode_gathers_both_planes_in_one_call():
    """Eight requests of unequal lengths: one index_select for keys and values into the reused buffer; the padding
    mask and the flat index are the step's first layer's."""
    spec = BatchSpec("batch_decode", tuple((1, 30 + i) for i in range(8)), contiguous_blocks=True)
    writes, attend = _decode_calls(spec)
    assert writes == ["index_copy_", "index_copy_"]
    assert attend == ["index_select", "view", "transpose", "unbind", "view", "scaled_dot_product_attention", "view"]


@pytest.mark.parametrize(
    "spec",
    [
        BatchSpec("verify_row", ((5, 40),), contiguous_blocks=True),
        BatchSpec("verify_row_gqa_hnd", ((4, 70),), contiguous_blocks=True, num_heads=8, num_kv_heads=2, layout="HND"),
        BatchSpec(
            "verify_row_sliding", ((5, 40),), contiguous_blocks=True, attn_type="sliding_attention", sliding_window=8
        ),
    ],
    ids=lambda s: s.name,
)
def test_a_verify_row_gets_the_bits_of_decoding_its_tokens_one_by_one(spec):
    """A request's few new tokens after cached ones (a speculative verify row): each query's output equals, bit for
    bit, decoding that token alone over the keys up to it (greedy speculation stays lossless)."""
    data = make_data(spec)
    verify = run_backend("SDPA", spec, data=data)
    ((q_len, context),) = spec.requests
    for j in range(q_len):
        seq_len = context + j + 1
        alone = StepData([data.keys[0][:seq_len]], [data.values[0][:seq_len]], data.queries[j : j + 1], None)
        decoded = run_backend("SDPA", spec.but(requests=((1, seq_len - 1),)), data=alone)
        assert torch.equal(verify[j], decoded[0]), f"[SDPA] {spec.name}: query {j} differs from decoding it"
