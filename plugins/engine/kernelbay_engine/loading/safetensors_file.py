"""A minimal safetensors reader that reads each tensor straight into its destination.

`safetensors.safe_open` maps the whole file, and the mapped pages stay resident until the file is
closed, which doubles peak memory while a model loads. Here each tensor is `readinto` the parameter
it belongs to (or, when the dtype differs, into one temporary the size of that tensor), so loading
never holds more than the weights plus one tensor.

The header is still validated by the safetensors library (`safe_open` only parses it and maps the
file lazily): offsets that cover the data exactly with no overlap, dtypes and shapes that agree with
the byte ranges, a header length that fits. Only then are the offsets read from the same header.
"""

from __future__ import annotations

import ctypes
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from kernelbay_engine.loading.errors import CheckpointError

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
_FIX = "re-download or re-convert the file"


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


def _validated_specs(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) as the safetensors library reads them; it refuses any inconsistent header."""
    try:
        with safe_open(str(path), framework="pt") as f:
            slices = {name: f.get_slice(name) for name in f.keys()}
            return {name: (s.get_dtype(), tuple(s.get_shape())) for name, s in slices.items()}
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{path} is not a valid safetensors file ({err}); {_FIX}") from None


def _raw_header(path: Path) -> tuple[dict, int]:
    """The JSON header and the absolute offset of the data that follows it (the file is already validated)."""
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
    except (OSError, struct.error, ValueError) as err:  # the file changed since it was validated
        raise CheckpointError(f"{path} cannot be read ({err}); {_FIX}") from None
    return header, 8 + size


def read_index(path: Path) -> dict[str, TensorEntry]:
    """Tensor name -> entry, from the file's JSON header."""
    specs = _validated_specs(path)
    header, base = _raw_header(path)
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if specs.get(name) != (info["dtype"], tuple(info["shape"])):
            raise CheckpointError(f"{path}: tensor {name!r} reads differently on a second look; {_FIX}")
        dtype = DTYPES.get(info["dtype"])
        if dtype is None:
            raise CheckpointError(f"{path}: tensor {name!r} has dtype {info['dtype']}, which kernelbay cannot load")
        start, end = info["data_offsets"]
        entries[name] = TensorEntry(name, path, dtype, tuple(info["shape"]), base + start, base + end)
    if entries.keys() != specs.keys():
        raise CheckpointError(f"{path}: the header's tensors differ on a second look; {_FIX}")
    return entries


def _byte_view(t: torch.Tensor) -> memoryview:
    return memoryview((ctypes.c_char * (t.numel() * t.element_size())).from_address(t.data_ptr())).cast("B")


SHAPE_HINT = "(do config.json's sizes, e.g. vocab_size and hidden_size, match these weights?)"


def shape_mismatch(name: str, checkpoint_shape, model_shape) -> str:
    return f"{name}: checkpoint shape {list(checkpoint_shape)} != model shape {list(model_shape)}"


def read_into(f, entry: TensorEntry, dest: torch.Tensor) -> None:
    """Fill `dest` (CPU, same shape) with the tensor's values, casting if the dtypes differ."""
    if tuple(dest.shape) != entry.shape:
        raise CheckpointError(f"{shape_mismatch(entry.name, entry.shape, dest.shape)} {SHAPE_HINT}")
    direct = dest.dtype == entry.dtype and dest.is_contiguous() and dest.device.type == "cpu"
    target = dest if direct else torch.empty(entry.shape, dtype=entry.dtype)
    expected = math.prod(entry.shape) * target.element_size()
    if expected != entry.nbytes:
        raise CheckpointError(f"{entry.path}: {entry.name} holds {entry.nbytes} bytes, its shape needs {expected}")
    if expected:
        f.seek(entry.start)
        got = f.readinto(_byte_view(target))
        if got != expected:
            raise CheckpointError(f"{entry.path}: file ends inside {entry.name} (read {got} of {expected} bytes)")
    if not direct:
        dest.copy_(target)


def read_slice_into(f, entry: TensorEntry, dest: torch.Tensor, dim: int, start: int) -> None:
    """Fill `dest` with entry[..., start : start + dest.shape[dim], ...] along `dim`, reading only those bytes: one
    contiguous run per index of the axes before `dim` (a single read for dim 0)."""
    shape, length = entry.shape, dest.shape[dim]
    wanted = (*shape[:dim], length, *shape[dim + 1 :])
    if tuple(dest.shape) != wanted or not 0 <= start <= shape[dim] - length:
        raise CheckpointError(
            f"{entry.name}: rows [{start}, {start + length}) of axis {dim} do not fit its shape {list(shape)} "
            f"into {list(dest.shape)}; {SHAPE_HINT}"
        )
    item = entry.dtype.itemsize
    inner = math.prod(shape[dim + 1 :])
    run = length * inner * item  # bytes of one contiguous run
    target = torch.empty(wanted, dtype=entry.dtype)
    view = _byte_view(target)
    for outer in range(math.prod(shape[:dim])):
        f.seek(entry.start + ((outer * shape[dim] + start) * inner) * item)
        got = f.readinto(view[outer * run : (outer + 1) * run])
        if got != run:
            raise CheckpointError(f"{entry.path}: file ends inside {entry.name} (read {got} of {run} bytes)")
    dest.copy_(target)
