"""`kernelbay run --logprobs K`: after the text, one line per generated token with its log-probability and the K
most likely tokens, the numbers the API's SamplingParams(logprobs=K) gives."""

from __future__ import annotations

import pytest

from tests.cli.conftest import run_cli, without_notices


@pytest.mark.parametrize("k", [0, 3])
def test_run_prints_each_tokens_logprobs(tiny_llama, make_llm, k):
    """Greedy, 4 tokens: stdout is the text alone; stderr a header and 4 lines whose token and log-probability
    (and, for K > 0, the K most likely) are the API's."""
    from kernelbay_engine import SamplingParams

    done = run_cli("run", str(tiny_llama), "--prompt", "the quick brown", "--max-tokens", "4", "--logprobs", str(k))
    assert done.returncode == 0, done.stderr
    expected = make_llm().generate("the quick brown", SamplingParams(max_tokens=4, temperature=0, logprobs=k))[0]
    assert done.stdout == expected.text + "\n"
    header, *lines = without_notices(done.stderr).splitlines()
    assert header.startswith("logprobs: each generated token's") and len(lines) == 4
    tokenizer = make_llm().tokenizer
    for position, (line, token, entry) in enumerate(zip(lines, expected.token_ids, expected.logprobs, strict=True)):
        fields = line.split()
        assert fields[0] == str(position) and repr(tokenizer.decode([token])) in line
        assert f"{entry[token]:9.4f}".strip() in fields
        assert ("top:" in line) == (k > 0) and line.count(" | ") == max(k - 1, 0)


def test_logprobs_beyond_the_limit_is_an_error():
    """--logprobs past SamplingParams' limit: one error line naming logprobs, before the model loads."""
    done = run_cli("run", "--prompt", "x", "--logprobs", "100000")
    stderr = without_notices(done.stderr)
    assert done.returncode == 11 and stderr.startswith("kernelbay run: error:") and "logprobs" in stderr, stderr
