"""Every kernelbay-gpt architecture against transformers, on every attention backend capable of it."""

from __future__ import annotations

import pytest

from plugins.gpt.tests._tiny_gpt import TINY_GPT
from tests.models._parity import BACKENDS, compare_generation, runner


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(TINY_GPT))
def test_logits_and_greedy_tokens_match_transformers(loaded, name, backend):
    """Prefill of four prompts of different lengths plus 8 decode steps: logits within 1e-4, same tokens."""
    hf_model, model = loaded(name, TINY_GPT[name])
    compare_generation(hf_model, runner(model, backend), f"{name} {backend}")
