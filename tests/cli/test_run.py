"""`kernelbay run`: streams a completion; every bad input is a one-line error with its own exit code."""

from __future__ import annotations

import pytest

from kernelbay.engine.errors import EXIT_CODES

from .conftest import CONFIGS, run_cli

ERROR_PREFIX = "kernelbay run: error: "


def assert_error(result, exit_code: int, *fragments: str) -> None:
    assert result.returncode == exit_code, (result.returncode, result.stderr)
    assert result.stderr.startswith(ERROR_PREFIX), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)


def test_exit_codes_are_distinct():
    """Each bad-input class has its own exit code, none clashing with 0 (ok), 1 (other) or 2 (usage)."""
    codes = [code for name, code in EXIT_CODES.items() if name != "InputError"]
    assert len(set(codes)) == len(codes) and not {0, 1, 2} & set(codes)


def test_run_streams_the_completion(tiny_llama):
    """A good folder prints the greedy completion, the same text the API returns."""
    from kernelbay import LLM, SamplingParams

    result = run_cli("run", str(tiny_llama), "--prompt", "the quick brown", "--max-tokens", "8")
    assert result.returncode == 0, result.stderr
    expected = LLM(tiny_llama, progress=False).generate("the quick brown", SamplingParams(max_tokens=8,
                                                                                         temperature=0))[0]
    assert result.stdout == expected.text + "\n"


def test_run_defaults_to_the_embedded_demo():
    """Without MODEL, `kernelbay run` uses the checkpoint shipped inside the package."""
    result = run_cli("run", "--prompt", "A", "--max-tokens", "3")
    assert result.returncode == 0, result.stderr


def test_missing_folder(tmp_path):
    """A folder that does not exist: exit 3."""
    assert_error(run_cli("run", str(tmp_path / "nope"), "--prompt", "x"), 3, "does not exist")


def test_folder_without_config(bad_folders):
    """A folder with no config.json: exit 4, naming the file."""
    assert_error(run_cli("run", str(bad_folders["no_config"]), "--prompt", "x"), 4, "has no config.json")


def test_malformed_config(bad_folders):
    """config.json that is not JSON: exit 5 with line and column."""
    assert_error(run_cli("run", str(bad_folders["malformed"]), "--prompt", "x"), 5, "not valid JSON",
                 "line 3, column 21")


def test_unknown_architecture(bad_folders):
    """An architecture no plugin provides: exit 6, the registry's message with the known names."""
    assert_error(run_cli("run", str(bad_folders["unknown_arch"]), "--prompt", "x"), 6,
                 "Unknown architecture: 'NopeForCausalLM'", "LlamaForCausalLM")


def test_unknown_backend(tiny_llama):
    """A backend nobody installed: exit 7, listing the known ones and close matches."""
    assert_error(run_cli("run", str(tiny_llama), "--prompt", "x", "--backend", "SDPAA"), 7,
                 "Unknown attention backend: 'SDPAA'", "Did you mean: SDPA")


def test_incapable_backend():
    """A backend that cannot run the model (SDPA has no logit soft-capping, Gemma-2 needs it): exit 8,
    before any weight is read."""
    assert_error(run_cli("run", str(CONFIGS / "gemma-2-2b"), "--prompt", "x", "--backend", "SDPA"), 8,
                 "logit_softcap")


def test_missing_weights(bad_folders):
    """A folder with a config but no weight files: exit 9."""
    assert_error(run_cli("run", str(bad_folders["no_weights"]), "--prompt", "x"), 9, "no weights")


def test_partial_weights(bad_folders):
    """A checkpoint missing a tensor: exit 9, naming the tensor."""
    assert_error(run_cli("run", str(bad_folders["partial_weights"]), "--prompt", "x"), 9,
                 "model.layers.1.mlp.down_proj.weight")


def test_prompt_longer_than_context(tiny_llama):
    """A prompt beyond max_position_embeddings (128 here): exit 10."""
    assert_error(run_cli("run", str(tiny_llama), "--prompt", "the lazy dog " * 80), 10,
                 "model's context is 128 tokens")


@pytest.mark.parametrize("value", ["0", "-5"])
def test_non_positive_max_tokens(value):
    """--max-tokens 0 or negative: exit 11, before the model is loaded."""
    assert_error(run_cli("run", "--prompt", "x", "--max-tokens", value), 11, "max_tokens must be a positive integer")
