"""A byte-level BPE tokenizer (`tokenizer.ggml.model` "gpt2": SmolLM2, Qwen, Llama 3 files) built with the
`tokenizers` library straight from the file's metadata, as transformers' GGUF support builds it, without its
cost: transformers' GGUF tokenizer code imports its `models` package (~0.4 s) and parses the whole metadata
again; transformers itself is not imported (kernelbay_engine.backend_tokenizer holds it as its class does).
Tokens, merges and token types are read by kernelbay's header reader; the rest of the recipe (byte-level
respelling, control and user-defined tokens, the split regex named by `tokenizer.ggml.pre`) is transformers'
`integrations/gguf/gguf_tokenizer_mapping.py`, tested equal to it token for token.

Other tokenizer models (sentencepiece "llama", "t5", Gemma's) keep transformers' path (format.py).
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from kernelbay_engine.backend_tokenizer import BackendTokenizer
from kernelbay_gguf.header import read_arrays

BYTE_LEVEL_MODEL = "gpt2"  # tokenizer.ggml.model of a byte-level BPE vocabulary
_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types (gguf.TokenType)
_SPECIAL_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}
_FLAGS = {"add_bos_token": "tokenizer.ggml.add_bos_token", "add_eos_token": "tokenizer.ggml.add_eos_token"}
_TEMPLATE = "tokenizer.chat_template"

# How text is split before the merges, by `tokenizer.ggml.pre` (transformers' GGUF_PRE_TOKENIZER_SPLITS, held
# here because its module imports transformers' `models` package; a test holds the two tables equal).
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)
_QWEN35 = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
        _LLAMA3,
    ),
    "dbrx": _LLAMA3,
    "smaug-bpe": _LLAMA3,
    "tekken": _TEKKEN,
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2),
    "qwen35": _QWEN35,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O),
}


def is_byte_level(metadata: dict[str, Any]) -> bool:
    """True when the file's vocabulary is byte-level BPE with its merges listed, which `byte_level_tokenizer`
    builds (without merges transformers derives them from the token scores: its path)."""
    return metadata.get("tokenizer.ggml.model") == BYTE_LEVEL_MODEL and "tokenizer.ggml.merges" in metadata


def byte_level_tokenizer(path: Path, metadata: dict[str, Any], positions: Mapping[str, int]) -> BackendTokenizer:
    """The file's byte-level BPE vocabulary with its special tokens, BOS/EOS flags and chat template, as transformers'
    `TokenizersBackend` holds them (`BackendTokenizer`: no transformers import) (`metadata`: the file's parsed header,
    arrays given as lengths; `positions`: where its arrays lie, so they are read without walking the header again)."""
    with _collection_paused():
        arrays = read_arrays(path, _ARRAYS, positions, metadata)
        tokens = arrays["tokenizer.ggml.tokens"]
        backend = _backend(tokens, arrays["tokenizer.ggml.merges"], arrays.get("tokenizer.ggml.token_type", []))
    _split_by(backend, metadata.get("tokenizer.ggml.pre"))
    special = {name: tokens[metadata[key]] if key in metadata else None for name, key in _SPECIAL_IDS.items()}
    flags = {name: bool(metadata[key]) for name, key in _FLAGS.items() if key in metadata}
    return BackendTokenizer(backend, special_tokens=special, chat_template=metadata.get(_TEMPLATE), **flags)


@contextmanager
def _collection_paused() -> Iterator[None]:
    """No cyclic garbage collection while the vocabulary is read and handed to `tokenizers`: the merges' ~49,000
    pairs (tuples, freed when `_backend` returns; no cycles among them) set off Python's collector, and a full
    collection walks every object of torch and transformers (one cost 0.09 s of SmolLM2's 0.17 s build). Resumed
    as it was."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _backend(tokens: list[str], merges: list[str], token_types: list[int]):
    """BPE over the vocabulary respelled in the byte alphabet, as transformers' GPT2Tokenizer builds it, with the
    control tokens added as special and the user-defined ones (`<think>`) as plain added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    spelling = _byte_spelling()
    alphabet = set(spelling.values())
    vocab = _respelled(tokens, spelling, alphabet)
    pairs = cast(list[tuple[str, str]], [tuple(merge.split(" ")) for merge in merges])  # BPE refuses others
    model = BPE(vocab, pairs, dropout=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    backend = Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    kinds = list(zip(tokens, token_types, strict=False))  # a file may list no token types
    # a control token spelled outside the byte alphabet is a converter's mislabel: adding it would grow the vocabulary
    control = [t for t, kind in kinds if kind == _CONTROL and set(t) <= alphabet]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    user_defined = [t for t, kind in kinds if kind == _USER_DEFINED and t in vocab]
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user_defined])
    return backend


def _respelled(tokens: list[str], spelling: dict[int, str], alphabet: set[str]) -> dict[str, int]:
    """token -> id, each token spelled in the byte alphabet (one spelled otherwise respelled from its UTF-8 bytes).
    A converter writes them all in it already, which one look at every character tells (SmolLM2's 49,152: 11 ms
    where a test per token took 28 ms)."""
    if set("".join(tokens)) <= alphabet:
        return {token: index for index, token in enumerate(tokens)}
    return {
        token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8")): index
        for index, token in enumerate(tokens)
    }


def _split_by(backend, pre: str | None) -> None:
    """The split regex `tokenizer.ggml.pre` names, before the byte-level step; GPT-2's own split for any other."""
    from tokenizers import Regex, pre_tokenizers

    split = PRE_TOKENIZER_SPLITS.get(pre or "")
    if split is not None:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )


@functools.cache
def _byte_spelling() -> dict[int, str]:
    """GPT-2's byte -> printable character table (transformers' `bytes_to_unicode`)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))
