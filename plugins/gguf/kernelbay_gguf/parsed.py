"""One parse of a GGUF file (cached per file version), the tensor source it opens, and handing freed heap back:
what the format (format.py) and the quantized loader (quantized.py) both read."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelbay_engine.loading import CheckpointError
from kernelbay_gguf.header import HeaderError, read_header
from kernelbay_gguf.metadata import architecture
from kernelbay_gguf.tensors import (
    DataLayout,
    GGUFSource,
    TensorInfo,
    as_stored_by,
    check_layout,
    check_tensor,
    tensor_info,
)

_FIX = "the file is truncated or not a GGUF model: re-download it"


@dataclass(frozen=True)
class ParsedFile:
    """What one parse of a GGUF file yields and the loader keeps: plain records, no reference to the file."""

    metadata: dict[str, Any]  # key -> value; an array is given as its length (header.py)
    tensors: tuple[TensorInfo, ...]
    has_tokenizer: bool
    layout: DataLayout  # where the tensor data lies: what the tensor table must tile
    arrays: Mapping[str, int]  # array key -> where it lies (header.read_arrays reads the vocabulary from there)


class _Unreadable(Exception):
    """The header reader refused the file; re-raised as the caller's error type."""


@functools.lru_cache(maxsize=2)
def _parse(path: Path, size: int, mtime: int) -> ParsedFile:
    """One parse per file version (config, tensors and tokenizer all ask)."""
    try:
        header = read_header(path)
        tensors = tuple(tensor_info(t, size) for t in header.tensors)
    except (HeaderError, ValueError, OSError) as err:  # ValueError: mmap of an empty file
        raise _Unreadable(f"{path} is not a readable GGUF file ({err}); {_FIX}") from None
    layout = DataLayout(header.data_start, header.alignment, size)
    return ParsedFile(header.metadata, tensors, "tokenizer.ggml.tokens" in header.metadata, layout, header.arrays)


def read_gguf(path: Path, error: type[Exception] = CheckpointError) -> ParsedFile:
    """The parsed file, or `error` naming it and what is wrong."""
    try:
        stat = path.stat()
        return _parse(path, stat.st_size, stat.st_mtime_ns)
    except (OSError, _Unreadable) as err:
        raise error(str(err)) from None


def open_source(path: Path) -> GGUFSource:
    """The file's tensors as the engine's loader reads them (Q/K rows un-permuted where the file permutes them)."""
    parsed = read_gguf(path)
    fields = parsed.metadata
    name, arch = architecture(fields, str(path))
    heads = None
    if arch.permuted_qk:
        n_head = fields[f"{name}.attention.head_count"]
        heads = (n_head, fields.get(f"{name}.attention.head_count_kv", n_head))
    checked = [check_tensor(path, t) for t in parsed.tensors]  # each readable and present, then the table whole
    check_layout(path, checked, parsed.layout)
    return GGUFSource(path, (as_stored_by(t, arch, heads) for t in checked), arch)


def release_free_heap() -> None:
    """Hand the C allocator's free heap back to the OS (glibc's `malloc_trim`) after a phase that frees hundreds of
    MiB of temporaries: packing the kernels' layouts and parsing a vocabulary's metadata. glibc keeps such memory
    mapped (resident) once its mmap threshold has risen past their sizes: SmolLM2's Q4_1 load left ~150 MiB of it.
    Elsewhere (no `malloc_trim`) the allocator's own policy applies."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)
