"""The config read from GGUF metadata equals the one transformers reads from the same file."""

from __future__ import annotations

import dataclasses
import json

import pytest
import transformers

from kernelbay.cli import main
from kernelbay_engine.config import ModelConfig
from plugins.gguf.tests._tiny import TINY_GGUF
from plugins.gguf.tests._write import write_gguf
from tests.models._tiny import COMMON, Tiny
from tests.models.conftest import build_reference

IGNORED = ("notes", "source", "hf_config")  # provenance, not geometry


def _fields(config: ModelConfig) -> dict:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in IGNORED}


def _transformers_config(path) -> ModelConfig:
    return ModelConfig.from_hf_config(transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name))


@pytest.mark.parametrize("name", sorted(TINY_GGUF))
def test_config_from_metadata_equals_transformers(tiny_gguf, name):
    """Every resolved field (sizes, heads, rope, eps, tying, dtype, layer kinds) as transformers sees the file."""
    path = tiny_gguf(name)
    ours = ModelConfig.from_pretrained(path)
    assert _fields(ours) == _fields(_transformers_config(path))
    assert ours.source == str(path)


def test_a_folder_holding_one_gguf_is_the_model(tiny_gguf):
    """No config.json beside it: the folder resolves to its one .gguf file."""
    path = tiny_gguf("llama")
    assert ModelConfig.from_pretrained(path.parent).source == str(path)


def test_explain_reads_a_gguf_file(tiny_gguf, capsys):
    """`kernelbay explain x.gguf` prints the document for the file's model."""
    path = tiny_gguf("qwen3")
    assert main(["explain", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["architectures"] == ["Qwen3ForCausalLM"]
    assert doc["config"]["head_dim"] == 128


@pytest.mark.slow
def test_smollm2_config_equals_transformers(smollm2):
    """The real file: 30 layers, hidden 576, 9/3 heads, tied embeddings, rope theta 100000."""
    ours = ModelConfig.from_pretrained(smollm2)
    assert _fields(ours) == _fields(_transformers_config(smollm2))
    assert (ours.num_hidden_layers, ours.hidden_size, ours.num_attention_heads, ours.num_key_value_heads) == (
        30,
        576,
        9,
        3,
    )
    assert ours.tie_word_embeddings and ours.rope.theta == 100000.0


def test_mixtral_config_equals_the_source_model(tmp_path):
    """A llama file with experts is Mixtral (transformers reads it as a dense Llama, so the source is the reference;
    its eps a power of two, which GGUF's float32 key holds exactly)."""
    config = transformers.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=2.0**-16)
    source = build_reference("mixtral", tiny=Tiny("mixtral-8x7b", lambda: config))
    path = write_gguf(tmp_path / "model.gguf", source, "llama")
    ours = ModelConfig.from_pretrained(path)
    assert _fields(ours) == _fields(ModelConfig.from_hf_config(source.config))
    assert ours.moe.num_experts == 4 and ours.moe.top_k == 2
