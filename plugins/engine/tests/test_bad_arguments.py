"""Wrongly typed API arguments and bad `kernelbay run` options: an InputError / SamplingParamsError naming the
argument (exit-coded on the command line), never an internal TypeError/AttributeError nor a silent coercion."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernelbay.errors import InputError
from kernelbay_engine import SamplingParams
from kernelbay_engine.tokenizer import check_prompt_text
from tests.cli.conftest import run_cli, without_notices

ONE = SamplingParams(max_tokens=1, temperature=0)


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm(max_num_seqs=2)


@pytest.mark.parametrize(
    "ids, match",
    [
        ([1.5, 2], r"token id 0 of the prompt is 1\.5 \(float\)"),
        ([1.0, 2], r"token id 0 of the prompt is 1\.0 \(float\)"),
        ([3, True], r"token id 1 of the prompt is True \(bool\)"),
        (["a"], r"token id 0 of the prompt is 'a' \(str\)"),
        ([None], r"token id 0 .* \(NoneType\)"),
        (np.array([1.0, 2.0]), r"\(float\)"),
        (torch.tensor([True, False]), r"\(bool\)"),
        (np.zeros((1, 1, 2), dtype=np.int64), "must be 1-D"),
    ],
)
def test_non_integer_token_ids_are_refused_not_rounded(llm, ids, match):
    """Float, bool, str or None ids (list, numpy, torch) are an InputError naming the position."""
    with pytest.raises(InputError, match=match):
        llm.encode(ids)


@pytest.mark.parametrize("prompts", [None, 5, b"bytes", {"prompt": "x"}])
def test_prompts_of_the_wrong_type_are_an_input_error(llm, prompts):
    """generate(None / 5 / bytes / dict) is an InputError naming `prompts` and the accepted forms."""
    with pytest.raises(InputError, match="prompts must be"):
        llm.generate(prompts, ONE)


def test_numpy_and_torch_integer_id_arrays_are_accepted(llm):
    """A 1-D integer numpy array or torch tensor is one prompt of ids; a 2-D array is one prompt per row."""
    expected = llm.generate([[5, 6, 7]], ONE)[0].token_ids
    for prompt in (np.array([5, 6, 7]), torch.tensor([5, 6, 7]), np.array([5, 6, 7], dtype=np.int32)):
        assert llm.generate(prompt, ONE)[0].token_ids == expected
    assert [o.token_ids for o in llm.generate(np.array([[5, 6, 7], [5, 6, 7]]), ONE)] == [expected, expected]


@pytest.mark.parametrize(
    "params, match",
    [
        ({"max_tokens": 2}, "sampling_params must be a SamplingParams.*got dict"),
        ("greedy", "got str"),
        (3, "got int"),
        ([ONE, 3], "holds a int, not a SamplingParams"),
    ],
)
def test_sampling_params_of_the_wrong_type_are_an_input_error(llm, params, match):
    """A dict (or str, int, a list holding a non-SamplingParams) names sampling_params (was AttributeError)."""
    with pytest.raises(InputError, match=match):
        llm.generate([[1, 2], [1, 2]] if isinstance(params, list) else [[1, 2]], params)


@pytest.mark.parametrize("text", ["a\udcffb", "\ud800", "ok \udfff"])
def test_lone_surrogates_in_a_prompt_are_an_input_error(text):
    """Text with a lone surrogate is an InputError naming the character, not the tokenizer's TypeError."""
    with pytest.raises(InputError, match=r"not valid Unicode text.*lone surrogate"):
        check_prompt_text(text)


def test_lone_surrogate_through_llm_encode(llm):
    """LLM.encode refuses the text before the tokenizer sees it."""
    with pytest.raises(InputError, match="lone surrogate"):
        llm.encode("bad \udcff text")


@pytest.mark.parametrize(
    "args, code, needle",
    [
        (["--kv-cache-memory", "0"], 1, "--kv-cache-memory: memory must be positive"),
        (["--kv-cache-memory=-5MiB"], 1, "--kv-cache-memory: cannot read memory size '-5MiB'"),
        (["--kv-cache-memory", "2XB"], 1, "--kv-cache-memory: cannot read memory size '2XB'"),
        (["--kv-cache-memory", "nan"], 1, "--kv-cache-memory"),
        (["--kv-cache-memory", "10TiB"], 1, "kv_cache_memory=10995116277760 bytes cannot be allocated"),
        (["--kv-cache-memory", "1KiB"], 12, "holds no KV-cache block"),
        (["--temperature", "1e-40"], 11, "temperature must be a finite number >= 0: 0 (greedy) or at least"),
        (["--temperature", "1", "--seed", str(2**64)], 11, "seed must be an integer from 0 to 2**64 - 1"),
        (["--temperature", "1", "--seed", "-1"], 11, "seed must be an integer from 0 to 2**64 - 1"),
        (["--prompt", "bad \udcff"], 1, "lone surrogate"),
    ],
)
def test_bad_run_options_are_one_line_with_the_documented_code(args, code, needle):
    """Bad `kernelbay run` memory, temperature, seed and prompt values: one error line, exit 1/11/12."""
    prompt = [] if "--prompt" in args else ["--prompt", "hi"]
    result = run_cli("run", *prompt, "--max-tokens", "2", *args)
    stderr = without_notices(result.stderr)
    assert "Traceback" not in stderr, stderr[-2000:]
    assert result.returncode == code and stderr.startswith("kernelbay run: error:"), result.stderr
    assert needle in stderr
