"""Every tiny family runs in float16 and bfloat16 with the native CPU ops loaded: each native op either takes the
dtype or its caller runs the aten path (kernelbay_engine.native's *_DTYPES), never a native op's dtype error."""

from __future__ import annotations

import math

import pytest

from kernelbay_engine import LLM, SamplingParams, native

from ._tiny import TINY


@pytest.fixture(scope="module", autouse=True)
def _native_ops_loaded():
    assert native.ops() is not None, native.status()  # CI has g++ and ninja: the ops are what this test is about


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(TINY))
def test_every_family_generates_in_half_precision(tiny_checkpoints, name, dtype):
    """Greedy decoding of a tiny model in `dtype`: every token sampled, every logprob finite."""
    folder, _ = tiny_checkpoints.get(name)
    llm = LLM(folder, dtype=dtype, progress=False)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=1)
    out = llm.generate([[1, 5, 9, 22, 7]], params)[0]
    assert len(out.token_ids) == 4, (name, dtype)
    assert all(math.isfinite(step[token]) for step, token in zip(out.logprobs, out.token_ids, strict=True))
