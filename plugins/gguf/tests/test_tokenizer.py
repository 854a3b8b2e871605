"""The tokenizer of a GGUF file: token for token what transformers' AutoTokenizer gives. A byte-level BPE
vocabulary is built by kernelbay_gguf.vocabulary (no transformers `models` import, no second parse); others by
the class AutoTokenizer would pick, without its second parse (kernelbay_gguf.format._tokenizer_class)."""

from __future__ import annotations

import sys

import gguf
import pytest
from kernelbay_gguf.format import _tokenizer_class
from kernelbay_gguf.vocabulary import PRE_TOKENIZER_SPLITS, is_byte_level
from transformers import AutoTokenizer

from kernelbay_engine.tokenizer import Tokenizer, TokenizerError
from plugins.gguf.tests._tiny import TINY_GGUF
from plugins.gguf.tests._write import add_byte_level_tokenizer, add_metadata
from tests._fresh import run_fresh
from tests.models.conftest import build_reference

TEXTS = [
    "the weather in winter",
    "  two  spaces\nand a newline",
    "Ünïcode ✓ 123",
    "tabs\t\tand\r\nCRLF   \n\n\n trailing   ",
    "emoji 👩\u200d💻, 中文 and العربية; 12345678",
    "<|im_start|>user\nhi<|im_end|><|endoftext|>",
    "don't I'LL we've x<think>y</think>",
    "Hello , world . it ' s",
    "",
]
CHAT = [{"role": "user", "content": "hi there"}]
CHATS = [
    CHAT,
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  two\n\nlines ✓ <think>"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
]
MISLABELLED = "<\uff5cmislabelled\uff5c>"  # fullwidth bars, as DeepSeek's control tokens are spelled
EXTRA_TOKENS = (
    ("<think>", gguf.TokenType.USER_DEFINED),
    ("</think>", gguf.TokenType.USER_DEFINED),
    (MISLABELLED, gguf.TokenType.CONTROL),  # outside the byte alphabet: not added (transformers' rule)
)


def _with_tokenizer(folder, name, **vocabulary):
    """A tiny model's metadata plus a byte-level vocabulary, no tensors: all a tokenizer reads."""
    arch, tiny = TINY_GGUF[name]
    folder.mkdir()
    writer = gguf.GGUFWriter(folder / "m.gguf", arch)
    add_metadata(writer, build_reference(name, tiny=tiny).config, arch, skip=("bos", "eos"))
    add_byte_level_tokenizer(writer, **vocabulary)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return folder / "m.gguf"


def assert_same_tokenizer(ours, theirs) -> None:
    """Equal vocabulary, merges, splitting, added tokens, special tokens and chat template, and equal ids and text
    over TEXTS and CHATS (each with and without special tokens)."""
    assert ours.backend_tokenizer.to_str() == theirs.backend_tokenizer.to_str()
    for attr in ("bos_token", "eos_token", "unk_token", "pad_token", "eos_token_id", "all_special_tokens"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert (ours.add_bos_token, ours.add_eos_token, ours.chat_template) == (
        theirs.add_bos_token,
        theirs.add_eos_token,
        theirs.chat_template,
    )
    for text in TEXTS:
        for special in (True, False):
            ids = ours(text, add_special_tokens=special)["input_ids"]
            assert ids == theirs(text, add_special_tokens=special)["input_ids"], (text, special)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    for chat in CHATS:
        rendered = ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert rendered == theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert (
            ours(rendered, add_special_tokens=False)["input_ids"]
            == theirs(rendered, add_special_tokens=False)["input_ids"]
        ), rendered


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "phi3", "qwen2moe"])
def test_tokenizer_is_what_autotokenizer_builds(tmp_path, name):
    """Per architecture: the byte-level vocabulary built by kernelbay_gguf.vocabulary equals AutoTokenizer's."""
    path = _with_tokenizer(tmp_path / name, name, extra_tokens=EXTRA_TOKENS)
    ours = Tokenizer(path).hf
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert_same_tokenizer(ours, theirs)
    for text in TEXTS:
        assert ours.decode(ours(text)["input_ids"]) == text  # byte-level: every text comes back as it was
    assert (ours.bos_token, ours.eos_token, ours.pad_token) == ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
    assert MISLABELLED not in ours.get_vocab()


