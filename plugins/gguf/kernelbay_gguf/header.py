"""A GGUF file's header: metadata and tensor table, without the tensor data (the format: llama.cpp's
docs/gguf.md; its constants from the `gguf` package).

`gguf.GGUFReader` makes numpy views of every metadata item, ~10 per string of a vocabulary: 2.1 s for
SmolLM2's 49k-token file, which this reader walks in ~15 ms by skipping the arrays (given as their length, and
where they lie, so `read_arrays` reads a vocabulary's later without walking the header again). The tensors' bytes
are read and dequantized with `gguf` (tensors.py).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFValueType
from gguf import GGMLQuantizationType as Q

VERSIONS = (2, 3)  # what gguf's own reader accepts (v1 counted in 32 bits)
_SCALARS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


_LENGTH = struct.Struct("<Q")  # a string's byte count


class HeaderError(ValueError):
    """The bytes are not a GGUF header this reader understands."""


@dataclass(frozen=True, slots=True)
class HeaderTensor:
    name: str
    qtype: Q
    dims: tuple[int, ...]  # as the file lists them, innermost first
    start: int  # absolute byte offset
    nbytes: int


@dataclass(frozen=True, slots=True)
class Header:
    metadata: dict[str, Any]  # key -> value; an array is given as its length
    tensors: tuple[HeaderTensor, ...]
    data_start: int = 0  # absolute offset of the tensor data section (the first tensor's bytes)
    alignment: int = GGUF_DEFAULT_ALIGNMENT  # each tensor's offset is a multiple of it; padding fills the gaps
    arrays: Mapping[str, int] = field(default_factory=dict)  # array key -> byte offset of its item type (read_arrays)


class _Cursor:
    def __init__(self, data: mmap.mmap):
        self.data, self.pos = data, 0

    def unpack(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(fmt, self.data, self.pos)
        except struct.error:
            raise HeaderError(f"the header ends early (byte {self.pos} of {len(self.data)})") from None
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        if self.pos + length > len(self.data):
            raise HeaderError(f"a string of {length} bytes at byte {self.pos} runs past the end of the file")
        raw = self.data[self.pos : self.pos + length]
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int, *, whole: bool = False) -> Any:
        """The value at the cursor; an array as its length unless `whole` (then a list of its items)."""
        if kind in _SCALARS:
            return self.unpack(_SCALARS[GGUFValueType(kind)])
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind != GGUFValueType.ARRAY:
            raise HeaderError(f"metadata value type {kind} at byte {self.pos} is not a GGUF type")
        item, count = self.unpack("<I"), self.unpack("<Q")
        if whole:
            return self.items(item, count)
        if item in _SCALARS:  # fixed width: jumped over
            self.pos += count * struct.calcsize(_SCALARS[item])
        elif item == GGUFValueType.STRING:  # each string's length, then its bytes
            self.pos = self._past_strings(count)
        else:
            for _ in range(count):
                self.value(item)
        if self.pos > len(self.data):
            raise HeaderError(f"an array of {count} items runs past the end of the file")
        return count

    def _past_strings(self, count: int) -> int:
        """Where an array of `count` strings at the cursor ends, walked by their lengths alone (SmolLM2's tokens and
        merges: ~10 ms of the header's 13)."""
        data, pos, end, length_at = self.data, self.pos, len(self.data), _LENGTH.unpack_from
        for _ in range(count):
            if pos + 8 > end:
                raise HeaderError(f"an array of {count} strings runs past the end of the file")
            pos += 8 + length_at(data, pos)[0]
        return pos

    def items(self, item: int, count: int) -> list[Any]:
        """An array's `count` items of type `item` (a vocabulary's strings: one slice and decode each)."""
        if item in _SCALARS:
            fmt = f"<{count}{_SCALARS[GGUFValueType(item)][1]}"
            try:
                values = struct.unpack_from(fmt, self.data, self.pos)
            except struct.error:
                raise HeaderError(f"an array of {count} items runs past the end of the file") from None
            self.pos += struct.calcsize(fmt)
            return list(values)
        if item != GGUFValueType.STRING:
            return [self.value(item, whole=True) for _ in range(count)]
        data, pos, end, out = self.data, self.pos, len(self.data), []
        for _ in range(count):
            if pos + 8 > end:
                raise HeaderError(f"an array of {count} strings runs past the end of the file")
            (length,) = _LENGTH.unpack_from(data, pos)
            out.append(data[pos + 8 : pos + 8 + length].decode("utf-8", errors="replace"))
            pos += 8 + length
        if pos > end:
            raise HeaderError(f"an array of {count} strings runs past the end of the file")
        self.pos = pos
        return out


def read_header(path: Path) -> Header:
    """The file's metadata and tensor table; HeaderError naming what is wrong with the bytes. An array is given as
    its length, and where it lies (`Header.arrays`) for `read_arrays`."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data)
        if cursor.unpack("<I") != GGUF_MAGIC:
            raise HeaderError("it does not start with the GGUF magic bytes")
        version = cursor.unpack("<I")
        if version not in VERSIONS:
            raise HeaderError(f"GGUF version {version} is not supported (supported: {', '.join(map(str, VERSIONS))})")
        tensor_count, kv_count = cursor.unpack("<Q"), cursor.unpack("<Q")
        metadata, positions = {}, {}
        for _ in range(kv_count):
            key, kind = cursor.string(), cursor.unpack("<I")
            if kind == GGUFValueType.ARRAY:
                positions[key] = cursor.pos
            metadata[key] = cursor.value(kind)
        table = [_tensor_entry(cursor) for _ in range(tensor_count)]
        alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise HeaderError(f"general.alignment {alignment!r} is not a power of two")
        data_start = -(-cursor.pos // alignment) * alignment
    return Header(metadata, tuple(_placed(entry, data_start) for entry in table), data_start, alignment, positions)


def read_arrays(path: Path, keys: Iterable[str], positions: Mapping[str, int], lengths: Mapping[str, Any]):
    """The arrays named in `keys` that the file has (a vocabulary's tokens and merges), read whole as lists from
    where read_header's parse of this file found them (`positions`: Header.arrays, `lengths`: its metadata): the
    rest of the header is not walked again. An array of another length than parsed (the file changed since) is a
    HeaderError."""
    out: dict[str, list[Any]] = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data)
        for key in keys:
            if key not in positions:
                continue
            cursor.pos = positions[key]
            out[key] = cursor.value(GGUFValueType.ARRAY, whole=True)
            if len(out[key]) != lengths[key]:
                raise HeaderError(
                    f"{key} holds {len(out[key])} items where the header said {lengths[key]}: the file "
                    f"changed while it was read"
                )
    return out


def _tensor_entry(cursor: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cursor.string()
    dims = tuple(cursor.unpack("<Q") for _ in range(cursor.unpack("<I")))
    return name, dims, cursor.unpack("<I"), cursor.unpack("<Q")


def _placed(entry: tuple[str, tuple[int, ...], int, int], data_start: int) -> HeaderTensor:
    name, dims, kind, offset = entry
    try:
        qtype = Q(kind)
    except ValueError:
        raise HeaderError(f"tensor {name!r} has ggml type {kind}, which the gguf package does not know") from None
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    elements = 1
    for d in dims:
        elements *= d
    return HeaderTensor(name, qtype, dims, data_start + offset, elements // block * block_bytes)
