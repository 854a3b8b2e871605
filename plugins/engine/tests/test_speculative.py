"""Speculative decoding (n-gram proposals) through `LLM`: greedy tokens equal plain decoding's across mixed batches,
chunked prefill and preemption; rejected proposals leave no stale keys and values; sampling keeps the target's
distribution (chi-square); stop strings, max_tokens, EOS, logprobs and streaming behave as in plain decoding.

The conftest's ledger check runs after every test: no block is still held and the ledger is sound."""

from __future__ import annotations

import pytest
import torch

from kernelbay_engine import LLM, SamplingParams
from kernelbay_engine.args import EngineArgumentError
from kernelbay_engine.kv_cache import KVCacheManager
from kernelbay_engine.sampling import target_probabilities
from kernelbay_engine.scheduler import Scheduler
from kernelbay_engine.speculative import NgramProposer
from kernelbay_engine.speculative.verify import accept_drafts

from .checkpoints import build_tiny_llama

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
TEXTS = [
    "Permission is hereby granted, free of charge, to any person obtaining a copy. Permission is hereby granted,",
    "A fortune for today:",
    "Love is",
    "And I'm a man who can't be a man. And I'm a man who",
    "The computer",
    "You will be a good friend of the world. You will be a good friend of the world. You will",
    "Q: What is a fortune?\nA:",
]
"""Text the demo model knows (random token ids put it between exact ties, where any batching may flip them)."""


_DEMO_LLMS: dict = {}


@pytest.fixture(scope="session")
def demo_llm():
    """LLM() on the demo checkpoint (trained, so its text repeats and proposals get accepted), once per option set;
    in float32: its bfloat16 logits meet exact ties that any change of batch shape may flip."""

    def make(**options) -> LLM:
        key = repr(sorted(options.items()))
        if key not in _DEMO_LLMS:
            _DEMO_LLMS[key] = LLM(progress=False, dtype="float32", **options)
        return _DEMO_LLMS[key]

    return make


@pytest.fixture(scope="session")
def prompts(demo_llm) -> list[list[int]]:
    plain = demo_llm()
    return [plain.encode(t) for t in TEXTS]


@pytest.fixture(scope="session")
def plain_tokens(demo_llm, prompts) -> list[list[int]]:
    """Each prompt's greedy tokens, alone, without speculation."""
    llm = demo_llm()
    return [llm.generate([p], GREEDY)[0].token_ids for p in prompts]


def accepted(llm: LLM, call) -> int:
    before = llm.stats().spec_accepted_tokens
    call()
    return llm.stats().spec_accepted_tokens - before


# -- the proposer and the verifier ------------------------------------------------------------------------
def test_ngram_proposes_what_followed_the_latest_longest_match():
    """The last 2 tokens (9, 4) occurred twice: the latest occurrence's continuation is proposed, up to the limit."""
    proposer = NgramProposer(3)
    assert proposer.propose([9, 4, 1, 2, 9, 4, 7, 8, 5, 9, 4], limit=8) == [7, 8, 5]
    assert proposer.propose([9, 4, 1, 2, 9, 4, 7, 8, 5, 9, 4], limit=1) == [7]
    assert proposer.propose([1, 2, 3, 4, 5], limit=8) == [], "no earlier match: nothing proposed"
    assert proposer.propose([3, 3, 5, 1, 2, 3, 3], limit=0) == []
    # a longer match wins over a later shorter one: (1, 2, 3) occurred at 0; (2, 3) alone later at 5
    assert proposer.propose([1, 2, 3, 7, 7, 2, 3, 9, 1, 2, 3], limit=2) == [7, 7]


def test_greedy_verification_keeps_the_agreeing_prefix_and_the_targets_next_token():
    """Proposals are accepted while they equal the argmax of the row before them; then the argmax follows."""
    logits = torch.full((4, 6), -5.0)
    for row, best in enumerate([3, 1, 4, 0]):
        logits[row, best] = 5.0
    assert accept_drafts(logits, [3, 1, 4], GREEDY, None) == [3, 1, 4, 0]
    assert accept_drafts(logits, [3, 2, 4], GREEDY, None) == [3, 1]
    assert accept_drafts(logits, [5, 1, 4], GREEDY, None) == [3]


