"""A minimal safetensors reader that reads each tensor straight into its destination.

`safetensors.safe_open` maps the whole file, and the mapped pages stay resident until the file is
closed, which doubles peak memory while a model loads. Here each tensor is `readinto` the parameter
it belongs to (or, when the dtype differs, into one temporary the size of that tensor), so loading
never holds more than the weights plus one tensor.
"""

from __future__ import annotations

import ctypes
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """Where one tensor lives: file, dtype, shape and absolute byte range [start, end)."""

    name: str
    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_index(path: Path) -> dict[str, TensorEntry]:
    """Tensor name -> entry, from the file's JSON header."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        if size > _MAX_HEADER:
            raise ValueError(f"{path}: safetensors header of {size} bytes is not plausible; the file is corrupt")
        header = json.loads(f.read(size))
    base = 8 + size
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']}, which kernelbay cannot load")
        start, end = info["data_offsets"]
        entries[name] = TensorEntry(name, path, dtype, tuple(info["shape"]), base + start, base + end)
    return entries


def _byte_view(t: torch.Tensor) -> memoryview:
    return memoryview((ctypes.c_char * (t.numel() * t.element_size())).from_address(t.data_ptr())).cast("B")


def read_into(f, entry: TensorEntry, dest: torch.Tensor) -> None:
    """Fill `dest` (CPU, same shape) with the tensor's values, casting if the dtypes differ."""
    if tuple(dest.shape) != entry.shape:
        raise ValueError(f"{entry.name}: checkpoint shape {list(entry.shape)} != model shape {list(dest.shape)}")
    direct = dest.dtype == entry.dtype and dest.is_contiguous() and dest.device.type == "cpu"
    target = dest if direct else torch.empty(entry.shape, dtype=entry.dtype)
    expected = math.prod(entry.shape) * target.element_size()
    if expected != entry.nbytes:
        raise ValueError(f"{entry.path}: {entry.name} holds {entry.nbytes} bytes, its shape needs {expected}")
    if expected:
        f.seek(entry.start)
        got = f.readinto(_byte_view(target))
        if got != expected:
            raise ValueError(f"{entry.path}: file ends inside {entry.name} (read {got} of {expected} bytes)")
    if not direct:
        dest.copy_(target)
