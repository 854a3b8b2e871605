"""Finding a checkpoint's weight files: one safetensors file, a sharded set with an index, or (opt-in) pickle."""

from __future__ import annotations

import json
import mmap
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernelbay.errors import KernelbayError
from kernelbay_engine.loading.safetensors_file import TensorEntry, read_index, read_into

SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt")


class CheckpointError(KernelbayError, ValueError):
    """The checkpoint folder's weights are absent, inconsistent or in a refused format."""


@dataclass
class Checkpoint:
    """Every tensor of a checkpoint by name, readable one at a time into a destination tensor."""

    folder: Path
    entries: dict[str, TensorEntry] = field(default_factory=dict)
    pickled: dict[str, torch.Tensor] = field(default_factory=dict)  # only with allow_pickle

    @property
    def names(self) -> list[str]:
        return [*self.entries, *self.pickled]

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values()) + sum(
            t.numel() * t.element_size() for t in self.pickled.values()
        )

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name].shape if name in self.entries else tuple(self.pickled[name].shape)

    def in_file_order(self, names) -> list[str]:
        """Names sorted by (file, offset): sequential reads, no seeking back and forth."""

        def key(n):
            e = self.entries.get(n)
            return (str(e.path), e.start) if e else ("", 0)

        return sorted(names, key=key)

    def reader(self) -> CheckpointReader:
        return CheckpointReader(self)


class CheckpointReader:
    """Context manager keeping each shard open while its tensors are read."""

    def __init__(self, checkpoint: Checkpoint):
        self.checkpoint = checkpoint
        self._stack = ExitStack()
        self._files: dict[Path, object] = {}
        self._maps: dict[Path, mmap.mmap] = {}

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def mapped(self, name: str, dtype: torch.dtype) -> torch.Tensor | None:
        """The tensor as a copy-on-write view of its file (no read, no copy), or None when it cannot be:
        pickled weights, another dtype than wanted, or an offset not aligned to the element size.

        The pages come in on first use and are shared with the page cache; the mapping lives as long
        as the tensor does. Private mapping: writing to the tensor never touches the file.
        """
        entry = self.checkpoint.entries.get(name)
        if entry is None or entry.dtype != dtype or entry.start % dtype.itemsize or not entry.nbytes:
            return None
        mapping = self._maps.get(entry.path)
        if mapping is None:
            with open(entry.path, "rb") as f:
                mapping = self._maps[entry.path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        flat = torch.frombuffer(mapping, dtype=dtype, count=entry.nbytes // dtype.itemsize, offset=entry.start)
        return flat.view(entry.shape)

    def read_into(self, name: str, dest: torch.Tensor) -> None:
        entry = self.checkpoint.entries.get(name)
        if entry is None:
            src = self.checkpoint.pickled[name]
            if tuple(src.shape) != tuple(dest.shape):
                raise ValueError(f"{name}: checkpoint shape {list(src.shape)} != model shape {list(dest.shape)}")
            dest.copy_(src)
            return
        f = self._files.get(entry.path)
        if f is None:
            f = self._files[entry.path] = self._stack.enter_context(open(entry.path, "rb", buffering=0))
        read_into(f, entry, dest)


def open_checkpoint(folder: str | Path, *, allow_pickle: bool = False) -> Checkpoint:
    """Index the weights of `folder`; refuses pickle files unless `allow_pickle`."""
    folder = Path(folder)
    files = _safetensors_files(folder)
    if files:
        entries = {}
        for path in files:
            entries.update(read_index(path))
        return Checkpoint(folder, entries)
    pickles = sorted(p for pattern in PICKLE_PATTERNS for p in folder.glob(pattern))
    if not pickles:
        raise CheckpointError(
            f"{folder} has no weights: expected model.safetensors, sharded "
            f"model-*.safetensors with {SAFETENSORS_INDEX}, or (opt-in) pytorch_model.bin"
        )
    if not allow_pickle:
        names = ", ".join(p.name for p in pickles)
        raise CheckpointError(
            f"{folder} only has pickle weights ({names}); loading pickle can run arbitrary code, so kernelbay "
            f"refuses it. Convert the checkpoint to safetensors, or pass allow_pickle=True if you trust it."
        )
    return Checkpoint(folder, pickled=dict(_load_pickles(pickles)))


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index} has no 'weight_map' naming the shard of each tensor")
        files = sorted({folder / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shard(s) that are not in the folder: {', '.join(missing)}")
        return files
    return sorted(folder.glob("*.safetensors"))


def _load_pickles(paths: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for path in paths:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        yield from state.items()
