"""Every kernelbay-llama architecture against transformers, on every attention backend capable of it."""

from __future__ import annotations

import pytest

from tests.models._parity import BACKENDS, compare_generation, runner
from tests.models._tiny import TINY_LLAMA


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(TINY_LLAMA))
def test_logits_and_greedy_tokens_match_transformers(loaded, name, backend):
    """Prefill of four prompts of different lengths plus 8 decode steps: logits within 1e-4, same tokens."""
    hf_model, model = loaded(name)
    compare_generation(hf_model, runner(model, backend), f"{name} {backend}")


@pytest.mark.slow
def test_flex_backend_matches_transformers_on_llama(loaded):
    """FLEX on the Llama-3.1-like model: prefill of four prompts and one decode step, same bar."""
    hf_model, model = loaded("llama3")
    compare_generation(hf_model, runner(model, "FLEX"), "llama3 FLEX", steps=1)
