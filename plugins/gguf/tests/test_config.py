"""The config read from GGUF metadata equals the one transformers reads from the same file."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import transformers

from kernelbay.cli import main
from kernelbay_engine.config import ModelConfig
from plugins.gguf.tests._tiny import TINY_GGUF
from plugins.gguf.tests._write import write_gguf
from tests._fresh import run_fresh
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


@pytest.mark.parametrize("name", sorted(TINY_GGUF))
def test_a_complete_config_is_held_without_its_class(tiny_gguf, name):
    """Where the file's fields are all the model reads, the config holds them as they are (`WeightFileConfig`: no
    transformers class, not even the generic one, is imported; test_config_from_metadata_equals_transformers holds
    the result equal to the class's parse) and the native family reads the same features from it as from the class;
    elsewhere (Gemma's query_pre_attn_scalar, ...) the class parses it."""
    from kernelbay_gguf.metadata import ARCHITECTURES

    from kernelbay_engine.config._file_config import WeightFileConfig
    from kernelbay_engine.models.auto import resolve_model

    path = tiny_gguf(name)
    ours, theirs = ModelConfig.from_pretrained(path), _transformers_config(path)
    held = isinstance(ours.hf_config, WeightFileConfig)
    assert held is ARCHITECTURES[TINY_GGUF[name][0]].complete_config
    family = resolve_model(ours, "native")
    assert resolve_model(theirs, "native") is family
    if hasattr(family, "features"):
        assert family.features(ours) == family.features(theirs)
    assert ours.hf_config.eos_token_id == theirs.hf_config.eos_token_id


def test_the_transformers_fallback_builds_from_a_complete_config(tiny_gguf):
    """model_impl="transformers" parses the generic config again with the model type's class, and runs the file."""
    from kernelbay_engine.config import read_config_json, typed_hf_config
    from kernelbay_engine.llm import LLM
    from kernelbay_engine.sampling import SamplingParams

    path = tiny_gguf("llama")
    typed = typed_hf_config(ModelConfig.from_pretrained(path).hf_config)
    assert type(typed) is transformers.LlamaConfig
    raw = read_config_json(path)[1]
    assert (
        typed.to_dict()
        == transformers.LlamaConfig.from_dict({k: v for k, v in raw.items() if k != "model_type"}).to_dict()
    )
    greedy = SamplingParams(temperature=0, max_tokens=6)

    def tokens(**options) -> list[int]:
        return LLM(path, max_num_seqs=1, quantization="none", **options).generate([[1, 2, 3]], greedy)[0].token_ids

    assert tokens(model_impl="transformers") == tokens()


def test_reading_a_llama_file_imports_no_llama_config_class(tiny_gguf):
    """A Llama GGUF's config and tokenizer class come without transformers' LlamaConfig, whose import chain (its
    type validators -> activations -> torch.distributed.tensor) costs ~0.9 s and ~57 MiB (subprocess)."""
    code = (
        "import sys; from pathlib import Path; from kernelbay_engine.config import ModelConfig; "
        "from kernelbay_gguf.format import _tokenizer_class; "
        f"path = Path({str(tiny_gguf('llama'))!r}); ModelConfig.from_pretrained(path); _tokenizer_class(path); "
        "loaded = [m for m in ('transformers.models.llama.configuration_llama', 'torch.distributed.tensor') "
        "if m in sys.modules]; assert not loaded, loaded"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_running_a_gguf_file_imports_no_transformers(tiny_gguf, name):
    """LLM on a GGUF file whose metadata is its whole config builds, loads and generates without importing
    transformers (~0.5 s and ~18 MiB): no config class, not even the generic one, and no config table (subprocess)."""
    code = (
        "from kernelbay_engine import LLM, SamplingParams; "
        f"llm = LLM({str(tiny_gguf(name))!r}, max_num_seqs=1); "
        "assert llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2))[0].token_ids"
    )
    run_fresh(code, absent=["transformers"])
