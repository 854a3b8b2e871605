"""Speculative decoding on a model sharded over two gloo ranks: n-gram proposals give one rank's plain greedy tokens
across a mixed batch (chunked prefills beside verifying decodes, rejected guesses rolled back on every rank), and
their guesses are accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbay_engine import LLM, SamplingParams

from .test_speculative_eagle import build_counting_target

GREEDY = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
PROMPTS = [
    [5, 6, 7, 8, 9, 5, 6, 7],  # n-gram: proposes 8 9 5 6 where the target counts on: some accepted, then rejected
    [20, 21],
    list(range(30, 70)),  # a long prompt: prefilled in chunks beside the others' verifications
    [3] * 10,
    [100, 7, 250, 31, 31, 9, 64, 65, 66, 100, 7, 250],
    [318, 319, 4],
]
SCHEDULING = dict(block_size=4, max_num_batched_tokens=16)
"""Small blocks (rollback crosses block ends) and a 16-token step budget (prompts chunked beside decodes)."""


@pytest.fixture(scope="module")
def counting_target(tmp_path_factory) -> Path:
    return build_counting_target(tmp_path_factory.mktemp("tp-counting-target"))


@pytest.fixture(scope="module")
def plain_tokens(counting_target) -> list[list[int]]:
    """One rank, no speculation."""
    return _tokens(LLM(counting_target, progress=False))


def _tokens(llm: LLM, prompts=PROMPTS) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, GREEDY)]


def _sharded(folder: Path, **options) -> LLM:
    return LLM(folder, progress=False, tensor_parallel_size=2, **SCHEDULING, **options)


def test_ngram_at_two_ranks_gives_one_ranks_plain_tokens(counting_target, plain_tokens):
    """n-gram, k = 4, at two ranks: multi-token verification rows run on both ranks and each rejected guess's KV slots
    are rolled back on both; the tokens are plain decoding's at one rank, first and again on reused blocks."""
    llm = _sharded(counting_target, speculative="ngram", num_speculative_tokens=4)
    try:
        assert _tokens(llm) == plain_tokens
        stats = llm.stats()
        assert 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens, "guesses were meant to be both kept and not"
        assert _tokens(llm, PROMPTS[::-1]) == plain_tokens[::-1]  # no stale keys or values on either rank
    finally:
        llm.runner.shutdown()
