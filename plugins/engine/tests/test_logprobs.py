"""SamplingParams(logprobs=k, prompt_logprobs=k) against log_softmax of transformers' logits."""

from __future__ import annotations

import pytest
import torch

from kernelbay_engine.errors import SamplingParamsError
from kernelbay_engine.sampling import MAX_LOGPROBS, SamplingParams

PROMPTS = [[1, 5, 9, 22, 7, 3, 8, 90, 4, 17, 33, 12, 6], [2, 30], [11, 12, 13, 14, 15, 16, 40]]
TOLERANCE = 1e-4


def _reference(hf_model, ids: list[int]) -> torch.Tensor:
    """log_softmax of transformers' logits at every position of `ids`: [len(ids), vocab]."""
    with torch.no_grad():
        return torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)


def _check_entry(entry: dict[int, float], expected: torch.Tensor, k: int, actual: int, where: str) -> None:
    """Top-k ids of the reference, plus the actual token; every value within TOLERANCE."""
    top = set(expected.topk(k).indices.tolist()) if k else set()
    assert set(entry) == top | {actual}, f"{where}: ids {sorted(entry)} != top-{k} {sorted(top)} + {actual}"
    for token, value in entry.items():
        assert abs(value - expected[token].item()) <= TOLERANCE, f"{where}: token {token} {value} vs {expected[token]}"


@pytest.mark.parametrize("chunk", [2048, 5], ids=["whole-prompts", "chunked-prefill"])
def test_prompt_and_sampled_logprobs_equal_log_softmax_of_reference(make_llm, hf_tiny_llama, chunk):
    """A mixed-length batch, greedy: every prompt position after the first and every generated token."""
    llm = make_llm(max_num_batched_tokens=chunk, max_num_seqs=4)
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=3, prompt_logprobs=2)
    for prompt, out in zip(PROMPTS, llm.generate(PROMPTS, params), strict=True):
        expected = _reference(hf_tiny_llama, prompt + out.token_ids)
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
        for p in range(1, len(prompt)):
            _check_entry(out.prompt_logprobs[p], expected[p - 1], 2, prompt[p], f"prompt position {p}")
        assert len(out.logprobs) == len(out.token_ids)
        for i, token in enumerate(out.token_ids):
            _check_entry(out.logprobs[i], expected[len(prompt) + i - 1], 3, token, f"generated token {i}")


def test_zero_alternatives_reports_only_the_actual_token(make_llm):
    """k = 0: one entry per position, the token that is there; sampled tokens stay drawn as usual."""
    params = SamplingParams(max_tokens=4, temperature=0.8, seed=3, logprobs=0, prompt_logprobs=0)
    out = make_llm().generate([PROMPTS[1]], params)[0]
    assert [list(e) for e in out.logprobs] == [[t] for t in out.token_ids]
    assert list(out.prompt_logprobs[1]) == [PROMPTS[1][1]]


def test_without_the_options_outputs_carry_none(make_llm):
    out = make_llm().generate([PROMPTS[1]], SamplingParams(max_tokens=2, temperature=0))[0]
    assert out.logprobs is None and out.prompt_logprobs is None


@pytest.mark.parametrize("value", [-1, MAX_LOGPROBS + 1, True, 1.5, "3"])
@pytest.mark.parametrize("name", ["logprobs", "prompt_logprobs"])
def test_bad_logprobs_count_is_refused_by_name(name, value):
    with pytest.raises(SamplingParamsError, match=rf"{name} must be None or an integer from 0 to {MAX_LOGPROBS}"):
        SamplingParams(**{name: value})
