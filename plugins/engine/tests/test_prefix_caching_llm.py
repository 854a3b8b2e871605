"""Automatic prefix caching through `LLM`, on real models and every capable backend: greedy outputs are the same
with caching on and off, through eviction and preemption; prompt log-probabilities stay complete.

The conftest's ledger check runs after every test: no block is still held once the calls return."""

from __future__ import annotations

import random

import pytest

from kernelbay.errors import IncapableBackend
from kernelbay.registry import names
from kernelbay_engine import LLM, SamplingParams
from tests.models.conftest import tiny_checkpoints  # noqa: F401  (a fixture)

GREEDY = SamplingParams(max_tokens=6, temperature=0)
BLOCK = 16


def shared_prefix_prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    """Prompts sharing prefixes of several lengths: block-aligned (16, 32, and a whole 32-token prompt) or not
    (21, 40), plus one that shares nothing."""
    rng = random.Random(seed)
    base = [rng.randrange(3, vocab) for _ in range(40)]

    def tail(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    return [
        base[:16] + tail(5),
        base[:32],
        base[:21] + tail(9),
        base[:32] + tail(1),
        base[:40] + tail(7),
        base[:40] + tail(3),
        tail(18),
        base[:16] + tail(20),
    ]


def run_twice(llm: LLM, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    """Greedy tokens of a mixed batch, then of the same prompts again in reverse order (they now find their prefixes
    cached), in prompt order."""
    first = [out.token_ids for out in llm.generate(prompts, params)]
    again = [out.token_ids for out in llm.generate(prompts[::-1], params)][::-1]
    assert again == first, "a prompt's tokens changed once its prefix was cached"
    return first


def hits_of(llm: LLM, call) -> int:
    before = llm.stats().prefix_cache_hits
    call()
    return llm.stats().prefix_cache_hits - before


def _backends():
    return [b for b in names("attention_backend") if b in ("VANILLA", "SDPA", "FLEX")]


FLEX_EAGER = {"FLEX": {"compile": False}}  # the compiled kernel builds per shape: minutes on a CPU


@pytest.mark.parametrize("backend", _backends())
def test_outputs_are_the_same_with_and_without_caching_on_every_backend(backend, make_llm):
    """Mixed batches sharing prefixes of several lengths: the same greedy tokens with caching on and off, and the
    second pass really reads cached blocks."""
    options = {"attention_backend": backend, "attention_backend_options": FLEX_EAGER if backend == "FLEX" else None}
    try:
        cached = make_llm(**options, max_num_batched_tokens=24)
    except IncapableBackend as err:
        pytest.skip(f"{backend} cannot run this model: {err}")
    uncached = make_llm(**options, max_num_batched_tokens=24, enable_prefix_caching=False)
    prompts = shared_prefix_prompts(cached.config.vocab_size)
    assert cached.prefix_caching.enabled and not uncached.prefix_caching.enabled
    want = [out.token_ids for out in uncached.generate(prompts, GREEDY)]
    assert hits_of(cached, lambda: run_twice(cached, prompts)) > 0
    assert run_twice(cached, prompts) == want, f"[{backend}]"
    assert uncached.stats().prefix_cache_hits == 0


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("deepseek_v2_lite", id="mla"),
        pytest.param("mistral", id="sliding-window"),
        pytest.param("gemma2", id="sliding-window-softcap"),
    ],
)
def test_mla_and_sliding_window_models_give_the_same_outputs(name, tiny_checkpoints):  # noqa: F811
    """An MLA model (the cache holds the latent) and sliding-window models (windows shorter than a block and than
    the shared prefixes): the same greedy tokens with caching on and off."""
    folder = tiny_checkpoints.get(name)[0]
    cached = LLM(folder, progress=False, max_num_seqs=8)
    uncached = LLM(folder, progress=False, max_num_seqs=8, enable_prefix_caching=False)
    prompts = shared_prefix_prompts(cached.config.vocab_size, seed=1)
    want = [out.token_ids for out in uncached.generate(prompts, GREEDY)]
    assert hits_of(cached, lambda: run_twice(cached, prompts)) > 0
    assert run_twice(cached, prompts) == want, f"[{name}: {cached.attention_backends}]"


@pytest.fixture(scope="module")
def small_cache_pair(tiny_llama):
    """A cache of 12 blocks (192 tokens), with caching on and off."""
    options = {"progress": False, "kv_cache_memory": "96KiB", "max_model_len": 96}
    return LLM(tiny_llama, **options), LLM(tiny_llama, **options, enable_prefix_caching=False)