def chi_square(counts: list[int], probs: list[float]) -> float:
    total = sum(counts)
    return sum((c - total * p) ** 2 / (total * p) for c, p in zip(counts, probs, strict=True) if p > 0)


# 0.1% critical values of the chi-square distribution by degrees of freedom
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52}


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=5, top_p=0.9),
    ],
    ids=["plain", "top-k-top-p"],
)
def test_rejection_sampling_keeps_the_target_distribution(params):
    """On a 6-token vocabulary, 6000 seeded verifications of proposals (2, 5): the first emitted token follows the
    target's first row and, after an accepted 2, the second follows its second row (chi-square, 0.1% level)."""
    logits = torch.tensor(
        [[0.2, 0.1, 1.5, 0.9, -0.5, 0.3], [0.5, 1.0, 0.0, -0.3, 0.8, 0.6], [0.0, 0.3, 0.6, 0.9, 1.2, 1.5]]
    )
    probs = target_probabilities(logits, params)
    generator = torch.Generator().manual_seed(1234)
    first, second = [0] * 6, [0] * 6
    for _ in range(6000):
        tokens = accept_drafts(logits, [2, 5], params, generator)
        first[tokens[0]] += 1
        if tokens[0] == 2:
            second[tokens[1]] += 1
    assert sum(second) > 1500, "the proposal 2 is likely: it was meant to be accepted often"
    for counts, row in ((first, probs[0]), (second, probs[1])):
        p = row.tolist()
        dof = sum(1 for x in p if x > 0) - 1
        assert all(c == 0 for c, x in zip(counts, p, strict=True) if x == 0), "a token outside top-k/top-p appeared"
        assert chi_square(counts, p) < CHI2_999[dof], f"counts {counts} do not follow {p}"


