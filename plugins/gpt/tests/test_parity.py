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


def test_every_architecture_of_the_plugin_has_a_parity_case(loaded):
    """The matrix above covers each architecture kernelbay-gpt registers (its kernelbay.models entry points)."""
    from importlib.metadata import entry_points

    registered = {ep.name for ep in entry_points(group="kernelbay.models") if ep.value.startswith("kernelbay_gpt.")}
    covered = {type(loaded(name, tiny)[1]).__name__ for name, tiny in TINY_GPT.items()}
    assert registered == {"GPT2LMHeadModel", "OPTForCausalLM", "GPTNeoXForCausalLM", "FalconForCausalLM"}
    assert registered <= covered, f"no parity case for {sorted(registered - covered)}"