def test_a_cache_filled_past_capacity_evicts_and_keeps_outputs(small_cache_pair):
    """More distinct prefixes than the cache holds, one after another and then again: blocks are evicted, what
    survives is reused, and every output equals the uncached one."""
    cached, uncached = small_cache_pair
    assert cached.stats().kv_blocks_total == 12
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 320) for _ in range(40)] for _ in range(8)]  # 3 blocks each: 24 > 12
    want = [uncached.generate([p], GREEDY)[0].token_ids for p in prompts]
    for _ in range(2):
        assert [cached.generate([p], GREEDY)[0].token_ids for p in prompts] == want
    stats = cached.stats()
    assert stats.kv_blocks_cached <= stats.kv_blocks_total and stats.kv_blocks_used == 0
    assert hits_of(cached, lambda: cached.generate([prompts[-1]], GREEDY)) == 32  # the newest survived


def test_preempting_requests_that_share_blocks_keeps_every_output(small_cache_pair):
    """Four requests share a 32-token prefix and outgrow the 12-block cache together, so the newest are preempted
    while holding shared blocks: everyone's tokens equal the uncached ones."""
    cached, uncached = small_cache_pair
    rng = random.Random(4)
    system = [rng.randrange(3, 320) for _ in range(32)]
    prompts = [system + [rng.randrange(3, 320) for _ in range(6)] for _ in range(4)]
    long = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    want = [out.token_ids for out in uncached.generate(prompts, long)]
    queries = cached.stats().prefix_cache_queries
    assert [out.token_ids for out in cached.generate(prompts, long)] == want
    assert cached.stats().prefix_cache_queries - queries > sum(map(len, prompts)), "no request was preempted"


def test_prompt_logprobs_are_computed_not_read_from_the_cache(make_llm):
    """A request asking for prompt log-probabilities skips the cache (a cached token has no logits): its entries
    equal the uncached engine's, and it counts no hit; its blocks still serve later requests."""
    cached, uncached = make_llm(), make_llm(enable_prefix_caching=False)
    prompt = shared_prefix_prompts(320, seed=5)[4]
    cached.generate([prompt], GREEDY)
    scored = SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=2, logprobs=1)
    hits = hits_of(cached, lambda: cached.generate([prompt], scored))
    got, want = cached.generate([prompt], scored)[0], uncached.generate([prompt], scored)[0]
    assert hits == 0 and len(got.prompt_logprobs) == len(prompt)
    assert got.token_ids == want.token_ids
    for mine, theirs in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:], strict=True):
        assert mine.keys() == theirs.keys()
        assert all(abs(mine[t] - theirs[t]) < 1e-4 for t in mine)
    assert hits_of(cached, lambda: cached.generate([prompt], GREEDY)) == (len(prompt) - 1) // BLOCK * BLOCK


def test_turning_caching_off_is_visible():
    """enable_prefix_caching=False is reported with its reason."""
    status = LLM(progress=False, enable_prefix_caching=False).prefix_caching
    assert not status.enabled and "enable_prefix_caching=False" in status.reason


def test_run_and_serve_turn_caching_off_with_a_flag(tiny_llama):
    """`--no-enable-prefix-caching` (an engine option `run` and `serve` share) reaches LLM; on by default."""
    import argparse

    from kernelbay_engine.cli import add_run_command, build_llm, engine_options

    parser = argparse.ArgumentParser()
    add_run_command(parser)
    assert engine_options(parser.parse_args(["--prompt", "x"]))["enable_prefix_caching"] is True
    args = parser.parse_args([str(tiny_llama), "--prompt", "x", "--no-enable-prefix-caching"])
    assert not build_llm(args, tiny_llama).prefix_caching.enabled


def test_explain_says_whether_prefix_caching_is_on(tiny_llama):
    """`kernelbay explain` reports prefix caching for the chosen backends, in the document and its text."""
    from kernelbay_engine.explain import explain_model, render_text
    from tests._explain_schema import validate

    doc = explain_model(tiny_llama, backend="VANILLA")
    assert validate(doc) == []
    assert doc["attention"]["prefix_caching"] == {
        "enabled": True,
        "reason": "on: prompts reuse the cached KV blocks of their shared prefixes (read by VANILLA)",
    }
    assert "  prefix caching on: prompts reuse" in render_text(doc)
