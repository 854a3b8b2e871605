"""Architectures whose configs kernelbay-llama reads but builds no model for: the error says why, by name.

Run with the native plugins only: an installed fallback provider (kernelbay-transformers) may claim any
architecture, and what it says is its own tests' business."""

from __future__ import annotations

import pytest

from tests.cli.conftest import CONFIGS, run_cli

NATIVE_ONLY = {"KERNELBAY_PLUGINS": "kernelbay,kernelbay-engine,kernelbay-torch,kernelbay-llama"}
UNSUPPORTED_ARCHITECTURE = 6  # docs/engine.md exit codes


def explain_natively(folder) -> tuple[int, str]:
    result = run_cli("explain", str(folder), env=NATIVE_ONLY)
    return result.returncode, result.stderr


@pytest.mark.parametrize(
    ("folder", "family"),
    [("llama-3-3-nemotron-super-49b-v1", "Nemotron-NAS (DeciLM)"), ("phi-3-small-8k-instruct", "Phi-3-small")],
)
def test_explain_says_why_there_is_no_model(folder, family):
    """No transformers implementation to test against: explain exits 6 naming the family and that reason."""
    code, err = explain_natively(CONFIGS / folder)
    assert code == UNSUPPORTED_ARCHITECTURE, err
    assert f"{family} is not built: transformers has no implementation" in err, err


def test_multimodal_gemma3_is_refused_naming_the_text_model(tmp_path):
    """Gemma3ForConditionalGeneration: no vision encoder, so explain refuses it and points at Gemma3ForCausalLM."""
    import transformers

    config = transformers.Gemma3Config(text_config={"num_hidden_layers": 6})
    config.architectures = ["Gemma3ForConditionalGeneration"]
    config.save_pretrained(tmp_path)
    code, err = explain_natively(tmp_path)
    assert code == UNSUPPORTED_ARCHITECTURE, err
    assert "multimodal Gemma 3 is not built" in err and "Gemma3ForCausalLM (model_type gemma3_text" in err, err
