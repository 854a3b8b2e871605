"""A tensor-parallel rank's slice of a GGUF tensor, read from the file's bytes of that slice alone.

Quantized blocks run along each row: rows [start, start + n) of a 2-D tensor are one contiguous byte range, and a
range of columns is a range of blocks within each row. A slice that cuts blocks is read as the blocks that cover it
and cut after dequantizing (`values`); the file's codes themselves are only ever split on whole blocks (`raw`).
Llama's Q/K rows are permuted within each head by the converter: a row slice covers whole heads, un-permuted with
its own head count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize

from kernelbay_engine.loading import CheckpointError

if TYPE_CHECKING:
    from kernelbay_gguf.tensors import TensorInfo


def unpermute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K permutation: within each head its rotary pairs go back to HF's half-split."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def block_of(info: TensorInfo) -> int:
    """Values per block of the tensor's type along a row (1 for F32/F16/BF16)."""
    return GGML_QUANT_SIZES[info.qtype][0]


def raw(tensor: np.ndarray, info: TensorInfo, dim: int, start: int, length: int) -> np.ndarray:
    """The bytes [rows, bytes per row] of `tensor` (the whole tensor's, as mapped) holding rows, or whole blocks of
    columns, [start, start + length) along `dim`; a view: only the pages it covers are read."""
    if dim == 0:
        return tensor[start : start + length]
    block, size = GGML_QUANT_SIZES[info.qtype]
    if start % block or length % block:
        raise CheckpointError(
            f"{info.name} is {info.qtype.name}, in blocks of {block} values along a row: columns [{start}, "
            f"{start + length}) cut its blocks"
        )
    return tensor[:, start // block * size : (start + length) // block * size]


def values(tensor: np.ndarray, info: TensorInfo, dim: int, start: int, length: int) -> torch.Tensor:
    """float32 values of the slice in the model's layout: dequantized from the blocks covering it, rows un-permuted,
    offset added back."""
    block = block_of(info) if dim == 1 else 1
    first, stop = start // block * block, -(-(start + length) // block) * block
    covering = np.ascontiguousarray(raw(tensor, info, dim, first, stop - first))
    rows = dequantize(covering, info.qtype).reshape(covering.shape[0], -1)
    out = torch.from_numpy(rows).narrow(dim, start - first, length)
    if info.permute_heads:
        out = unpermute_rows(out, local_heads(info, dim, start, length))
    return out + info.offset if info.offset else out


def local_heads(info: TensorInfo, dim: int, start: int, length: int) -> int:
    """Heads a slice of a Q/K tensor permuted per head covers (all of them for a column slice); refused unless whole."""
    if dim == 1:
        return info.permute_heads
    head_rows = info.shape[0] // info.permute_heads
    if start % head_rows or length % head_rows:
        raise CheckpointError(
            f"{info.name}: rows [{start}, {start + length}) cut its heads of {head_rows} rows (its rows are permuted "
            "per head, so a rank's share must be whole heads)"
        )
    return length // head_rows
