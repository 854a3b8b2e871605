"""A folder's tokenizer is built with the config the engine already parsed (AutoTokenizer would parse config.json
again with its class: LlamaConfig's import alone is ~0.9 s), and is the same tokenizer as AutoTokenizer's own."""

from __future__ import annotations

import shutil

import pytest

from kernelbay_engine.config import ModelConfig
from kernelbay_engine.inputs import demo_model_folder
from kernelbay_engine.tokenizer import Tokenizer, _names_its_class
from tests._fresh import run_fresh

from .models._files import copy_json

TEXTS = ["Hello there", "  two  spaces, then\nnew lines\tand tabs", "ünïcödé and 数字 123", ""]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]


def _same(a: Tokenizer, b: Tokenizer) -> None:
    assert type(a.hf) is type(b.hf)
    assert a.eos_token_ids == b.eos_token_ids and a.has_chat_template == b.has_chat_template
    assert a.hf.all_special_tokens == b.hf.all_special_tokens
    for text in TEXTS:
        ids = a.encode(text)
        assert ids == b.encode(text)
        assert a.hf.decode(ids) == b.hf.decode(ids)
    if a.has_chat_template:
        assert a.encode_chat(CHAT) == b.encode_chat(CHAT)


def _folder_copy(tmp_path, **changes):
    """The demo's config and tokenizer files, with tokenizer_config.json's keys changed (None deletes one)."""
    folder = tmp_path / "model"
    shutil.copytree(demo_model_folder(), folder, ignore=shutil.ignore_patterns("eagle3", "*.safetensors"))
    return copy_json(folder, folder, "tokenizer_config.json", changes)


def test_the_parsed_config_builds_the_tokenizer_autotokenizer_builds():
    folder = demo_model_folder()
    assert _names_its_class(folder, trust_remote_code=False)
    config = ModelConfig.from_pretrained(folder).hf_config
    _same(Tokenizer(folder, config=config), Tokenizer(folder))


@pytest.mark.parametrize(
    ("changes", "trust"),
    [
        ({"tokenizer_class": None}, False),  # no class named: the config's model type picks it
        ({"auto_map": {"AutoTokenizer": ["tok.Tok", None]}}, False),  # remote code reads the folder's config
        ({}, True),
    ],
)
def test_autotokenizer_reads_the_folder_itself_unless_the_class_is_named(tmp_path, changes, trust):
    folder = _folder_copy(tmp_path, **changes)
    assert not _names_its_class(folder, trust_remote_code=trust)


def test_an_unnamed_class_is_still_the_same_tokenizer(tmp_path):
    folder = _folder_copy(tmp_path, tokenizer_class=None)
    config = ModelConfig.from_pretrained(folder).hf_config
    _same(Tokenizer(folder, config=config), Tokenizer(folder))


def test_a_run_on_a_llama_folder_imports_no_llama_config_class():
    """LLM on the demo (a Llama folder with its tokenizer) and a generation: LlamaConfig's module (and its import
    chain down to torch.distributed.tensor) is never imported (subprocess)."""
    code = (
        "from kernelbay_engine import LLM, SamplingParams\n"
        "out = LLM(progress=False).generate(['Hello'], SamplingParams(max_tokens=4, temperature=0))\n"
        "assert out[0].text, out\n"
    )
    run_fresh(code, absent=["transformers.models.llama.configuration_llama", "torch.distributed.tensor"])