def test_target_probabilities_are_what_sample_row_draws_from():
    """Dense top-k/top-p probabilities: zero outside the kept set, summing to 1, proportional to softmax inside."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    probs = target_probabilities(logits, SamplingParams(temperature=1.0, top_k=4, top_p=0.8))[0]
    assert probs[4:].tolist() == [0.0, 0.0]
    assert torch.isclose(probs.sum(), torch.tensor(1.0))
    full = torch.softmax(logits[0], -1)
    kept = probs > 0
    assert torch.allclose(probs[kept], full[kept] / full[kept].sum())


# -- the block ledger -------------------------------------------------------------------------------------
def test_truncate_frees_only_the_blocks_past_the_accepted_tokens():
    """A request grown for proposals shrinks back: the blocks past its tokens are free again, the ledger sound;
    blocks registered in the prefix cache cannot be rolled back."""
    ledger = KVCacheManager(8, 4, prefix_caching=True)
    ledger.allocate("a", 5)
    ledger.append("a", 6)  # 11 tokens: 3 blocks
    table = ledger.block_table("a")
    assert ledger.truncate("a", 6) == 1 and ledger.block_table("a") == table[:2]
    assert ledger.num_free_blocks == 6 and ledger.num_tokens("a") == 6 and ledger.audit() == []
    ledger.cache_blocks("a", [b"h0"])
    with pytest.raises(ValueError, match="cached"):
        ledger.truncate("a", 3)
    ledger.free("a")


# -- through LLM ------------------------------------------------------------------------------------------
def test_greedy_tokens_equal_plain_decoding_in_a_mixed_batch(demo_llm, prompts, plain_tokens):
    """Eight prompts of mixed lengths in one batch, k = 4: the same tokens as plain decoding, proposals accepted."""
    llm = demo_llm(speculative="ngram", num_speculative_tokens=4)
    gained = accepted(llm, lambda: _check(llm.generate(prompts, GREEDY), plain_tokens))
    assert gained > 0, "the repetitive prompts were meant to get proposals accepted"


def _check(outputs, expected) -> None:
    assert [o.token_ids for o in outputs] == expected


def test_chunked_prefill_beside_verifying_decodes_keeps_tokens(demo_llm, prompts, plain_tokens):
    """A 12-token step budget: long prompts are prefilled in chunks while other requests verify proposals (which
    share the budget); every request keeps its plain tokens."""
    llm = demo_llm(speculative="ngram", num_speculative_tokens=6, max_num_batched_tokens=12)
    gained = accepted(llm, lambda: _check(llm.generate(prompts, GREEDY), plain_tokens))
    assert gained > 0


def test_preemption_with_proposals_in_flight_keeps_tokens(demo_llm, prompts, plain_tokens, monkeypatch):
    """A cache of 16 blocks of 4 tokens for eight requests forces preemptions while requests verify proposals."""
    bytes_per_token = demo_llm().runner.bytes_per_block // 16  # float32 blocks of the default 16 tokens
    llm = demo_llm(speculative="ngram", kv_cache_memory=bytes_per_token * 4 * 16, block_size=4)
    preemptions = []
    original = Scheduler._preempt
    monkeypatch.setattr(
        Scheduler, "_preempt", lambda self, r, plan: (preemptions.append(r.request_id), original(self, r, plan))
    )
    gained = accepted(llm, lambda: _check(llm.generate(prompts, GREEDY), plain_tokens))
    assert preemptions, "the budget was meant to force at least one preemption"
    assert gained > 0


def test_rejected_proposals_leave_no_stale_cache(demo_llm, prompts, plain_tokens):
    """After speculative batches (many proposals rejected), follow-up requests that reuse the freed blocks and the
    prefix cache equal their solo plain outputs; so does a prompt extended by its own speculative output."""
    llm = demo_llm(speculative="ngram", num_speculative_tokens=8, block_size=4)
    first = llm.generate(prompts, GREEDY)
    assert llm.stats().spec_draft_tokens > llm.stats().spec_accepted_tokens, "some proposals were meant to fail"
    _check(llm.generate(prompts[::-1], GREEDY), plain_tokens[::-1])
    extended = [p + o.token_ids for p, o in zip(prompts, first, strict=True)][:3]
    plain = demo_llm()
    expected = [plain.generate([p], GREEDY)[0].token_ids for p in extended]
    _check(llm.generate(extended, GREEDY), expected)


@pytest.mark.slow  # two rank processes load the model
def test_tensor_parallel_verifies_proposals_on_every_rank(demo_llm, prompts, plain_tokens):
    """Two tensor-parallel ranks: the verification rows are broadcast with the step like any chunk; same tokens."""
    llm = LLM(progress=False, dtype="float32", tensor_parallel_size=2, speculative="ngram")
    try:
        gained = accepted(llm, lambda: _check(llm.generate(prompts, GREEDY), plain_tokens))
    finally:
        llm.runner.shutdown()
    assert gained > 0


def test_prefix_caching_off_gives_the_same_tokens(demo_llm, prompts, plain_tokens):
    llm = demo_llm(speculative="ngram", enable_prefix_caching=False)
    _check(llm.generate(prompts, GREEDY), plain_tokens)


def test_max_tokens_eos_stop_strings_logprobs_and_streaming_as_plain(demo_llm):
    """Text prompts with stop strings and logprobs, generated and streamed: every field equals plain decoding's,
    never a token past max_tokens, EOS or the stop string."""
    plain, spec = demo_llm(), demo_llm(speculative="ngram", num_speculative_tokens=5)
    text = TEXTS * 2
    cases = [
        SamplingParams(max_tokens=7, temperature=0, logprobs=2),
        SamplingParams(max_tokens=60, temperature=0),
        SamplingParams(max_tokens=40, temperature=0, stop=("good", "R.")),
        SamplingParams(max_tokens=40, temperature=0, logprobs=1, stop=(" the",), ignore_eos=True),
    ]
    for params in cases:
        ours, theirs = spec.generate(text, params), plain.generate(text, params)
        for a, b in zip(ours, theirs, strict=True):
            assert (a.text, a.token_ids, a.finish_reason) == (b.text, b.token_ids, b.finish_reason)
            assert len(a.token_ids) <= params.max_tokens
            if params.logprobs is not None:
                assert a.logprobs is not None and b.logprobs is not None and len(a.logprobs) == len(a.token_ids)
                for x, y in zip(a.logprobs, b.logprobs, strict=True):
                    assert x.keys() == y.keys() and all(abs(x[t] - y[t]) < 1e-4 for t in x)
        assert _deltas(spec.stream(text, params)) == _deltas(plain.stream(text, params))
    assert spec.stats().spec_accepted_tokens > 0


def _deltas(stream) -> dict[int, list[tuple]]:
    """Each request's deltas in order (requests interleave differently when some steps give several tokens)."""
    per_request: dict[int, list[tuple]] = {}
    for d in stream:
        per_request.setdefault(d.index, []).append((d.token_id, d.text, d.finish_reason, d.logprobs is not None))
    return per_request


