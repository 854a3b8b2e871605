"""SamplingParams validation and the sampler: greedy argmax, top-k/top-p support, seeded reproducibility."""

from __future__ import annotations

import pytest
import torch

from kernelbay_engine.sampling import Sampler, SamplingParams, SamplingParamsError, make_generator, sample_row


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(max_tokens=0), "max_tokens must be a positive integer"),
        (dict(max_tokens=-3), "max_tokens must be a positive integer"),
        (dict(max_tokens=2.5), "max_tokens"),
        (dict(temperature=-0.1), "temperature must be a finite number >= 0"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k must be an integer >= 0"),
        (dict(seed="x"), "seed must be an integer"),
        (dict(stop=("",)), "stop must be non-empty strings"),
    ],
)
def test_invalid_params_are_rejected(bad, match):
    """Every out-of-range parameter is an error naming it and its valid range."""
    with pytest.raises(SamplingParamsError, match=match):
        SamplingParams(**bad)


def test_all_problems_reported_together():
    """Two bad parameters are both named in one error."""
    with pytest.raises(SamplingParamsError, match=r"max_tokens.*top_p"):
        SamplingParams(max_tokens=0, top_p=2.0)


def test_stop_accepts_a_single_string():
    """stop="x" is normalised to a one-element tuple."""
    assert SamplingParams(stop="\n").stop == ("\n",)


def test_greedy_is_argmax():
    """temperature 0 picks the arg-max of each row."""
    logits = torch.tensor([[0.1, 3.0, 0.2], [5.0, 1.0, 0.0]])
    params = [SamplingParams(temperature=0)] * 2
    assert Sampler()(logits, params, [None, None]) == [1, 0]


def test_top_k_one_is_greedy():
    """top_k=1 leaves only the most likely token, whatever the temperature."""
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    p = SamplingParams(temperature=2.0, top_k=1, seed=3)
    assert all(sample_row(logits, p, make_generator(p)) == int(logits.argmax()) for _ in range(5))


def test_top_p_keeps_only_the_nucleus():
    """With top_p=0.5 and one token holding 90% of the mass, only that token is ever drawn."""
    logits = torch.tensor([5.0, 2.0, 1.0, 0.0])
    p = SamplingParams(temperature=1.0, top_p=0.5, seed=0)
    gen = make_generator(p)
    assert {sample_row(logits, p, gen) for _ in range(50)} == {0}


def test_seeded_draws_are_reproducible_and_independent_of_batch():
    """Same seed -> same draws, alone or next to another sampled row."""
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(1))
    p = SamplingParams(temperature=1.0, seed=7)
    alone = [Sampler()(logits[:1], [p], [g])[0] for g in [make_generator(p)] for _ in range(10)]
    g1, g2 = make_generator(p), make_generator(SamplingParams(temperature=1.0, seed=8))
    batched = [Sampler()(logits[[0, 1]], [p, p], [g1, g2])[0] for _ in range(10)]
    assert alone == batched
    assert len(set(alone)) > 1, "temperature 1 over 40 tokens should vary across draws"


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(temperature=1e-40), r"temperature must be a finite number >= 0: 0 \(greedy\) or at least 0.0001"),
        (dict(temperature=True), "temperature"),
        (dict(top_p=True), "top_p"),
        (dict(seed=2**64), r"seed must be an integer from 0 to 2\*\*64 - 1"),
        (dict(seed=-1), r"seed must be an integer from 0 to 2\*\*64 - 1"),
        (dict(stop=5), "stop must be a string, a list of strings or None, got 5"),
        (dict(stop=b"x"), "stop must be a string"),
        (dict(ignore_eos="no"), "ignore_eos must be True or False"),
    ],
)
def test_values_that_used_to_crash_sampling_or_be_coerced_are_rejected(bad, match):
    """Tiny temperatures, out-of-range seeds, bad stop/ignore_eos types are a SamplingParamsError naming them."""
    with pytest.raises(SamplingParamsError, match=match):
        SamplingParams(**bad)


def test_stop_none_means_no_stop_strings():
    """stop=None is accepted explicitly and means the default: no stop strings."""
    assert SamplingParams(stop=None).stop == ()


@pytest.mark.parametrize("seed", [0, 2**63, 2**64 - 1])
def test_seeds_across_the_whole_64_bit_range_sample(seed):
    """Every accepted seed makes a generator (2**64 - 1 included) and the smallest temperature samples finitely."""
    params = SamplingParams(temperature=1e-4, seed=seed)
    logits = torch.tensor([30.0, 29.0, -5.0])
    assert sample_row(logits, params, make_generator(params)) == 0
