"""The fallback inside the engine: LLM's continuous batching (mixed prefill/decode steps) and preemption."""

from __future__ import annotations

import pytest
import torch

from kernelbay.errors import UnsupportedArchitecture
from kernelbay_engine import LLM, SamplingParams
from kernelbay_engine.scheduler import Scheduler
from tests.models._parity import BACKENDS

from ._tiny import TINY_FALLBACK

PROMPTS = ([5, 9, 22, 7, 3], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23], [40], [60, 61, 62, 63, 64, 65, 66])
MAX_TOKENS = 12
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)


@torch.no_grad()
def greedy_reference(hf_model, prompt: list[int], steps: int = MAX_TOKENS) -> list[int]:
    """transformers' greedy continuation of one prompt, each step a full forward without a cache."""
    seq = list(prompt)
    for _ in range(steps):
        seq.append(int(hf_model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt) :]


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoints):
    """name -> (folder, transformers greedy tokens of each prompt)."""
    cache = {}

    def get(name):
        if name not in cache:
            folder, hf_model = tiny_checkpoints.get(name, TINY_FALLBACK[name])
            cache[name] = folder, [greedy_reference(hf_model, list(p)) for p in PROMPTS]
        return cache[name]

    return get


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["olmo2", "cohere2"])
def test_continuous_batching_matches_transformers(checkpoint, name, backend):
    """Two slots for four prompts: requests join while others decode (mixed steps); every token is transformers'."""
    folder, reference = checkpoint(name)
    llm = LLM(folder, attention_backend=backend, max_num_seqs=2, block_size=4, progress=False)
    assert [o.token_ids for o in llm.generate([list(p) for p in PROMPTS], GREEDY)] == reference


@pytest.mark.parametrize("name", ["olmo2", "starcoder2"])
def test_preemption_under_a_tiny_kv_budget_keeps_the_tokens(checkpoint, name, monkeypatch):
    """Blocks for fewer tokens than the batch needs force preemption and recomputation; tokens stay the same."""
    folder, reference = checkpoint(name)
    probe = LLM(folder, block_size=4, progress=False)
    llm = LLM(folder, block_size=4, kv_cache_memory=probe.runner.bytes_per_block * 9, progress=False)
    preempted = []
    original = Scheduler._preempt
    monkeypatch.setattr(
        Scheduler, "_preempt", lambda self, r, plan: (preempted.append(r.request_id), original(self, r, plan))
    )
    assert [o.token_ids for o in llm.generate([list(p) for p in PROMPTS], GREEDY)] == reference
    assert preempted, "the budget was meant to force at least one preemption"


def test_llm_model_impl_native_refuses_the_fallback(checkpoint):
    """LLM(model_impl="native") on an architecture only the fallback serves: the unknown-architecture error."""
    folder, _ = checkpoint("olmo2")
    with pytest.raises(UnsupportedArchitecture, match="Olmo2ForCausalLM"):
        LLM(folder, model_impl="native", progress=False)