@pytest.fixture(scope="session")
def six_token_model(tmp_path_factory):
    """A tiny Llama over a 6-token vocabulary (EOS ignored), its weights small enough that sampling is spread."""
    folder = tmp_path_factory.mktemp("six-token-llama")
    return build_tiny_llama(folder, seed=3, vocab_size=6, initializer_range=0.05)


def test_seeded_sampling_with_speculation_follows_the_plain_distribution(six_token_model):
    """1200 seeded requests, 4 sampled tokens each, on a 6-token model with and without n-gram speculation: the
    marginal of every position agrees between the two (two-sample chi-square, 0.1% level), and proposals were
    verified and accepted along the way."""
    assert_sampling_follows_plain_decoding(six_token_model, {"speculative": "ngram", "num_speculative_tokens": 3})


def assert_sampling_follows_plain_decoding(model, speculation: dict, vocab_size: int = 6) -> None:
    """1200 seeded requests of 4 sampled tokens on `model` with and without `speculation` (LLM options): every
    position's marginal agrees (two-sample chi-square, 0.1% level), and proposals were both accepted and rejected."""
    prompt = [3, 4, 5, 3, 4, 5, 3, 4]
    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=seed, ignore_eos=True) for seed in range(1200)]
    columns = []
    for options in ({}, speculation):
        llm = LLM(model, progress=False, max_num_seqs=1200, **options)
        outputs = llm.generate([prompt] * len(params), params)
        columns.append([[o.token_ids[i] for o in outputs] for i in range(4)])
        stats = llm.stats()
    assert stats.spec_draft_tokens > 300 and 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens
    for position, (plain, spec) in enumerate(zip(*columns, strict=True)):
        a, b = [plain.count(t) for t in range(vocab_size)], [spec.count(t) for t in range(vocab_size)]
        statistic = sum((x - y) ** 2 / (x + y) for x, y in zip(a, b, strict=True) if x + y)
        dof = sum(1 for x, y in zip(a, b, strict=True) if x + y) - 1
        assert statistic < CHI2_999[dof], f"token {position}: plain {a} vs speculative {b}"


# -- arguments -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"speculative": "medusa"}, "'ngram' .* or an EAGLE-3 draft folder; got 'medusa'"),
        ({"speculative": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"speculative": "ngram", "num_speculative_tokens": 33}, "num_speculative_tokens"),
        ({"speculative": "ngram", "num_speculative_tokens": True}, "num_speculative_tokens"),
        ({"num_speculative_tokens": 3}, "needs speculative decoding"),
    ],
)
def test_bad_speculative_arguments_are_named(tiny_llama, options, named):
    with pytest.raises(EngineArgumentError, match=named):
        LLM(tiny_llama, progress=False, **options)


def test_run_speculative_prints_the_plain_text_and_its_acceptance_with_stats(capsys):
    """`kernelbay run --speculative ngram --num-speculative-tokens 3 --stats` prints plain decoding's text, and the
    acceptance on stderr; `--num-speculative-tokens` alone is exit 1 naming what is missing."""
    from kernelbay.cli import main

    base = ["run", "--prompt", TEXTS[0], "--max-tokens", "24", "--raw"]
    assert main(base) == 0
    plain = capsys.readouterr().out
    assert main([*base, "--speculative", "ngram", "--num-speculative-tokens", "3", "--stats"]) == 0
    captured = capsys.readouterr()
    assert captured.out == plain
    assert "speculative acceptance rate: " in captured.err and "mean accepted length: " in captured.err
    assert main([*base, "--num-speculative-tokens", "3"]) == 1
    assert "needs speculative decoding" in capsys.readouterr().err
