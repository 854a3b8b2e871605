"""CPU_PAGED against the conformance kit's float64 reference: the kit's own specs, prompts long enough to take the
SDPA path (alone, after a context, beside decodes; windows, chunks, encoder layers), bfloat16 and float16 (with a
cache of another float type), the portable loops, one query's bits whatever its batch, and what it refuses."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from kernelbay.attention import AttentionForwardArgs, AttentionRequirements, create_attention
from kernelbay.testing import BatchSpec, block_tables, check_backend, make_data, run_backend
from kernelbay.testing.report import PASS
from kernelbay_cpu.attention import LIBRARY, NATIVE_QUERIES, CpuPagedBackend
from kernelbay_cpu.build import ENV

PROMPT = NATIVE_QUERIES + 9  # a request this long is a prompt: one SDPA call
WINDOW = {"attn_type": "sliding_attention", "sliding_window": 12}
CHUNKS = {"attn_type": "chunked_attention", "chunk_size": 16}
LONG_SPECS = (
    BatchSpec("fresh_prompt", ((PROMPT, 0),)),
    BatchSpec("prompt_after_context", ((PROMPT, 23),)),
    BatchSpec("prompts_beside_decodes", ((1, 40), (PROMPT, 0), (3, 17), (PROMPT + 4, 30), (1, 5))),
    BatchSpec("prompt_gqa_hnd", ((PROMPT, 11), (1, 70)), num_heads=8, num_kv_heads=2, layout="HND"),
    BatchSpec("prompt_mqa_head_80", ((PROMPT, 0), (2, 9)), num_heads=6, num_kv_heads=1, head_dim=80),
    BatchSpec("prompt_block_64_runs", ((PROMPT, 70), (1, 130)), block_size=64, contiguous_blocks=True),
    BatchSpec("verify_rows", ((NATIVE_QUERIES, 33), (5, 60), (NATIVE_QUERIES + 1, 2))),
    BatchSpec("odd_head_dim", ((1, 21), (4, 3), (PROMPT, 0)), head_dim=72, num_heads=4, num_kv_heads=4),
    BatchSpec("bf16_prompts", ((PROMPT, 8), (1, 44)), dtype="bfloat16"),
    BatchSpec("fp16_hnd_prompts", ((PROMPT, 0), (2, 19)), dtype="float16", layout="HND"),
    BatchSpec("bf16_model_float32_cache", ((1, 20), (PROMPT, 3)), dtype="bfloat16", kv_cache_dtype="float32"),
    BatchSpec("float32_model_fp16_cache", ((1, 20), (PROMPT, 3)), kv_cache_dtype="float16"),
    BatchSpec("window_prompts", ((PROMPT, 0), (PROMPT, 30), (4, 50), (1, 9)), **WINDOW),
    BatchSpec("window_hnd_gqa", ((PROMPT, 10), (1, 70)), num_heads=8, layout="HND", **WINDOW),
    BatchSpec("chunked_prompts", ((PROMPT + 20, 0), (PROMPT, 21), (3, 40)), **CHUNKS),
    BatchSpec("encoder_prompts", ((PROMPT, 0), (5, 0)), attn_type="encoder_attention"),
)


@pytest.fixture(scope="module")
def kernel():
    module = LIBRARY.ops()
    assert module is not None, LIBRARY.status()  # CI has g++ and ninja: the kernel must build there
    return module


@contextlib.contextmanager
def portable_loops(kernel):
    before = kernel.set_plain(True)
    try:
        yield
    finally:
        kernel.set_plain(before)


def _conforms(specs=None) -> None:
    report = check_backend(CpuPagedBackend, specs)
    assert report.passed, report.render()
    assert report.counts()[PASS] >= (len(specs) if specs else 15), report.render()


def test_the_kits_specs(kernel):
    _conforms()


def test_prompts_take_sdpa_beside_the_native_rows(kernel):
    _conforms(LONG_SPECS)


def test_the_portable_loops_without_avx512(kernel):
    with portable_loops(kernel):
        assert not kernel.uses_avx512()
        _conforms()
        _conforms(LONG_SPECS)


def test_a_query_gets_the_same_bits_whatever_comes_with_it(kernel):
    """A request's last token attended alone (decode) and as the last of a verify row beside other requests: the
    same output bit for bit, which is what keeps greedy speculative decoding lossless."""
    row = BatchSpec("row", ((6, 50),))
    data = make_data(row, seed=3)
    together = run_backend(CpuPagedBackend, row, seed=3, data=data)
    alone_spec = BatchSpec("alone", ((1, 55),))
    alone_data = make_data(alone_spec, seed=3)
    # the same keys and values, and the row's last query
    alone_data.keys[0].copy_(data.keys[0])
    alone_data.values[0].copy_(data.values[0])
    alone_data.queries.copy_(data.queries[-1:])
    alone = run_backend(CpuPagedBackend, alone_spec, seed=3, data=alone_data)
    assert torch.equal(alone[0], together[-1])


def test_a_non_causal_call_sees_every_key(kernel):
    """AttentionForwardArgs(causal=False): every query of a request over all its keys, native rows and a prompt
    alike, against torch's float64 SDPA without a mask."""
    spec = BatchSpec("all_keys", ((3, 12), (PROMPT, 5), (1, 30)))
    data = make_data(spec, seed=1)
    layer = create_attention(0, spec.num_heads, spec.head_dim, spec.num_kv_heads, backend=CpuPagedBackend)
    num_blocks, tables = block_tables(spec, 0)
    layer.attach_kv_cache(layer.kv_cache_spec(spec.dtype, spec.block_size).allocate(num_blocks))
    rows = list(zip(spec.requests, tables, strict=True))
    whole = CpuPagedBackend.prepare([(q + c, 0, t) for (q, c), t in rows], spec.block_size)
    layer.write_kv(torch.cat(data.keys), torch.cat(data.values), whole)  # every key cached first
    md = CpuPagedBackend.prepare([(q, c, t) for (q, c), t in rows], spec.block_size)
    args = AttentionForwardArgs(causal=False, update_kv_cache=False)
    out = layer.forward(data.queries, None, None, md, args)
    start = 0
    for (q_len, _), keys, values in zip(spec.requests, data.keys, data.values, strict=True):
        q = data.queries[start : start + q_len].double().transpose(0, 1)
        want = F.scaled_dot_product_attention(
            q, keys.double().transpose(0, 1), values.double().transpose(0, 1), enable_gqa=True
        ).transpose(0, 1)
        torch.testing.assert_close(out[start : start + q_len].double(), want, rtol=0, atol=1e-5)
        start += q_len


