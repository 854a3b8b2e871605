"""Every supported architecture against transformers, on every attention backend capable of it."""

from __future__ import annotations

import pytest

from kernelbay.attention import BackendNotCapable
from kernelbay_engine.runner import ModelRunner
from kernelbay_engine import AutoModelForCausalLM

from ._parity import compare_generation
from ._tiny import TINY

# FLEX compiles flex_attention for every new step shape (~15 s each on the CI CPUs), so the full matrix
# runs on VANILLA and SDPA; FLEX gets one short run below, and tests/attention checks it against VANILLA.
BACKENDS = ("VANILLA", "SDPA")


@pytest.fixture(scope="module")
def loaded(tiny_checkpoints):
    """name -> (transformers model, kernelbay model), each kernelbay model loaded once per module."""
    cache = {}

    def get(name):
        if name not in cache:
            folder, hf_model = tiny_checkpoints.get(name)
            cache[name] = (hf_model, AutoModelForCausalLM.from_pretrained(folder, progress=False))
        return cache[name]

    return get


def _runner(model, backend: str) -> ModelRunner:
    try:
        return ModelRunner(model, num_blocks=64, block_size=4, attention_backend=backend)
    except BackendNotCapable as err:
        pytest.skip(f"{backend} is not capable of this model: {err}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(TINY))
def test_logits_and_greedy_tokens_match_transformers(loaded, name, backend):
    """Prefill of four prompts of different lengths plus 8 decode steps: logits within 1e-4, same tokens."""
    hf_model, model = loaded(name)
    compare_generation(hf_model, _runner(model, backend), f"{name} {backend}")


@pytest.mark.slow
def test_flex_backend_matches_transformers_on_llama(loaded):
    """FLEX on the Llama-3.1-like model: prefill of four prompts and one decode step, same bar."""
    hf_model, model = loaded("llama3")
    compare_generation(hf_model, _runner(model, "FLEX"), "llama3 FLEX", steps=1)


def test_every_registered_family_architecture_has_a_parity_case(loaded):
    """The parity matrix covers each architecture the llama and deepseek plugins register."""
    from kernelbay.registry import names

    covered = {type(loaded(name)[1]).__name__ for name in TINY}
    family = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM", "Gemma2ForCausalLM",
              "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"}
    assert family <= set(names("model"))
    assert family <= covered, f"no parity case for {sorted(family - covered)}"
