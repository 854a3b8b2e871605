"""ModelRunner: mixed and chunked steps agree with plain prefill/decode; bad steps fail without side effects."""

from __future__ import annotations

import pytest
import torch

from kernelbay.attention import BackendNotCapable
from kernelbay_engine import AutoModelForCausalLM
from kernelbay_engine.kv_cache import KVCacheExhausted
from kernelbay_engine.runner import ModelRunner, StepRequest

PROMPT_A = [3, 14, 15, 92, 65, 35, 89, 79, 32]
PROMPT_B = [27, 18, 28, 18, 28]


@pytest.fixture(scope="module")
def model(tiny_checkpoints):
    return AutoModelForCausalLM.from_pretrained(tiny_checkpoints.get("mistral")[0], progress=False)


def _runner(model, **kw) -> ModelRunner:
    return ModelRunner(model, num_blocks=kw.pop("num_blocks", 32), block_size=4, attention_backend="VANILLA", **kw)


def test_chunked_prefill_equals_one_step_prefill(model):
    """A prompt fed in chunks of 4, 3 and 2 tokens ends with the same logits as in one step."""
    whole = _runner(model).step([StepRequest("a", PROMPT_A, 0)])
    runner = _runner(model)
    runner.step([StepRequest("a", PROMPT_A[:4], 0)])
    runner.step([StepRequest("a", PROMPT_A[4:7], 4)])
    chunked = runner.step([StepRequest("a", PROMPT_A[7:], 7)])
    assert torch.allclose(chunked, whole, atol=1e-5)


def test_mixed_step_equals_separate_steps(model):
    """One step holding a decode of A and the prefill of B returns what two separate steps return."""
    runner = _runner(model)
    runner.step([StepRequest("a", PROMPT_A, 0)])
    mixed = runner.step([StepRequest("a", [7], len(PROMPT_A)), StepRequest("b", PROMPT_B, 0)])
    alone = _runner(model)
    alone.step([StepRequest("a", PROMPT_A, 0)])
    decode = alone.step([StepRequest("a", [7], len(PROMPT_A))])
    prefill = alone.step([StepRequest("b", PROMPT_B, 0)])
    assert mixed.shape == (2, model.config.vocab_size)
    assert torch.allclose(mixed, torch.cat([decode, prefill]), atol=1e-5)


def test_free_returns_the_blocks(model):
    """Driven by hand, free() gives a request's blocks back: a cache full with it has room for another."""
    runner = _runner(model, num_blocks=3)
    runner.step([StepRequest("a", PROMPT_A, 0)])  # 9 tokens: all 3 blocks
    runner.free("a")
    assert runner.num_cached_tokens("a") == 0
    runner.step([StepRequest("b", [*PROMPT_A, 1, 2, 3], 0)])
    assert runner.num_cached_tokens("b") == 12


def test_steps_with_block_tables_use_them(model):
    """Given the scheduler's block tables the runner allocates nothing and returns what it returns driven by
    hand; mixing steps with and without tables over one cache is refused."""
    from kernelbay_engine.kv_cache import KVCacheManager

    by_hand = _runner(model)
    by_hand.step([StepRequest("a", PROMPT_A, 0)])
    want = by_hand.step([StepRequest("a", [7], len(PROMPT_A)), StepRequest("b", PROMPT_B, 0)])
    blocks, runner = KVCacheManager(32, 4), _runner(model)
    blocks.allocate("x", 5)  # tables elsewhere in the cache than the runner's own allocator would pick
    runner.step([StepRequest("a", PROMPT_A, 0, blocks.grow_to("a", len(PROMPT_A)))])
    got = runner.step(
        [
            StepRequest("a", [7], len(PROMPT_A), blocks.grow_to("a", len(PROMPT_A) + 1)),
            StepRequest("b", PROMPT_B, 0, blocks.grow_to("b", len(PROMPT_B))),
        ]
    )
    assert torch.allclose(got, want, atol=1e-5)
    assert runner.num_cached_tokens("a") == 0, "the runner kept no accounting of its own"
    with pytest.raises(ValueError, match="handed out by the caller's allocator"):
        runner.step([StepRequest("c", [1], 0)])
    with pytest.raises(ValueError, match="beyond this runner's cache of 32 blocks"):
        runner.step([StepRequest("c", [1], 0, (32,))])
    with pytest.raises(ValueError, match="handed out by the runner's own allocator"):
        by_hand.step([StepRequest("c", [1], 0, (5,))])


