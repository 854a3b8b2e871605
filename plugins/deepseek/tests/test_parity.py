"""Every kernelbay-deepseek architecture against transformers, on every attention backend capable of it."""

from __future__ import annotations

import pytest

from tests.models._parity import BACKENDS, compare_generation, runner
from tests.models._tiny import TINY_DEEPSEEK


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(TINY_DEEPSEEK))
def test_logits_and_greedy_tokens_match_transformers(loaded, name, backend):
    """Prefill of four prompts of different lengths plus 8 decode steps: logits within 1e-4, same tokens."""
    hf_model, model = loaded(name)
    compare_generation(hf_model, runner(model, backend), f"{name} {backend}")
