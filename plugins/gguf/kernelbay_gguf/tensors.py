"""A GGUF file's tensors under their Hugging Face names, dequantized as they are read.

GGUF names (`blk.3.attn_q.weight`) map to the names kernelbay's model families load
(`model.layers.3.self_attn.q_proj.weight`); llama.cpp's head-wise Q/K row interleaving is undone
for the architectures it applies to. Tensors the file stores in a float type the model uses, and
that need no permutation, can be mapped straight from the file (`mmap=True`). The file is mapped
only while a model loads: afterwards nothing of it stays resident.
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, quant_shape_to_byte_shape
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from kernelbay_engine.loading import CheckpointError
from kernelbay_engine.loading.safetensors_file import SHAPE_HINT, shape_mismatch
from kernelbay_gguf import slices
from kernelbay_gguf.header import HeaderTensor
from kernelbay_gguf.metadata import DEFAULT_EXPERT_NAMES, Architecture
from kernelbay_gguf.slices import unpermute_rows

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
    "attn_qkv": "self_attn.qkv_proj",  # Phi-3's fused projections
    "ffn_gate_inp": "mlp.gate",  # the MoE router
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# Routed experts stacked in one tensor [experts, out, in]: each expert is read as its own [out, in] slice.
EXPERT_PARTS = {"ffn_gate_exps": 0, "ffn_up_exps": 1, "ffn_down_exps": 2}  # index into the (gate, up, down) names
_LEGACY_EXPERT = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight")


def hf_name(info: TensorInfo, arch: Architecture | None = None) -> str:
    """The Hugging Face name of a GGUF tensor (an architecture's own block and expert names over Llama's);
    an unknown one keeps its name (the load plan reports it)."""
    name = info.name
    block = _BLOCK.fullmatch(name)
    if block and block[2] in EXPERT_PARTS and info.expert is not None:
        part = (arch.expert_names if arch else DEFAULT_EXPERT_NAMES)[EXPERT_PARTS[block[2]]]
        return f"model.layers.{block[1]}.mlp.experts.{info.expert}.{part}.{block[3]}"
    if block:
        index, part, kind = block.groups()
        names = {**_BLOCK_NAMES, **(arch.block_names if arch else {})}
        return f"model.layers.{index}.{names[part]}.{kind}" if part in names else name
    stem, _, kind = name.rpartition(".")
    return f"{_GLOBAL_NAMES[stem]}.{kind}" if stem in _GLOBAL_NAMES else name


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor as the header describes it: HF shape ([out, in]), absolute byte range, type."""

    name: str
    qtype: Q
    shape: tuple[int, ...]
    start: int
    nbytes: int
    present: int  # bytes the file really holds there (less when truncated or the offset is wrong)
    permute_heads: int = 0  # the head count its rows are permuted by (0: none)
    offset: float = 0.0  # added to every value on read (Gemma's norms)
    expert: int | None = None  # one expert's slice of a stacked expert tensor (`per_expert`)


def tensor_info(t: HeaderTensor, file_size: int) -> TensorInfo:
    """A tensor of the header in torch's dimension order, with the bytes the file really holds at its offset."""
    present = max(0, min(t.nbytes, file_size - t.start))
    return TensorInfo(t.name, t.qtype, tuple(reversed(t.dims)), t.start, t.nbytes, present)


def check_tensor(path: Path, info: TensorInfo) -> TensorInfo:
    """Before anything loads: a type kernelbay reads, and bytes that are all in the file."""
    if info.qtype not in SUPPORTED_TYPES:
        supported = ", ".join(sorted(q.name for q in SUPPORTED_TYPES))
        raise CheckpointError(
            f"{path}: tensor {info.name!r} is stored as {info.qtype.name}, which kernelbay-gguf cannot read "
            f"(supported: {supported}); re-quantize the model to one of those"
        )
    block = GGML_QUANT_SIZES[info.qtype][0]
    if info.shape and info.shape[-1] % block:
        raise CheckpointError(
            f"{path}: tensor {info.name!r} is {info.qtype.name} with rows of {info.shape[-1]} values, not a multiple "
            f"of its block of {block}; the header's type or shape is wrong: re-download or re-convert the file"
        )
    if info.present != info.nbytes:
        raise CheckpointError(
            f"{path}: tensor {info.name!r} needs {info.nbytes} bytes at offset {info.start}, the file holds "
            f"{info.present} there; the file is truncated or its tensor offsets are wrong: re-download it"
        )
    return info


