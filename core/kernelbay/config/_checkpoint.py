"""What a checkpoint's safetensors headers say (names, shapes, dtypes), read without loading a tensor.

Used only as evidence for keys config.json leaves out; the weights themselves are the loader's business.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from functools import cached_property
from pathlib import Path

from ..errors import ConfigError

INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit
FLOAT_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


class Checkpoint:
    """The safetensors files of a model folder: tensor name -> (file, dtype, shape), headers read lazily."""

    def __init__(self, folder: Path):
        self.folder = folder

    @cached_property
    def files(self) -> list[Path]:
        index = self.folder / INDEX_FILE
        if index.is_file():
            weight_map = _read_json(index).get("weight_map") or {}
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise ConfigError(f"{index}: weight_map must be a JSON object mapping tensor names to shard files.")
            return [self.folder / name for name in sorted(set(weight_map.values()))]
        return sorted(self.folder.glob("*.safetensors"))

    @cached_property
    def tensors(self) -> dict[str, dict]:
        """name -> {"dtype": "BF16", "shape": [...]} over every file (only headers are read)."""
        found: dict[str, dict] = {}
        for file in self.files:
            found.update({k: v for k, v in read_header(file).items() if k != "__metadata__"})
        return found

    def has_weights(self) -> bool:
        return bool(self.files)

    def find(self, suffix: str) -> tuple[str, dict] | None:
        """The first tensor (by name) whose name ends with `suffix`."""
        for name in sorted(self.tensors):
            if name.endswith(suffix):
                return name, self.tensors[name]
        return None

    def float_dtype(self) -> str | None:
        """The floating dtype most tensors are stored in ("bfloat16", ...), None if none is."""
        counts = Counter(FLOAT_DTYPES[t["dtype"]] for t in self.tensors.values() if t.get("dtype") in FLOAT_DTYPES)
        return counts.most_common(1)[0][0] if counts else None


def read_header(file: Path) -> dict:
    """The JSON header of one .safetensors file."""
    try:
        with file.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > MAX_HEADER_BYTES:
                raise ConfigError(f"{file}: safetensors header claims {length} bytes; the file is corrupt.")
            header = json.loads(handle.read(length))
    except (OSError, struct.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{file}: not a readable safetensors file ({exc}).") from None
    if not isinstance(header, dict):
        raise ConfigError(f"{file}: safetensors header is not a JSON object.")
    return header


def _read_json(file: Path) -> dict:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{file} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{file} must hold a JSON object.")
    return data
