"""A folder's weight files (the `safetensors` weight format): one safetensors file, a sharded set with an
index, or (opt-in) pickle."""

from __future__ import annotations

import json
import mmap
import os
import pickle
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernelbay_engine.loading.errors import CheckpointError
from kernelbay_engine.loading.safetensors_file import (
    SHAPE_HINT,
    TensorEntry,
    read_index,
    read_into,
    read_slice_into,
    shape_mismatch,
)

SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt")


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

    def nbytes_of(self, name: str) -> int:
        entry = self.entries.get(name)
        if entry is not None:
            return entry.nbytes
        t = self.pickled[name]
        return t.numel() * t.element_size()

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name].shape if name in self.entries else tuple(self.pickled[name].shape)

    def dtype(self, name: str) -> torch.dtype:
        """The dtype the tensor is stored in."""
        return self.entries[name].dtype if name in self.entries else self.pickled[name].dtype

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
                raise CheckpointError(f"{shape_mismatch(name, src.shape, dest.shape)} {SHAPE_HINT}")
            dest.copy_(src)
            return
        read_into(self._file(entry), entry, dest)

    def read_slice_into(self, name: str, dest: torch.Tensor, dim: int, start: int) -> None:
        """Fill `dest` with the tensor's [start : start + dest.shape[dim]] along `dim`, reading only those bytes."""
        entry = self.checkpoint.entries.get(name)
        if entry is None:
            dest.copy_(self.checkpoint.pickled[name].narrow(dim, start, dest.shape[dim]))
            return
        read_slice_into(self._file(entry), entry, dest, dim, start)

    def _file(self, entry: TensorEntry):
        f = self._files.get(entry.path)
        if f is None:
            f = self._files[entry.path] = self._stack.enter_context(open(entry.path, "rb", buffering=0))
        return f


# how to opt in to pickle weights (the CLI and LLM load safetensors only)
PICKLE_OPT_IN = "load it in Python: kernelbay_engine.AutoModelForCausalLM.from_pretrained(path, allow_pickle=True)"


def open_folder(folder: str | Path, *, allow_pickle: bool = False) -> Checkpoint:
    """Index the weights of `folder`; refuses pickle files unless `allow_pickle`."""
    folder = Path(folder)
    entries = safetensors_entries(folder)
    if entries is not None:
        return Checkpoint(folder, entries)
    pickles = sorted(p for pattern in PICKLE_PATTERNS for p in folder.glob(pattern))
    if not pickles:
        raise CheckpointError(
            f"{folder} has no weights: expected model.safetensors, sharded "
            f"model-*.safetensors with {SAFETENSORS_INDEX}, or pytorch_model.bin (pickle: {PICKLE_OPT_IN})"
        )
    if not allow_pickle:
        names = ", ".join(p.name for p in pickles)
        raise CheckpointError(
            f"{folder} only has pickle weights ({names}); loading pickle can run arbitrary code, so kernelbay "
            f"refuses it. Convert the checkpoint to safetensors, or, if you trust it, {PICKLE_OPT_IN}."
        )
    return Checkpoint(folder, pickled=dict(_load_pickles(pickles)))


def safetensors_entries(folder: Path) -> dict[str, TensorEntry] | None:
    """Every tensor of the folder's safetensors files (None if it has none), each from exactly one file."""
    index = folder / SAFETENSORS_INDEX
    if index.exists() or index.is_symlink():
        return _indexed_entries(folder, index)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    entries: dict[str, TensorEntry] = {}
    for path in files:
        _require_file(path)
        for name, entry in read_index(path).items():
            if name in entries:
                raise CheckpointError(
                    f"tensor {name!r} is in both {entries[name].path.name} and {path.name} in {folder}; "
                    f"remove the stale file, or add {SAFETENSORS_INDEX} saying which file holds each tensor"
                )
            entries[name] = entry
    return entries


def _indexed_entries(folder: Path, index: Path) -> dict[str, TensorEntry]:
    """The index decides: each tensor comes from the file it names, and each file holds exactly those."""
    weight_map = _read_weight_map(index)
    files = sorted(set(weight_map.values()))
    missing = [f for f in files if not (folder / f).exists()]
    if missing:
        raise CheckpointError(f"{index} names shard(s) that are not in the folder: {', '.join(missing)}")
    entries: dict[str, TensorEntry] = {}
    for file in files:
        path = folder / file
        _require_file(path)
        found = read_index(path)
        _check_shard(index, file, found, weight_map)
        entries.update(found)
    return entries


def _check_shard(index: Path, file: str, found: dict[str, TensorEntry], weight_map: dict[str, str]) -> None:
    """`file` holds exactly the tensors the index maps to it."""
    expected = {name for name, f in weight_map.items() if f == file}
    absent = sorted(expected - found.keys())
    if absent:
        raise CheckpointError(f"{index} maps {_few(absent)} to {file}, which does not hold them; {_INDEX_FIX}")
    for name in sorted(found.keys() - expected):
        where = f"maps it to {weight_map[name]}" if name in weight_map else "does not list it"
        raise CheckpointError(f"tensor {name!r} is in {file} but {index.name} {where}; {_INDEX_FIX}")


_INDEX_FIX = "the index and the shards are out of step: re-download them together"


def _few(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return f"{len(names)} tensor(s) ({shown}{', ...' if len(names) > limit else ''})"


def _read_weight_map(index: Path) -> dict[str, str]:
    """The index's weight_map (tensor -> shard file name), refused unless it is exactly that."""
    _require_file(index)
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{index} is not valid JSON ({err}); re-download it") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index} has no 'weight_map' naming the shard of each tensor")
    for name, file in weight_map.items():
        if not isinstance(file, str) or not _plain_file_name(file):
            raise CheckpointError(
                f"{index}: weight_map[{name!r}] is {file!r}; it must be the file name of a shard in the folder"
            )
    return weight_map


def _plain_file_name(file: str) -> bool:
    """A relative path inside the folder (no absolute path, no '..')."""
    path = Path(file)
    return bool(file) and not path.is_absolute() and ".." not in path.parts


def _require_file(path: Path) -> None:
    """`path` is a readable regular file (a symlink to one is fine), or an error saying what it is instead."""
    if path.is_file():
        return
    if path.is_symlink():
        what = f"a symbolic link to {os.readlink(path)!r} that does not resolve (dangling or looping)"
    elif path.is_dir():
        what = "a directory, not a file"
    else:
        what = "not a regular file"
    raise CheckpointError(f"{path} is {what}; put the real weight file there")


def _load_pickles(paths: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for path in paths:
        _require_file(path)
        try:
            state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as err:
            raise CheckpointError(f"{path} is not a readable torch checkpoint ({err}); re-download it") from None
        yield from state.items()
