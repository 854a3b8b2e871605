"""The tokenizer of a GGUF file: the class and behaviour transformers' AutoTokenizer gives, built without its
second parse of the file (kernelbay_gguf.format._tokenizer_class)."""

from __future__ import annotations

import gguf
import pytest
from kernelbay_gguf.format import _tokenizer_class
from transformers import AutoTokenizer

from kernelbay_engine.tokenizer import Tokenizer
from plugins.gguf.tests._tiny import TINY_GGUF
from plugins.gguf.tests._write import add_byte_level_tokenizer, add_metadata
from tests.models.conftest import build_reference

TEXTS = ["the weather in winter", "  two  spaces\nand a newline", "Ünïcode ✓ 123"]
CHAT = [{"role": "user", "content": "hi there"}]


def _with_tokenizer(folder, name):
    """A tiny model's metadata plus a byte-level vocabulary, no tensors: all a tokenizer reads."""
    arch, tiny = TINY_GGUF[name]
    folder.mkdir()
    writer = gguf.GGUFWriter(folder / "m.gguf", arch)
    add_metadata(writer, build_reference(name, tiny=tiny).config, arch, skip=("bos", "eos"))
    add_byte_level_tokenizer(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return folder / "m.gguf"


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "phi3", "qwen2moe"])
def test_tokenizer_is_what_autotokenizer_builds(tmp_path, name):
    path = _with_tokenizer(tmp_path / name, name)
    ours = Tokenizer(path).hf
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert type(ours) is type(theirs)
    assert _tokenizer_class(path) is type(theirs)  # the class itself, not AutoTokenizer and its second parse
    for text in TEXTS:
        assert ours(text)["input_ids"] == theirs(text)["input_ids"], text
        assert ours.decode(ours(text)["input_ids"]) == text
    assert ours.apply_chat_template(CHAT, add_generation_prompt=True) == theirs.apply_chat_template(
        CHAT, add_generation_prompt=True
    )
    assert ours.all_special_tokens == theirs.all_special_tokens
    assert (ours.bos_token, ours.eos_token, ours.pad_token) == ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


def test_a_folder_declaring_its_tokenizer_class_is_left_to_autotokenizer(tmp_path):
    """tokenizer_config.json beside the file names the class: AutoTokenizer's choice, not the model type's."""
    path = _with_tokenizer(tmp_path / "qwen3", "qwen3")
    (path.parent / "tokenizer_config.json").write_text('{"tokenizer_class": "TokenizersBackend"}')
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert type(Tokenizer(path).hf) is type(theirs)
    assert type(theirs).__name__ == "TokenizersBackend"  # Qwen2Tokenizer by the model type alone