def test_cache_is_planned_before_it_is_allocated(model):
    """Without num_blocks the runner prices one block (the layers' page_size_bytes) and allocates on request."""
    runner = ModelRunner(model, block_size=4, attention_backend="VANILLA")
    layers = model.attention_layers().values()
    spec = runner.cache.layers[0].spec
    assert runner.bytes_per_block == len(layers) * spec.page_size_bytes == len(layers) * 4 * spec.bytes_per_token
    with pytest.raises(RuntimeError, match="allocate_cache"):
        runner.step([StepRequest("a", [1], 0)])
    runner.allocate_cache(5)
    assert {layer.backend.kv_cache.shape[1] for layer in layers} == {5}
    assert runner.step([StepRequest("a", PROMPT_B, 0)]).shape == (1, model.config.vocab_size)


def test_start_pos_must_continue_the_cache(model):
    """A known request must resume where its cache ends; a new one must start at 0."""
    runner = _runner(model)
    runner.step([StepRequest("a", PROMPT_A, 0)])
    with pytest.raises(ValueError, match="start_pos 3 but 9 tokens are cached"):
        runner.step([StepRequest("a", [1], 3)])
    with pytest.raises(ValueError, match=r"is new .* start_pos is 5"):
        runner.step([StepRequest("b", [1], 5)])


def test_exhausted_cache_changes_nothing(model):
    """A step that does not fit raises KVCacheExhausted before any request grows."""
    runner = _runner(model, num_blocks=3)
    runner.step([StepRequest("a", PROMPT_A, 0)])  # 9 tokens: 3 blocks of 4
    with pytest.raises(KVCacheExhausted, match="needs 2 more KV-cache block"):
        runner.step([StepRequest("a", [1, 2, 3, 4], 9), StepRequest("b", [5], 0)])
    assert runner.num_cached_tokens("a") == 9 and runner.num_cached_tokens("b") == 0


def test_step_validation(model):
    """Empty steps, empty requests and duplicate ids are refused with a reason."""
    runner = _runner(model)
    with pytest.raises(ValueError, match="at least one StepRequest"):
        runner.step([])
    with pytest.raises(ValueError, match="at least one new token"):
        StepRequest("a", [], 0)
    with pytest.raises(ValueError, match="once per step"):
        runner.step([StepRequest("a", [1], 0), StepRequest("a", [2], 0)])


def test_backend_selection_is_reported_and_incapable_request_refused(tiny_checkpoints):
    """Auto selection names a backend per layer group; SDPA on soft-capped Gemma-2 is refused with the reason."""
    gemma = AutoModelForCausalLM.from_pretrained(tiny_checkpoints.get("gemma2")[0], progress=False)
    runner = ModelRunner(gemma, num_blocks=8, block_size=4)
    assert runner.backend_for("sliding_attention") == runner.backend_for("full_attention")
    with pytest.raises(BackendNotCapable, match="logit_softcap"):
        ModelRunner(gemma, num_blocks=8, block_size=4, attention_backend="SDPA")


def test_runner_refuses_unloaded_models_and_bad_options(model, tiny_checkpoints):
    """A model still on meta, an unknown KV dtype or an unknown backend option are refused up front."""
    from kernelbay.errors import ConfigError
    from kernelbay_engine.config import ModelConfig

    config = ModelConfig.from_pretrained(tiny_checkpoints.get("mistral")[0])
    with pytest.raises(ValueError, match="weights are not loaded"):
        ModelRunner(AutoModelForCausalLM.from_config(config), num_blocks=4)
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        _runner(model, kv_cache_dtype="int3")
    with pytest.raises(ConfigError, match="SDPA"):
        _runner(model, attention_backend_options={"SDPA": {"no_such_knob": 1}})
