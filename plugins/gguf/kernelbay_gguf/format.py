"""`GGUFFormat`: the `gguf` weight format (entry point `kernelbay.weight_formats: gguf`).

One file carries the config (`config_dict`, read by the core's ModelConfig), the tokenizer and
chat template (`tokenizer`, built by transformers' GGUF support) and the tensors (`open`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from gguf import GGUFReader, GGUFValueType

from kernelbay.errors import MalformedConfig
from kernelbay_engine.loading import CheckpointError, CheckpointFormat
from kernelbay_engine.tokenizer import TokenizerError
from kernelbay_gguf.metadata import architecture, config_dict
from kernelbay_gguf.tensors import GGUFSource

_FIX = "the file is truncated or not a GGUF model: re-download it"


@functools.lru_cache(maxsize=4)
def _reader(path: Path, size: int, mtime: int) -> GGUFReader:
    """One parse per file version (config, tokenizer and tensors all ask); the data stays memory-mapped."""
    return GGUFReader(path, "c")  # copy-on-write: mapped tensors are writable, the file never changes


def read_gguf(path: Path, error: type[Exception] = CheckpointError) -> GGUFReader:
    """The parsed file, or `error` naming it and what is wrong."""
    try:
        stat = path.stat()
        return _reader(path, stat.st_size, stat.st_mtime_ns)
    except (ValueError, OSError, KeyError, IndexError, TypeError) as err:  # what GGUFReader raises on bad bytes
        raise error(f"{path} is not a readable GGUF file ({type(err).__name__}: {err}); {_FIX}") from None


def metadata(reader: GGUFReader) -> dict[str, Any]:
    """key -> value; an array is given as its length (tokenizer vocabularies are large, never needed here)."""
    values: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if field.types and field.types[0] == GGUFValueType.ARRAY:
            values[key] = len(field.data)
        elif not key.startswith("GGUF."):
            values[key] = field.contents()
    return values


class GGUFFormat(CheckpointFormat):
    name = "gguf"

    @classmethod
    def config_dict(cls, path: Path) -> dict[str, Any]:
        reader = read_gguf(path, MalformedConfig)
        return config_dict(metadata(reader), {t.name for t in reader.tensors}, str(path))

    @classmethod
    def open(cls, path: Path, *, allow_pickle: bool = False) -> GGUFSource:
        reader = read_gguf(path)
        fields = metadata(reader)
        name, arch = architecture(fields, str(path))
        heads = None
        if arch.permuted_qk:
            n_head = fields[f"{name}.attention.head_count"]
            heads = (n_head, fields.get(f"{name}.attention.head_count_kv", n_head))
        return GGUFSource(path, reader, heads)

    @classmethod
    def has_tokenizer(cls, path: Path) -> bool:
        return "tokenizer.ggml.tokens" in read_gguf(path, TokenizerError).fields

    @classmethod
    def tokenizer(cls, path: Path):
        """transformers' tokenizer built from the file's vocabulary, merges, special tokens and chat template."""
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception as err:  # transformers raises anything on an unexpected vocabulary layout
            raise TokenizerError(
                f"the tokenizer in {path} cannot be built ({type(err).__name__}: {err}); "
                f"pass prompts as lists of token ids, or use a folder with tokenizer.json"
            ) from err
