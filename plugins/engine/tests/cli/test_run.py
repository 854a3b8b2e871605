"""`kernelbay run`: streams a completion; every bad input is a one-line error with its own exit code."""

from __future__ import annotations

import pytest

from kernelbay_engine.errors import EXIT_CODES
from tests.cli.conftest import without_notices

ERROR_PREFIX = "kernelbay run: error: "


def assert_error(result, exit_code: int, *fragments: str) -> None:
    stderr = without_notices(result.stderr)
    assert result.returncode == exit_code, (result.returncode, result.stderr)
    assert stderr.startswith(ERROR_PREFIX), result.stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in stderr, (fragment, result.stderr)


def test_exit_codes_are_distinct():
    """Each bad-input class has its own exit code, none clashing with 0 (ok), 1 (other) or 2 (usage)."""
    codes = [code for name, code in EXIT_CODES.items() if name != "InputError"]
    assert len(set(codes)) == len(codes) and not {0, 1, 2} & set(codes)


def test_run_streams_the_completion(cli_runs, tiny_llama):
    """A good folder prints the greedy completion, the same text the API returns."""
    from kernelbay_engine import LLM, SamplingParams

    result = cli_runs["good"]
    assert result.returncode == 0, result.stderr
    expected = LLM(tiny_llama, progress=False).generate("the quick brown", SamplingParams(max_tokens=8, temperature=0))[
        0
    ]
    assert result.stdout == expected.text + "\n"


def test_run_defaults_to_the_embedded_demo(cli_runs):
    """Without MODEL, `kernelbay run` uses the checkpoint shipped inside the package."""
    assert cli_runs["demo"].returncode == 0, cli_runs["demo"].stderr


def test_run_in_float16(cli_runs):
    """`--dtype float16`: the native ops that take only float32 / bfloat16 leave it to aten's path."""
    result = cli_runs["demo_float16"]
    assert result.returncode == 0 and without_notices(result.stderr) == "", result.stderr
    assert result.stdout.strip()


@pytest.mark.parametrize(
    "case, exit_code, fragments",
    [
        ("missing_folder", 3, ["does not exist"]),
        ("no_config", 4, ["has no config.json"]),
        ("malformed", 5, ["not valid JSON", "line 3, column 21"]),
        ("unknown_arch", 6, ["Unknown architecture: 'NopeForCausalLM'", "LlamaForCausalLM"]),
        ("unknown_backend", 7, ["Unknown attention backend: 'SDPAA'", "Did you mean: SDPA"]),
        ("incapable_backend", 8, ["requested attention backend SDPA cannot run", "logit_softcap"]),
        ("no_weights", 9, ["no weights"]),
        ("partial_weights", 9, ["model.layers.1.mlp.down_proj.weight"]),
        ("prompt_too_long", 10, ["model's context is 128 tokens"]),
        ("max_tokens_zero", 11, ["max_tokens must be a positive integer"]),
        ("max_tokens_negative", 11, ["max_tokens must be a positive integer"]),
        ("unknown_backend_option", 1, ["problem(s) in the attention options", "SDPA.nope is not an option"]),
        ("malformed_backend_option", 1, ["--backend-option 'SDPA' is not of the form NAME.KEY=VALUE"]),
    ],
)
def test_bad_input_is_a_clear_error(cli_runs, case, exit_code, fragments):
    """Each bad input: one `error:` message naming the problem and its own exit code, no traceback.

    missing folder 3, no config.json 4, malformed JSON 5 (line, column), unknown architecture 6,
    unknown backend 7, incapable backend 8 (Gemma-2 needs soft-capping, SDPA lacks it; refused before
    weights are read), missing or partial weights 9 (naming the tensor), prompt beyond the context 10,
    max_tokens <= 0 11 (refused before the model loads), an unknown or malformed --backend-option 1.
    """
    assert_error(cli_runs[case], exit_code, *fragments)
