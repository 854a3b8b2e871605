"""The fallback against plain transformers: architectures with no native family, and a natively served Llama."""

from __future__ import annotations

import pytest

from kernelbay_engine import AutoModelForCausalLM
from kernelbay_transformers.modeling import TransformersForCausalLM
from tests.models._parity import BACKENDS, compare_generation, runner

from ._tiny import TINY_FALLBACK


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(TINY_FALLBACK))
def test_logits_and_greedy_tokens_match_transformers(loaded, name, backend):
    """Prefill of four prompts of different lengths plus 8 decode steps: logits within 1e-4, same tokens."""
    hf_model, model = loaded(name, TINY_FALLBACK[name])
    assert isinstance(model, TransformersForCausalLM), "no native family: the fallback serves it"
    compare_generation(hf_model, runner(model, backend), f"{name} {backend}")


def test_sliding_layers_get_their_window(loaded):
    """Mixed layers: each transformers attention module's kernelbay layer has the kind and window of its index."""
    _, model = loaded("olmo3", TINY_FALLBACK["olmo3"])
    layers = model.attention_layers()
    assert [layers[str(i)].geometry.sliding_window for i in range(3)] == [5, None, 5]
    kinds = [layers[str(i)].attn_type.value for i in range(3)]
    assert kinds == ["sliding_attention", "full_attention", "sliding_attention"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_impl_transformers_on_llama_matches_native(tiny_checkpoints, backend):
    """A natively served Llama, forced onto the fallback: same logits (1e-4) and tokens as transformers and native."""
    folder, hf_model = tiny_checkpoints.get("llama3")
    fallback = AutoModelForCausalLM.from_pretrained(folder, progress=False, model_impl="transformers")
    native = AutoModelForCausalLM.from_pretrained(folder, progress=False)
    assert isinstance(fallback, TransformersForCausalLM) and not isinstance(native, TransformersForCausalLM)
    compare_generation(hf_model, runner(fallback, backend), f"llama3 fallback {backend}")
    compare_generation(hf_model, runner(native, backend), f"llama3 native {backend}")


REMOTE_CONFIG = """from transformers import Olmo2Config


class MyOlmoConfig(Olmo2Config):
    model_type = "my_olmo"
"""
REMOTE_MODEL = """from transformers import Olmo2ForCausalLM

from .configuration_mine import MyOlmoConfig


class MyOwnForCausalLM(Olmo2ForCausalLM):
    config_class = MyOlmoConfig
"""


def test_trusted_remote_code_is_served(tiny_checkpoints, tmp_path, monkeypatch):
    """A folder whose own code (auto_map) implements the model runs on the fallback only with
    trust_remote_code=True, and then matches transformers like a native transformers class."""
    import json
    import shutil

    from kernelbay.errors import ConfigError
    from tests._remote_code import isolate_remote_code

    isolate_remote_code(monkeypatch, tmp_path / "hf_modules")
    tmp_path = tmp_path / "model"
    tmp_path.mkdir()

    source, hf_model = tiny_checkpoints.get("olmo2", TINY_FALLBACK["olmo2"])
    shutil.copy(source / "model.safetensors", tmp_path)
    config = json.loads((source / "config.json").read_text())
    config.update(
        model_type="my_olmo",
        architectures=["MyOwnForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_mine.MyOlmoConfig",
            "AutoModelForCausalLM": "modeling_mine.MyOwnForCausalLM",
        },
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "configuration_mine.py").write_text(REMOTE_CONFIG)
    (tmp_path / "modeling_mine.py").write_text(REMOTE_MODEL)
    with pytest.raises(ConfigError, match="trust-remote-code"):  # untrusted, the folder's config code never runs
        AutoModelForCausalLM.from_pretrained(tmp_path, progress=False)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, progress=False, trust_remote_code=True)
    assert isinstance(model, TransformersForCausalLM)
    compare_generation(hf_model, runner(model, "SDPA"), "remote-code olmo2 SDPA")
