"""`WeightFileConfig`: a config a weight file's format read whole from the file (`config_is_complete`), held as
transformers' generic `PretrainedConfig` would hold it, without importing transformers (~0.5 s and ~18 MiB of a
GGUF run, which needs nothing else of it).

The format wrote every field kernelbay reads (no class default adds one), so the engine reads the fields as they
are: `to_dict()` gives them back, each is an attribute, `model_type` and `architectures` among them. Where a part of
kernelbay needs transformers' own view (the transformers fallback's modeling code, a class signature), it asks
`typed_hf_config` / `_llama.is_llama_parse`, which treat this as the generic class's parse it stands for.
plugins/gguf/tests/test_config.py holds the ModelConfig built from it equal to the one built from transformers' own
parse of the same file (`AutoConfig.from_pretrained(folder, gguf_file=...)`) for every GGUF architecture.
"""

from __future__ import annotations

import copy
from typing import Any


class WeightFileConfig:
    """The fields a weight file's format read, as attributes and as `to_dict()` (a copy each time)."""

    model_type: str  # set with the other fields
    name_or_path = ""  # not read from a folder: transformers' remote code is never looked for
    attribute_map: dict[str, str] = {}  # noqa: RUF012  # no legacy spellings: the format wrote today's names

    def __init__(self, fields: dict[str, Any]):
        if not isinstance(fields.get("model_type"), str):
            raise ValueError(f"a weight file's config needs a 'model_type', got {fields!r:.200}")
        vars(self).update(copy.deepcopy(fields))

    def to_dict(self) -> dict[str, Any]:
        """The fields as they are now (a copy), as PretrainedConfig's to_dict reads its attributes."""
        return copy.deepcopy(vars(self))

    def get_text_config(self, decoder: bool | None = None, encoder: bool | None = None) -> WeightFileConfig:
        """Itself: a weight file's model is text-only (transformers' answer for a config without parts)."""
        return self

    def __repr__(self) -> str:
        return f"WeightFileConfig({vars(self)!r})"
