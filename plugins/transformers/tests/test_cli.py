"""`kernelbay explain / plugins / run` name the fallback where it serves, in a fresh interpreter each."""

from __future__ import annotations

import json

import pytest
import transformers

from plugins.engine.tests.checkpoints import train_tokenizer
from tests.cli.conftest import REPO, run_cli
from tests.models._tiny import COMMON

from ._tiny import TINY_FALLBACK

FALLBACK = "kernelbay_transformers.modeling (kernelbay-transformers 0.1.0, fallback)"
pytestmark = pytest.mark.slow  # a fresh interpreter per command (torch, transformers): seconds each


@pytest.fixture(scope="module")
def olmo2(tiny_checkpoints):
    return str(tiny_checkpoints.get("olmo2", TINY_FALLBACK["olmo2"])[0])


def test_explain_names_the_fallback_where_it_serves(olmo2):
    """No native OLMo-2: explain names kernelbay-transformers as the provider, and why; --json says the same."""
    done = run_cli("explain", olmo2)
    assert done.returncode == 0, done.stderr
    assert f"provider     {FALLBACK}" in done.stdout
    assert "the fallback serves: no native implementation installed" in done.stdout
    doc = json.loads(run_cli("explain", olmo2, "--json").stdout)
    assert (doc["provider"]["origin"], doc["provider"]["distribution"]) == ("fallback", "kernelbay-transformers")


def test_without_the_fallback_the_architecture_is_unknown(olmo2):
    """Disabled (or --model-impl native): the usual unknown-architecture error, exit 6."""
    for env, extra in (({"KERNELBAY_DISABLE_PLUGINS": "kernelbay-transformers"}, ()), ({}, ("--model-impl", "native"))):
        done = run_cli("explain", olmo2, *extra, env=env)
        assert done.returncode == 6, (env, extra, done.stdout, done.stderr)
        assert "Olmo2ForCausalLM" in done.stderr


def test_model_impl_transformers_on_a_native_architecture(tiny_checkpoints):
    """--model-impl transformers on Llama: the fallback serves, the native family is named as displaced."""
    folder = tiny_checkpoints.get("llama3")[0]
    done = run_cli("explain", str(folder), "--model-impl", "transformers")
    assert done.returncode == 0, done.stderr
    assert f"provider     {FALLBACK}" in done.stdout
    assert "although a native implementation is installed" in done.stdout
    assert "displaces kernelbay_llama.modeling" in done.stdout


def test_run_and_explain_give_one_reason_for_model_impl_transformers():
    """--model-impl transformers on the (Llama) demo: run's warning and explain's note give the same reason,
    naming the native provider that is installed (never "no native implementation installed")."""
    reason = (
        "model_impl='transformers', although a native implementation is installed "
        "(kernelbay_llama.modeling (kernelbay-llama 0.1.0, built-in))"
    )
    run = run_cli("run", "--prompt", "A", "--max-tokens", "2", "--model-impl", "transformers")
    assert run.returncode == 0, run.stderr
    assert f"LlamaForCausalLM runs on the fallback provider {FALLBACK}: {reason}" in run.stderr
    demo = str(REPO / "plugins/engine/kernelbay_engine/demo")
    explain = run_cli("explain", demo, "--model-impl", "transformers")
    assert f"the fallback serves: {reason}" in explain.stdout


def test_an_external_provider_wins_over_the_fallback(tiny_checkpoints):
    """A custom dir providing OLMo (external) takes the architecture; the fallback stays out of it."""
    folder = tiny_checkpoints.get("olmo", TINY_FALLBACK["olmo"])[0]
    done = run_cli("explain", str(folder), "--custom-module-dirs", str(REPO / "examples/custom_models/olmo"))
    assert done.returncode == 0, done.stderr
    assert "custom-dir" in done.stdout.split("provider", 1)[1].splitlines()[0]
    assert "fallback" not in done.stdout


def test_refused_architecture_exits_6_with_the_reason(tmp_path):
    """A state-space model: exit 6 (unsupported architecture), the reason on stderr."""
    config = transformers.MambaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=96)
    config.architectures = ["MambaForCausalLM"]
    config.save_pretrained(tmp_path)
    done = run_cli("explain", str(tmp_path))
    assert done.returncode == 6 and "recurrent or state-space layers" in done.stderr, done.stderr


def test_plugins_lists_what_the_fallback_covers():
    """`kernelbay plugins` says what the fallback's "*" slot covers (without importing it)."""
    done = run_cli("plugins")
    assert done.returncode == 0, done.stderr
    assert "covers any architecture transformers implements, where no other installed plugin provides it" in done.stdout


def test_run_streams_from_the_fallback_and_says_so(tmp_path):
    """`kernelbay run` on an OLMo-2 folder with a tokenizer: text on stdout, the provider named on stderr."""
    train_tokenizer(tmp_path)
    model = transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**{**COMMON, "vocab_size": 320}))
    model.save_pretrained(tmp_path)
    done = run_cli("run", str(tmp_path), "--prompt", "the quick", "--max-tokens", "4")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    assert "Olmo2ForCausalLM runs on the fallback provider kernelbay_transformers.modeling" in done.stderr
    assert "no native implementation installed" in done.stderr