@pytest.mark.parametrize("pre", ["gpt-2", "smollm", "qwen2", "llama-bpe", "gpt-4o", "tekken", "qwen35"])
@pytest.mark.parametrize("add_bos", [False, True])
def test_each_split_and_bos_flag_is_what_autotokenizer_builds(tmp_path, pre, add_bos):
    """Each split regex `tokenizer.ggml.pre` names (GPT-2's own for the others), with and without BOS added."""
    path = _with_tokenizer(tmp_path / "qwen3", "qwen3", pre=pre, add_bos=add_bos, extra_tokens=EXTRA_TOKENS)
    ours = Tokenizer(path).hf
    assert_same_tokenizer(ours, AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name))
    assert (ours("the")["input_ids"][0] == ours.bos_token_id) is add_bos


def test_only_a_byte_level_vocabulary_with_its_merges_is_built_here():
    """Sentencepiece ("llama") and a byte-level vocabulary without merges (transformers derives them from the
    scores) keep transformers' path."""
    merges = {"tokenizer.ggml.merges": 8}
    assert is_byte_level({"tokenizer.ggml.model": "gpt2", **merges})
    assert not is_byte_level({"tokenizer.ggml.model": "gpt2"})
    assert not is_byte_level({"tokenizer.ggml.model": "llama", **merges})


def test_the_split_table_is_transformers_own():
    """kernelbay_gguf.vocabulary holds transformers' table of split regexes (its module imports `models`)."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    assert PRE_TOKENIZER_SPLITS == GGUF_PRE_TOKENIZER_SPLITS


def test_smollm2_tokenizer_is_what_autotokenizer_builds(smollm2):
    """The real file's 49,152-token vocabulary and 48,900 merges, token for token."""
    theirs = _tokenizer_class(smollm2).from_pretrained(str(smollm2.parent), gguf_file=smollm2.name)
    assert_same_tokenizer(Tokenizer(smollm2).hf, theirs)


def test_a_byte_level_tokenizer_imports_no_transformers(tmp_path):
    """Building a GGUF file's byte-level tokenizer, encoding and rendering its chat template import no transformers
    (subprocess)."""
    path = _with_tokenizer(tmp_path / "llama", "llama")
    code = (
        f"from kernelbay_engine.tokenizer import Tokenizer; tokenizer = Tokenizer({str(path)!r}); "
        "assert tokenizer.encode('the weather'); assert tokenizer.encode_chat([{'role': 'user', 'content': 'hi'}])"
    )
    run_fresh(code, absent=["transformers"])


@pytest.mark.parametrize(
    "template, what",
    [
        ("{{ raise_exception('the first message must be the system') }}", "the first message must be the system"),
        ("{{ messages.__class__.__mro__ }}", "SecurityError"),  # the sandbox: it reaches no Python object
        ("{% for m in messages %}", "TemplateSyntaxError"),
    ],
)
def test_a_failing_chat_template_names_the_file_and_its_key(tmp_path, template, what):
    path = _with_tokenizer(tmp_path / "llama", "llama", chat_template=template)
    with pytest.raises(TokenizerError, match=what) as caught:
        Tokenizer(path).encode_chat(CHAT)
    assert str(path) in str(caught.value) and "the file's tokenizer.chat_template" in str(caught.value)


def test_a_folder_declaring_its_tokenizer_class_is_left_to_autotokenizer(tmp_path):
    """tokenizer_config.json beside the file names the class: AutoTokenizer's choice, not the model type's."""
    path = _with_tokenizer(tmp_path / "qwen3", "qwen3")
    (path.parent / "tokenizer_config.json").write_text('{"tokenizer_class": "TokenizersBackend"}')
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert type(Tokenizer(path).hf) is type(theirs)
    assert type(theirs).__name__ == "TokenizersBackend"  # Qwen2Tokenizer by the model type alone


def test_the_vocabulary_is_built_without_garbage_collections(smollm2):
    """SmolLM2's 48,900 merges are read and handed to `tokenizers` with the cyclic collector paused (a full collection
    walks all of torch's and transformers' objects: 0.09 s), and it runs again afterwards."""
    import gc

    from kernelbay_gguf import vocabulary

    during_build = []

    def count(phase, info):
        frame = sys._getframe(1)
        while frame is not None and frame.f_code is not vocabulary._backend.__code__:
            frame = frame.f_back
        during_build.append(frame is not None)

    gc.callbacks.append(count)
    try:
        tokenizer = Tokenizer(smollm2)
    finally:
        gc.callbacks.remove(count)
    assert not any(during_build) and gc.isenabled()
    assert tokenizer.decode(tokenizer.encode("the weather")) == "the weather"
