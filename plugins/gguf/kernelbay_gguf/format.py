"""`GGUFFormat`: the `gguf` weight format (entry point `kernelbay.weight_formats: gguf`).

One file carries the config (`config_dict`, read by the engine's ModelConfig), the tokenizer and
chat template (`tokenizer`: vocabulary.py for byte-level BPE, transformers' GGUF support for others) and the
tensors (`open`). A byte-level file of an architecture whose config is complete runs without transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernelbay.errors import MalformedConfig
from kernelbay_engine.loading import CheckpointFormat
from kernelbay_engine.tokenizer import TokenizerError
from kernelbay_gguf.metadata import architecture, config_dict
from kernelbay_gguf.parsed import open_source, read_gguf, release_free_heap
from kernelbay_gguf.tensors import GGUFSource
from kernelbay_gguf.vocabulary import byte_level_tokenizer, is_byte_level


def _tokenizer_class(path: Path):
    """The class `AutoTokenizer.from_pretrained(folder, gguf_file=...)` builds for this file, found from the model
    type kernelbay already parsed: AutoTokenizer finds it by parsing the file's metadata again (a second full parse,
    ~3 s of SmolLM2's 7 s load, for a model type transformers' fast GGUF reader does not map). A folder declaring
    its own class (tokenizer_config.json) or a Mistral-format tokenizer is left to AutoTokenizer, which decides."""
    import transformers
    from transformers import AutoTokenizer

    model_type = architecture(read_gguf(path, TokenizerError).metadata, str(path))[1].model_type
    if (path.parent / "tokenizer_config.json").exists():
        return AutoTokenizer
    name = _tokenizer_class_name(model_type)
    return AutoTokenizer if name in (None, "MistralCommonBackend") else getattr(transformers, name)


def _tokenizer_class_name(model_type: str) -> str | None:
    """AutoTokenizer's own lookup (`TOKENIZER_MAPPING[config class]`) by names alone, so the config class is not
    imported (LlamaConfig's import chain costs ~0.9 s): the model type holding the config class's name, else one
    sharing it that has a tokenizer, else TokenizersBackend; None where transformers knows neither (AutoTokenizer
    decides) or maps the type to no class."""
    from transformers.models.auto.auto_mappings import CONFIG_MAPPING_NAMES
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    config_name = CONFIG_MAPPING_NAMES.get(model_type)
    if config_name is None:
        return None
    sharing = [t for t, name in CONFIG_MAPPING_NAMES.items() if name == config_name]
    owner = sharing[-1]  # transformers' reverse table keeps the last model type of a config class
    for candidate in (owner, *sharing):
        if candidate in TOKENIZER_MAPPING_NAMES:
            return TOKENIZER_MAPPING_NAMES[candidate]
    return "TokenizersBackend"


class GGUFFormat(CheckpointFormat):
    name = "gguf"

    @classmethod
    def config_dict(cls, path: Path) -> dict[str, Any]:
        parsed = read_gguf(path, MalformedConfig)
        return config_dict(parsed.metadata, {t.name for t in parsed.tensors}, str(path))

    @classmethod
    def config_is_complete(cls, path: Path) -> bool:
        """True when `config_dict` holds every field kernelbay reads for the file's architecture (no default of
        transformers' config class adds one), so the engine holds it without importing that class."""
        return architecture(read_gguf(path, MalformedConfig).metadata, str(path))[1].complete_config

    @classmethod
    def open(cls, path: Path, *, allow_pickle: bool = False) -> GGUFSource:
        return open_source(path)

    @classmethod
    def has_tokenizer(cls, path: Path) -> bool:
        return read_gguf(path, TokenizerError).has_tokenizer

    @classmethod
    def tokenizer(cls, path: Path):
        """The tokenizer built from the file's vocabulary, merges, special tokens and chat template: a byte-level BPE
        vocabulary by kernelbay_gguf.vocabulary (no second parse, no transformers import), any other (sentencepiece,
        or a folder whose tokenizer_config.json names the class) by transformers."""
        parsed = read_gguf(path, TokenizerError)
        try:
            if is_byte_level(parsed.metadata) and not (path.parent / "tokenizer_config.json").exists():
                tokenizer = byte_level_tokenizer(path, parsed.metadata, parsed.arrays)
            else:
                tokenizer = _tokenizer_class(path).from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception as err:  # transformers raises anything on an unexpected vocabulary layout
            raise TokenizerError(
                f"the tokenizer in {path} cannot be built ({type(err).__name__}: {err}); "
                f"pass prompts as lists of token ids, or use a folder with tokenizer.json"
            ) from err
        release_free_heap()  # transformers parses the whole file's metadata into Python objects to build it
        return tokenizer

    @classmethod
    def keep_quantized(cls, model, path: Path) -> dict[str, str]:
        """Switch a model loaded from `path` to quantized kernels by the rule of kernelbay_gguf.quantized (the
        file's Q8_0/Q4_0/Q4_1/Q4_K codes, other quantized types requantized to int8 groups of 32); returns,
        per linear layer, what it runs or why it keeps float weights."""
        from kernelbay_gguf.quantized import keep_quantized

        return keep_quantized(model, path)

    @classmethod
    def load_quantized(cls, path: Path, *, progress: bool | None = None, moe_backend: str | None = None):
        """(model, report): keep_quantized's result without building float weights first (the quantized
        linears are made from the file's codes before the rest loads; kernelbay_gguf.quantized.load_quantized)."""
        from kernelbay_gguf.quantized import load_quantized

        return load_quantized(path, progress=progress, moe_backend=moe_backend)

    @classmethod
    def keep_quantized_shard(cls, model, path: Path, rules, sources) -> dict[str, str]:
        """Tensor parallelism: keep_quantized's forms for one rank's model (on meta), read from its share of each
        tensor only (`sources`: the engine's sharding pass; kernelbay_gguf.sharded)."""
        from kernelbay_gguf.sharded import keep_quantized_shard

        return keep_quantized_shard(model, path, rules, sources)

    @classmethod
    def shard_problems(cls, model, path: Path, rules, sources) -> list[str]:
        """Why a rank's share of the file's codes cannot be kept (a split that cuts a tensor's blocks); [] if none."""
        from kernelbay_gguf.sharded import shard_problems

        return shard_problems(model, path, rules, sources)

    @classmethod
    def shard_forms(cls, model, path: Path, rules, sources) -> dict:
        """quantized_forms for one rank's model (on meta, sharded: `sources`); nothing is read but the header."""
        from kernelbay_gguf.sharded import shard_forms

        return shard_forms(model, path, rules, sources)

    @classmethod
    def quantized_forms(cls, model, path: Path) -> dict:
        """What keep_quantized would make of each linear of `model` (built on meta: nothing is read):
        layer path -> a record with bits, group_size and source, or the reason it keeps float weights."""
        from kernelbay_gguf.quantized import forms

        return forms(model, path)
