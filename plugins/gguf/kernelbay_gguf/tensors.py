"""A GGUF file's tensors under their Hugging Face names, dequantized as they are read.

GGUF names (`blk.3.attn_q.weight`) map to the names kernelbay's model families load
(`model.layers.3.self_attn.q_proj.weight`); llama.cpp's head-wise Q/K row interleaving is undone
for the architectures it applies to. Tensors the file stores in a float type the model uses, and
that need no permutation, can be mapped straight from the file (`mmap=True`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, ReaderTensor
from gguf.quants import dequantize

from kernelbay_engine.loading import CheckpointError
from kernelbay_engine.loading.safetensors_file import SHAPE_HINT, shape_mismatch

# Read by dequantizing to float32 with the gguf package; anything else is refused by name.
SUPPORTED_TYPES = frozenset(
    {Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K}
)
MAPPABLE = {Q.F32: torch.float32, Q.F16: torch.float16}

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_name(name: str) -> str:
    """The Hugging Face name of a GGUF tensor; an unknown one keeps its name (the load plan reports it)."""
    block = _BLOCK.fullmatch(name)
    if block:
        index, part, kind = block.groups()
        return f"model.layers.{index}.{_BLOCK_NAMES[part]}.{kind}" if part in _BLOCK_NAMES else name
    stem, _, kind = name.rpartition(".")
    return f"{_GLOBAL_NAMES[stem]}.{kind}" if stem in _GLOBAL_NAMES else name


def unpermute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K permutation: within each head its rotary pairs go back to HF's half-split."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


@dataclass(frozen=True, slots=True)
class Entry:
    """One tensor: its GGUF record, HF shape ([out, in]), and the head count its rows are permuted by (0: none)."""

    tensor: ReaderTensor
    shape: tuple[int, ...]
    permute_heads: int = 0


class GGUFSource:
    """`WeightSource` over one GGUF file (kernelbay_engine.loading.formats)."""

    def __init__(self, path: Path, reader: GGUFReader, heads: tuple[int, int] | None):
        """`heads`: (attention heads, KV heads) when Q/K rows are permuted, else None."""
        self.folder = path
        self.entries = {hf_name(t.name): _entry(path, t, heads) for t in reader.tensors}

    @property
    def names(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name].shape

    def nbytes_of(self, name: str) -> int:
        return int(self.entries[name].tensor.n_bytes)

    def in_file_order(self, names: Iterable[str]) -> list[str]:
        return sorted(names, key=lambda n: self.entries[n].tensor.data_offset)

    def reader(self) -> GGUFTensorReader:
        return GGUFTensorReader(self)


def _entry(path: Path, t: ReaderTensor, heads: tuple[int, int] | None) -> Entry:
    """Checked before anything loads: a type kernelbay reads, and bytes that are all in the file."""
    if t.tensor_type not in SUPPORTED_TYPES:
        supported = ", ".join(sorted(q.name for q in SUPPORTED_TYPES))
        raise CheckpointError(
            f"{path}: tensor {t.name!r} is stored as {t.tensor_type.name}, which kernelbay-gguf cannot read "
            f"(supported: {supported}); re-quantize the model to one of those"
        )
    if t.data.nbytes != t.n_bytes:
        raise CheckpointError(
            f"{path}: tensor {t.name!r} needs {t.n_bytes} bytes at offset {t.data_offset}, the file holds "
            f"{t.data.nbytes} there; the file is truncated or its tensor offsets are wrong: re-download it"
        )
    shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dimensions innermost first
    permute = 0
    if heads is not None and re.fullmatch(r"blk\.\d+\.attn_[qk]\.(weight|bias)", t.name):
        permute = heads[0] if ".attn_q." in t.name else heads[1]
    return Entry(t, shape, permute)


class GGUFTensorReader:
    """`TensorReader`: dequantize (and un-permute) one tensor at a time into its parameter."""

    def __init__(self, source: GGUFSource):
        self.checkpoint = source

    def __enter__(self) -> GGUFTensorReader:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def mapped(self, name: str, dtype: torch.dtype) -> torch.Tensor | None:
        entry = self.checkpoint.entries[name]
        if MAPPABLE.get(entry.tensor.tensor_type) != dtype or entry.permute_heads:
            return None
        return torch.from_numpy(entry.tensor.data).view(entry.shape)  # the reader maps copy-on-write

    def read_into(self, name: str, dest: torch.Tensor) -> None:
        entry = self.checkpoint.entries[name]
        if tuple(dest.shape) != entry.shape:
            raise CheckpointError(f"{shape_mismatch(name, entry.shape, dest.shape)} {SHAPE_HINT}")
        values = torch.from_numpy(_float_values(entry.tensor)).view(entry.shape)
        if entry.permute_heads:
            values = unpermute_rows(values, entry.permute_heads)
        dest.copy_(values)


def _float_values(t: ReaderTensor) -> np.ndarray:
    if t.tensor_type in MAPPABLE:
        return np.asarray(t.data)
    return dequantize(t.data, t.tensor_type)
