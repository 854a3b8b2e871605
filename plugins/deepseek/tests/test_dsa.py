"""DeepSeek-V3.2 sparse attention (DSA) against transformers, and the backends that refuse it."""

from __future__ import annotations

import pytest

from kernelbay.attention import BackendNotCapable
from kernelbay_engine.runner import ModelRunner
from tests.models._parity import compare_generation, runner

from ._tiny_v32 import INDEX_TOPK, PROMPTS, TINY_V32

NAME = "deepseek_v32"


@pytest.fixture(scope="module")
def v32(loaded):
    return loaded(NAME, TINY_V32[NAME])


def test_logits_and_greedy_tokens_match_transformers_on_vanilla(v32):
    """Prefill of four prompts of mixed lengths (most longer than index_topk) + 8 decode steps: logits within
    1e-4, same greedy tokens, with each query attending to the indexer's top-k keys only."""
    hf_model, model = v32
    assert max(map(len, PROMPTS)) > INDEX_TOPK and model.config.indexer.index_topk == INDEX_TOPK
    compare_generation(hf_model, runner(model, "VANILLA"), f"{NAME} VANILLA", prompts=PROMPTS)


@pytest.mark.parametrize("backend", ["SDPA", "FLEX"])
def test_backends_without_dsa_refuse_naming_the_sparse_mode(v32, backend):
    """SDPA and FLEX do not declare sparse mode "dsa": requesting them is an error that names it."""
    _, model = v32
    with pytest.raises(BackendNotCapable, match=r"sparse_mode: dsa is not supported \(supported: none\)"):
        ModelRunner(model, num_blocks=64, block_size=4, attention_backend=backend)
