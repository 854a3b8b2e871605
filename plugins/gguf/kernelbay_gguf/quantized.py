"""Keep a GGUF file's Q8_0 / Q4_0 / Q4_1 linear weights quantized, on kernelbay_engine.quant's CPU kernels.

`keep_quantized(model, path)` takes a model loaded from `path` (the dequantized path) and gives every
`Linear` whose checkpoint tensors are all one of those types the file's own codes and scales
(`from_q8_0` / `from_q4_0` / `from_q4_1`), fused layers (q/k/v, gate/up) assembled row by row and
Llama's Q/K rows un-permuted like the float path. Other layers keep their float weights, with the
reason in the report.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from torch import nn

from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.loading import NameRules
from kernelbay_engine.loading.plan import make_plan
from kernelbay_engine.models.quant import UnquantizedLinearMethod
from kernelbay_engine.quant import QuantizedWeight, from_q4_0, from_q4_1, from_q8_0, set_quantized_weight
from kernelbay_gguf.format import GGUFFormat
from kernelbay_gguf.tensors import GGUFSource, GGUFTensorReader, TensorInfo, unpermute_rows

BLOCK = 32  # weights per Q8_0 / Q4_0 / Q4_1 block


def _f16(blocks: np.ndarray, at: int) -> torch.Tensor:
    """The float16 field at byte `at` of every block -> float32 [rows, blocks]."""
    return torch.from_numpy(np.ascontiguousarray(blocks[..., at : at + 2]).view(np.float16)[..., 0].astype(np.float32))


def _nibbles(qs: np.ndarray) -> torch.Tensor:
    """[rows, blocks, 16] bytes -> uint8 [rows, blocks * 32]: low nibbles are weights 0-15, high ones 16-31."""
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    return torch.from_numpy(np.ascontiguousarray(codes).reshape(qs.shape[0], -1))


def codes(info: TensorInfo, raw: np.ndarray) -> tuple[torch.Tensor, ...]:
    """(q, scale[, min]) of a tensor's bytes [rows, bytes per row], as from_q8_0 / from_q4_0 / from_q4_1 take them."""
    rows = raw.shape[0]
    if info.qtype == Q.Q8_0:
        blocks = raw.reshape(rows, -1, 2 + BLOCK)
        q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(rows, -1)
        return torch.from_numpy(q), _f16(blocks, 0)
    if info.qtype == Q.Q4_0:
        blocks = raw.reshape(rows, -1, 2 + BLOCK // 2)
        return _nibbles(blocks[..., 2:]), _f16(blocks, 0)
    blocks = raw.reshape(rows, -1, 4 + BLOCK // 2)  # Q4_1: scale, min, then the nibbles
    return _nibbles(blocks[..., 4:]), _f16(blocks, 0), _f16(blocks, 2)


CONSTRUCTORS = {Q.Q8_0: from_q8_0, Q.Q4_0: from_q4_0, Q.Q4_1: from_q4_1}


def _assemble(reader: GGUFTensorReader, parts: list[tuple[TensorInfo, tuple]]) -> QuantizedWeight:
    """One weight [out, in] from its parts' codes, each at its rows (un-permuted like the float path)."""
    pieces: list[list[torch.Tensor]] = []
    for info, _ in sorted(parts, key=lambda p: p[1][0].start if p[1] else 0):
        fields = codes(info, reader.raw(info))
        if info.permute_heads:
            fields = tuple(unpermute_rows(f, info.permute_heads) for f in fields)
        pieces.append(list(fields))
    joined = [torch.cat(column) for column in zip(*pieces, strict=True)]
    return CONSTRUCTORS[parts[0][0].qtype](*joined)


def _why_not(parts: list[tuple[TensorInfo, tuple]] | None, layer: Linear) -> str | None:
    if type(layer.method) is not UnquantizedLinearMethod or layer.batch_shape:
        return f"weights are {layer.method!r}" if layer.batch_shape == () else "per-expert weights"
    if not parts:
        return "no tensor of the file fills it"
    kinds = sorted({info.qtype.name for info, _ in parts})
    if len(kinds) != 1 or parts[0][0].qtype not in CONSTRUCTORS:
        return f"stored as {'/'.join(kinds)}: no quantized kernel form, kept dequantized"
    if any(index and (len(index) != 1 or not isinstance(index[0], slice)) for _, index in parts):
        return "its parts are not whole row ranges"
    return None


def _parts_by_weight(model: nn.Module, source: GGUFSource) -> dict[int, list[tuple[TensorInfo, tuple]]]:
    """id(weight parameter) -> the file's tensors that fill it (a tied LM head finds the embedding's)."""
    rules = model.checkpoint_rules() if hasattr(model, "checkpoint_rules") else NameRules()
    plan = make_plan(model, source.names, rules)
    params = dict(model.named_parameters())
    parts: dict[int, list[tuple[TensorInfo, tuple]]] = defaultdict(list)
    for name, target in plan.assignments.items():
        parts[id(params[target.param])].append((source.entries[name], target.index))
    return parts


def keep_quantized(model: nn.Module, path: str | Path) -> dict[str, str]:
    """Layer path -> what it runs now ("GGUF Q4_1 on int4_group") or why it keeps float weights."""
    path = Path(path)
    source = GGUFFormat.open(path)
    parts = _parts_by_weight(model, source)
    report = {}
    with source.reader() as reader, torch.inference_mode():
        for name, layer in model.named_modules():
            if not isinstance(layer, Linear):
                continue
            weight = layer._parameters.get("weight")
            mine = parts.get(id(weight)) if weight is not None else None
            why = _why_not(mine, layer)
            if why or mine is None:
                report[name] = why or "no weight"
                continue
            quantized = _assemble(reader, mine)
            report[name] = f"{quantized.source} on {set_quantized_weight(layer, quantized).kernel.name}"
    return report
