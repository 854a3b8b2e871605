"""Speculative decoding on a model sharded over two gloo ranks: n-gram proposals and EAGLE-3 drafts give one rank's
plain greedy tokens across a mixed batch (chunked prefills beside verifying decodes, rejected guesses rolled back on
every rank), and their guesses are accepted.

The draft runs on the driver (rank 0), unsharded: it reads rank 0's aux-layer inputs (the residual stream, whole on
every rank after each all-reduce) and, when its folder holds no token table, a whole copy of the target's, gathered
from the ranks' vocabulary rows once at load."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelbay_engine import LLM, SamplingParams

from .checkpoints import build_tiny_llama
from .eagle3_drafts import draft_config, random_tensors, target_config, write_draft
from .test_speculative_eagle import build_counting_target, write_counting_draft

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
def counting_draft(tmp_path_factory, counting_target) -> Path:
    """Guesses the counting target's next tokens; no token table of its own (it looks tokens up in the target's)."""
    return write_counting_draft(tmp_path_factory.mktemp("tp-counting-draft"), counting_target)


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


def test_an_eagle_draft_at_two_ranks_gives_one_ranks_plain_tokens(counting_target, counting_draft, plain_tokens):
    """The counting draft, k = 4, at two ranks: it reads rank 0's aux-layer inputs, so it makes one rank's guesses
    (the same proposed, accepted and verified counts, most verifications keeping one); the tokens are plain decoding's
    at one rank, first and again."""
    options = dict(speculative=counting_draft, num_speculative_tokens=4)
    single = LLM(counting_target, progress=False, **SCHEDULING, **options)
    assert _tokens(single) == plain_tokens
    expected = _speculation(single)
    assert expected[1] > 0.5 * expected[2] > 0, expected
    llm = _sharded(counting_target, **options)
    try:
        assert _tokens(llm) == plain_tokens
        assert _speculation(llm) == expected
        assert _tokens(llm, PROMPTS[::-1]) == plain_tokens[::-1]
    finally:
        llm.runner.shutdown()


def _speculation(llm: LLM) -> tuple[int, int, int]:
    """(proposed, accepted, verifications) so far."""
    stats = llm.stats()
    return stats.spec_draft_tokens, stats.spec_accepted_tokens, stats.spec_verifications


def test_a_draft_reads_the_whole_target_table_gathered_from_the_ranks(tmp_path):
    """A 97-token vocabulary splits 49 + 49 (the last row padding): the draft's lookups at two ranks equal the
    single-process table for every token, and a random draft's guesses leave the plain tokens."""
    target = build_tiny_llama(tmp_path / "target", vocab_size=97)
    config = draft_config(target_config(target), eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 1]})
    draft = write_draft(tmp_path / "draft", config, random_tensors(config, seed=1))
    single = LLM(target, progress=False)
    prompts = [[5, 6, 7, 8, 9, 5, 6, 7], [96, 95, 11], [40, 41, 42, 43, 44]]
    expected, table = _tokens(single, prompts), single.model.input_embeddings().weight.detach().clone()
    del single
    llm = _sharded(target, speculative=draft, num_speculative_tokens=3)
    try:
        with torch.inference_mode():
            assert torch.equal(llm._core.proposer.draft.embed(torch.arange(97)), table)
        assert _tokens(llm, prompts) == expected
        assert llm.stats().spec_draft_tokens > 0
    finally:
        llm.runner.shutdown()


DEMO_TEXTS = ["A fortune for today:", "Love is", "The computer", "Q: What is a fortune?\nA:"]


@pytest.mark.slow  # the demo model at one rank and two, with its trained draft and without
def test_the_trained_demo_draft_accepts_as_much_at_two_ranks():
    """The demo model in float32 with its trained EAGLE-3 draft (k = 4): at two ranks the same greedy tokens as
    plain decoding at one, and the same acceptance as at one rank (0.701 measured)."""
    from kernelbay_engine.inputs import demo_model_folder

    draft = demo_model_folder() / "eagle3"
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    plain = LLM(progress=False, dtype="float32")
    expected = [o.token_ids for o in plain.generate(DEMO_TEXTS, params)]
    single = LLM(progress=False, dtype="float32", speculative=draft)
    assert [o.token_ids for o in single.generate(DEMO_TEXTS, params)] == expected
    llm = LLM(progress=False, dtype="float32", tensor_parallel_size=2, speculative=draft)
    try:
        assert [o.token_ids for o in llm.generate(DEMO_TEXTS, params)] == expected
        assert _speculation(llm) == _speculation(single)
        assert llm.stats().spec_acceptance_rate > 0.5
    finally:
        llm.runner.shutdown()
