"""Weight formats are plugins (`kernelbay.weight_formats`): safetensors here, GGUF in kernelbay-gguf.

A format is a class registered under its name, which is also the suffix of its files (`x.gguf` ->
`gguf`). A folder is opened by `safetensors` (its pickle opt-in included); a file by the format its
suffix names. What a format's `open` returns is a `WeightSource`: the loader needs nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch


class TensorReader(Protocol):
    """Open while a model loads: fills parameters from the source, one tensor at a time."""

    def mapped(self, name: str, dtype: torch.dtype) -> torch.Tensor | None:
        """The tensor as a view of the file in `dtype`, or None when it must be read (cast, fused, quantized)."""

    def read_into(self, name: str, dest: torch.Tensor) -> None:
        """Fill `dest` (same shape) with the tensor's values, cast to dest's dtype."""


class WeightSource(Protocol):
    """Every tensor of a checkpoint by its Hugging Face name (what model families' NameRules expect).

    A source whose tensors keep a stored dtype may also answer `dtype(name) -> torch.dtype`: the loader then
    refuses integer or bool tensors where the model holds floats (a format that dequantizes as it reads has none).
    """

    folder: Path  # the folder or file it was opened from (for messages)

    @property
    def names(self) -> list[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def nbytes_of(self, name: str) -> int:
        """Bytes of the tensor as stored (what the progress bar counts)."""

    def in_file_order(self, names: Iterable[str]) -> list[str]: ...

    def reader(self) -> AbstractContextManager[TensorReader]: ...


class CheckpointFormat:
    """The protocol a `kernelbay.weight_formats` entry point names (`module:Class`).

    `config_dict(path) -> dict` (optional: formats that carry their config, read by the core's
    ModelConfig; with `config_is_complete(path) -> bool` answering True, that dict is all the model reads and is held
    in transformers' generic PretrainedConfig, the model type's class not imported), `stored_tensors(folder)`
    (optional: name -> (dtype, shape), the evidence ModelConfig reads for keys config.json leaves out) and
    `tokenizer(path)` (optional: a transformers tokenizer from the file).
    """

    name: ClassVar[str]

    @classmethod
    def open(cls, path: Path, *, allow_pickle: bool = False) -> WeightSource:
        raise NotImplementedError


class SafetensorsFormat(CheckpointFormat):
    """A Hugging Face folder: model.safetensors, sharded with an index, or (opt-in) pickle."""

    name = "safetensors"

    @classmethod
    def open(cls, path: Path, *, allow_pickle: bool = False) -> WeightSource:
        from kernelbay_engine.loading.checkpoint import open_folder

        return open_folder(path, allow_pickle=allow_pickle)

    @classmethod
    def stored_tensors(cls, folder: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
        """name -> (dtype, shape) from the safetensors headers alone; {} when the folder has no such files."""
        from kernelbay_engine.loading.checkpoint import safetensors_entries

        entries = safetensors_entries(folder) or {}
        return {name: (str(e.dtype).removeprefix("torch."), e.shape) for name, e in entries.items()}


def format_for(path: Path) -> Any:
    """The weight-format class that opens `path`: a folder's is safetensors, a file's is named by its suffix."""
    from kernelbay_engine.config import weight_format_class

    return weight_format_class(path)


def open_checkpoint(path: str | Path, *, allow_pickle: bool = False) -> WeightSource:
    """Index the weights at `path` (a folder or a weight file) through its weight-format plugin."""
    path = Path(path)
    return format_for(path).open(path, allow_pickle=allow_pickle)