def test_refusals_name_what_to_use_instead():
    assert CpuPagedBackend.capability_failures(BatchSpec("fp8", ((1, 4),), kv_cache_dtype="fp8_e4m3").requirements())
    softcap = AttentionRequirements(head_size=64, dtype="float32", logit_softcap=True)
    assert CpuPagedBackend.capability_failures(softcap) == [
        "logit_softcap: attention logit soft-capping is not supported"
    ]
    layer = create_attention(0, 4, 64, 2, backend=CpuPagedBackend)
    cache = layer.kv_cache_spec("float32", 16).allocate(4)
    with pytest.raises(ValueError, match=r"k_scale and v_scale must be 1\.0"):
        layer.attach_kv_cache(cache, 0.5, 1.0)


def test_the_kernel_refuses_a_block_outside_the_cache(kernel):
    layer = create_attention(0, 4, 64, 2, backend=CpuPagedBackend)
    layer.attach_kv_cache(layer.kv_cache_spec("float32", 16).allocate(2))
    md = CpuPagedBackend.prepare([(1, 20, (0, 7))], 16)  # block 7 of a 2-block cache
    q, kv = torch.randn(1, 4, 64), torch.randn(1, 2, 64)
    with pytest.raises(RuntimeError, match="outside the cache"):
        layer.forward(q, kv, kv, md)


def test_without_its_kernel_the_selector_takes_sdpa_and_says_why():
    """KERNELBAY_NATIVE=0 (as a machine without a compiler): CPU_PAGED is unavailable with the build's reason, SDPA
    serves the layer, and the selection names both."""
    code = """
import json
from kernelbay.attention import AttentionRequirements, select_attention_backend
result = select_attention_backend(AttentionRequirements(head_size=64, dtype="float32"), platform="cpu")
print(json.dumps([result.backend_name, [c.failures for c in result.candidates if c.name == "CPU_PAGED"]]))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, ENV: "0"}
    )
    assert done.returncode == 0, done.stderr
    chosen, failures = json.loads(done.stdout)
    assert chosen == "SDPA"
    assert failures == [["available: CPU_PAGED attention kernel not in use: disabled by KERNELBAY_NATIVE=0"]]