@dataclass(frozen=True, slots=True)
class DataLayout:
    """The file's tensor data section: where it starts, the alignment of every tensor offset, the file's size."""

    start: int
    alignment: int
    file_size: int

    def padded(self, end: int) -> int:
        """`end` rounded up to the alignment: where the next tensor starts."""
        return -(-end // self.alignment) * self.alignment


def check_layout(path: Path, tensors: Iterable[TensorInfo], layout: DataLayout) -> None:
    """The tensor table tiles the data section as GGUF writers lay it out: in offset order, the first tensor at
    the section's start, each next one where the previous one's bytes (from its type and shape) end, padded to the
    alignment, and the last one ending the file. A tensor whose type or shape was changed in the header (an F32
    norm retyped F16 or Q4_1) no longer fits the space it has, and would read garbage: refused, naming it."""
    ordered = sorted(tensors, key=lambda t: t.start)
    expected = layout.start
    for before, info in zip([None, *ordered], ordered, strict=False):  # (previous, tensor) pairs
        if info.start != expected:
            raise CheckpointError(f"{path}: {_misplaced(before, info, expected, layout)}; {_LAYOUT_FIX}")
        expected = layout.padded(info.start + info.nbytes)
    if ordered and not ordered[-1].start + ordered[-1].nbytes <= layout.file_size <= expected:
        last = ordered[-1]
        space = layout.file_size - last.start
        raise CheckpointError(f"{path}: {_declared(last)}, but the file leaves it {space} bytes; {_LAYOUT_FIX}")


_LAYOUT_FIX = (
    "the header's tensor table does not match the data (a tensor's type or shape was changed, or the file is "
    "corrupt): re-download or re-convert it"
)


def _declared(info: TensorInfo) -> str:
    return f"tensor {info.name!r} is declared {info.qtype.name} {list(info.shape)}, which takes {info.nbytes} bytes"


def _misplaced(before: TensorInfo | None, info: TensorInfo, expected: int, layout: DataLayout) -> str:
    if before is None:
        return f"the first tensor, {info.name!r}, starts at byte {info.start}, not where the data does ({expected})"
    space = info.start - before.start
    padded = expected - before.start
    return (
        f"{_declared(before)} ({padded} with padding to {layout.alignment}), but the next tensor, {info.name!r}, "
        f"starts {space} bytes after it"
    )


def as_stored_by(info: TensorInfo, arch: Architecture, heads: tuple[int, int] | None) -> TensorInfo:
    """What the converter did to this tensor: Q/K rows permuted (`heads`: attention and KV heads), norms shifted."""
    if heads is not None and re.fullmatch(r"blk\.\d+\.attn_[qk]\.(weight|bias)", info.name):
        info = replace(info, permute_heads=heads[0] if ".attn_q." in info.name else heads[1])
    if arch.norm_offset and info.name.endswith("norm.weight"):
        info = replace(info, offset=arch.norm_offset)
    return info


def per_expert(info: TensorInfo) -> list[TensorInfo]:
    """A stacked expert tensor [E, out, in] as E tensors [out, in] over consecutive byte ranges; others as is.
    A 1-D shared-expert gate [in] is the HF Linear's [1, in] (llama.cpp stores it without the row axis)."""
    if info.name.endswith("ffn_gate_inp_shexp.weight") and len(info.shape) == 1:
        return [replace(info, shape=(1, *info.shape))]
    legacy = _LEGACY_EXPERT.fullmatch(info.name)
    if legacy:  # Mixtral files converted before llama.cpp stacked experts: one tensor per expert
        return [replace(info, name=f"blk.{legacy[1]}.ffn_{legacy[2]}_exps.weight", expert=int(legacy[3]))]
    block = _BLOCK.fullmatch(info.name)
    if not block or block[2] not in EXPERT_PARTS or len(info.shape) != 3:
        return [info]
    experts, each = info.shape[0], info.nbytes // info.shape[0]
    return [
        replace(info, shape=info.shape[1:], start=info.start + e * each, nbytes=each, present=each, expert=e)
        for e in range(experts)
    ]


class GGUFSource:
    """`WeightSource` over one GGUF file (kernelbay_engine.loading.formats)."""

    def __init__(self, path: Path, tensors: Iterable[TensorInfo], arch: Architecture | None = None):
        self.folder = path
        self.entries = {hf_name(part, arch): part for t in tensors for part in per_expert(t)}

    @property
    def names(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name].shape

    def nbytes_of(self, name: str) -> int:
        return self.entries[name].nbytes

    def in_file_order(self, names: Iterable[str]) -> list[str]:
        return sorted(names, key=lambda n: self.entries[n].start)

    def reader(self) -> GGUFTensorReader:
        return GGUFTensorReader(self)


class GGUFTensorReader:
    """`TensorReader`: maps the file while open; dequantizes (and un-permutes) one tensor at a time."""

    def __init__(self, source: GGUFSource):
        self.checkpoint = source
        self._map: mmap.mmap | None = None
        self._file: np.ndarray | None = None

    def __enter__(self) -> GGUFTensorReader:
        with open(self.checkpoint.folder, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # copy-on-write: writable views
        self._file = np.frombuffer(self._map, dtype=np.uint8)
        return self

    def __exit__(self, *exc) -> None:
        self._file = self._map = None  # mapped parameters keep their own reference to the mapping

    def release(self, info: TensorInfo) -> None:
        """Drop a tensor's pages once its bytes have been copied out (codes, dequantized values), so a load does
        not keep the whole file resident as it goes (SmolLM2's Q4_1 load peaked 92 MiB higher): only the pages
        wholly inside the tensor, so a neighbour mapped as a parameter keeps its own. Re-read from the file if
        touched again (a private mapping's unwritten pages)."""
        start = -(-info.start // mmap.PAGESIZE) * mmap.PAGESIZE
        stop = (info.start + info.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if self._map is not None and stop > start:
            self._map.madvise(mmap.MADV_DONTNEED, start, stop - start)

    def raw(self, info: TensorInfo) -> np.ndarray:
        if self._file is None:
            raise RuntimeError("read tensors inside `with source.reader() as reader:`")
        raw = self._file[info.start : info.start + info.nbytes]
        return raw.reshape(quant_shape_to_byte_shape(info.shape, info.qtype))

    def mapped(self, name: str, dtype: torch.dtype) -> torch.Tensor | None:
        info = self.checkpoint.entries[name]
        if MAPPABLE.get(info.qtype) != dtype or info.permute_heads or info.offset or info.start % dtype.itemsize:
            return None
        return torch.from_numpy(self.raw(info)).view(dtype).view(info.shape)

    def read_into(self, name: str, dest: torch.Tensor) -> None:
        info = self.checkpoint.entries[name]
        if tuple(dest.shape) != info.shape:
            raise CheckpointError(f"{shape_mismatch(name, info.shape, dest.shape)} {SHAPE_HINT}")
        dest.copy_(self.values(info))
        self.release(info)

    def read_slice_into(self, name: str, dest: torch.Tensor, dim: int, start: int) -> None:
        """Tensor parallelism: `dest` <- the tensor's [start : start + dest.shape[dim]] along `dim`, dequantized from
        the bytes of that slice only (kernelbay_gguf.slices)."""
        info = self.checkpoint.entries[name]
        dest.copy_(slices.values(self.raw(info), info, dim, start, dest.shape[dim]))

    def values(self, info: TensorInfo) -> torch.Tensor:
        """The tensor as float32 in the model's layout: dequantized, rows un-permuted, offset added back."""
        values = torch.from_numpy(dequantize(self.raw(info), info.qtype)).view(info.shape)
        if info.permute_heads:
            values = unpermute_rows(values, info.permute_heads)
        return values + info.offset if info.offset else values
