"""A tensor-parallel rank's linears on the file's own codes (`quantization="gguf"` at tensor_parallel_size > 1).

Each layer takes the form `kernelbay_gguf.quantized` gives it in one process (the same rule, from the same tensor
types); what differs is what is read. `sources` (the engine's sharding pass, by model-side tensor name) says which
piece of each file tensor the rank holds: its rows (column-parallel q/k/v and gate/up, the vocabulary rows of the
embedding and LM head: one contiguous byte range), or a range of each row's columns (row-parallel o_proj and
down_proj: whole blocks of every row). The file's codes are split on whole blocks only, so a rank's codes and
scales are exactly the unsharded weight's: a column share that is not a multiple of the tensor's block (32 values;
256 for K-quants) is refused before anything loads (`shard_problems`), naming the tensor. A requantized type's
share is dequantized and requantized in groups of 32, the groups of the whole weight (its share starts on a block).
The rows an uneven vocabulary split pads are zero codes with zero scales.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from torch import nn

from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.loading import NameRules
from kernelbay_engine.loading.plan import SourcePiece, make_plan
from kernelbay_engine.quant import QuantizedWeight, quantize, set_quantized_embedding, set_quantized_weight
from kernelbay_gguf import slices
from kernelbay_gguf.parsed import open_source, release_free_heap
from kernelbay_gguf.quantized import (
    BLOCK,
    CONSTRUCTORS,
    TABLE_ROWS,
    Form,
    _form,
    _one_thread,
    _type_form,
    codes,
    head_rows,
)
from kernelbay_gguf.slices import unpermute_rows
from kernelbay_gguf.tensors import GGUFTensorReader, TensorInfo

Sources = Mapping[str, tuple[SourcePiece, ...]]


@dataclass(frozen=True, slots=True)
class _Part:
    """One file tensor filling rows `rows` of a rank's weight, through `pieces` of it (() for all of it)."""

    info: TensorInfo
    rows: slice
    pieces: tuple[SourcePiece, ...]

    def chunks(self) -> tuple[SourcePiece, ...]:
        """The pieces in the order their rows follow each other (the whole tensor when it is not split)."""
        whole = (SourcePiece(0, 0, self.info.shape[0]),)
        return tuple(sorted(self.pieces, key=lambda p: p.dest_start)) or whole


def _parts_by_weight(model: nn.Module, path: Path, rules: NameRules, sources: Sources) -> dict[int, list[_Part]]:
    """id(weight parameter) -> the file tensors that fill it, each with the pieces this rank reads."""
    source = open_source(path)
    plan = make_plan(model, source.names, rules)
    params = dict(model.named_parameters())
    parts: dict[int, list[_Part]] = defaultdict(list)
    for name, target in plan.assignments.items():
        param = params.get(target.param)
        if param is None or param.dim() != 2:
            continue
        rows = target.index[0] if target.index else slice(0, param.shape[0])
        parts[id(param)].append(_Part(source.entries[name], rows, sources.get(rules.rename(name), ())))
    return parts


def _as_parts(parts: list[_Part] | None) -> list[tuple[TensorInfo, tuple]] | None:
    """quantized.py's (tensor, index) records, for its rule of forms."""
    return None if parts is None else [(p.info, (p.rows,)) for p in parts]


def _held_modules(model: nn.Module, parts: dict[int, list[_Part]]):
    """(path, module, its parts, its form) of every Linear and of the token embedding table (last)."""
    for name, module in model.named_modules():
        if isinstance(module, Linear):
            weight = module._parameters.get("weight")
            mine = parts.get(id(weight)) if weight is not None else None
            yield name, module, mine, _form(_as_parts(mine), module)
    table = getattr(model, "input_embeddings", lambda: None)()
    weight = table._parameters.get("weight") if table is not None and hasattr(table, "method") else None
    if weight is not None:
        mine = parts.get(id(weight))
        path = next(name for name, module in model.named_modules() if module is table)
        yield path, table, mine, _type_form(_as_parts(mine))


def shard_problems(model: nn.Module, path: str | Path, rules: NameRules, sources: Sources) -> list[str]:
    """Why this rank's share of the file's codes cannot be read (columns that cut a tensor's blocks), one line per
    kind of tensor; `model`: the rank's, on meta, sharded (`sources`)."""
    parts = _parts_by_weight(model, Path(path), rules, sources)
    problems: dict[str, str] = {}
    for _, _, mine, form in _held_modules(model, parts):
        if isinstance(form, str) or mine is None:
            continue
        for part in mine:
            block = slices.block_of(part.info)
            for piece in part.pieces:
                if piece.dim == 1 and (piece.start % block or piece.length % block):
                    kind = re.sub(r"blk\.\d+\.", "blk.N.", part.info.name)
                    problems.setdefault(
                        kind,
                        f"{kind} is {part.info.qtype.name}, in blocks of {block} values along a row, but a rank's "
                        f"share of its {part.info.shape[1]} inputs is {piece.length} (its codes split on whole "
                        "blocks only; quantization='none' dequantizes them instead)",
                    )
    return list(problems.values())


def shard_forms(model: nn.Module, path: str | Path, rules: NameRules, sources: Sources) -> dict[str, Form | str]:
    """Layer path (and the token table's) -> the form its share of the file takes, or why it keeps float weights
    (read from the header alone: what `explain --tensor-parallel-size N` counts a rank's bytes from)."""
    parts = _parts_by_weight(model, Path(path), rules, sources)
    return {name: form for name, _, _, form in _held_modules(model, parts)}


def keep_quantized_shard(model: nn.Module, path: str | Path, rules: NameRules, sources: Sources) -> dict[str, str]:
    """Give a rank's model (on meta, sharded: `sources`) its share of the file's codes before the rest loads; layer
    path -> what it runs, or why it keeps float weights (what `quantized.keep_quantized` reports in one process)."""
    path = Path(path)
    problems = shard_problems(model, path, rules, sources)
    if problems:
        from kernelbay_engine.loading import CheckpointError

        raise CheckpointError(f"{path}: " + "; ".join(problems))
    parts = _parts_by_weight(model, path, rules, sources)
    held = list(_held_modules(model, parts))
    report: dict[str, str] = {}
    built: dict[int, QuantizedWeight] = {}
    heads: dict[int, object] = {}  # parts -> the method of the linear holding them (a tied head, for its table)
    with open_source(path).reader() as reader, torch.inference_mode(), _one_thread():
        for name, module, mine, form in held:
            if isinstance(form, str) or mine is None:
                report[name] = str(form)
                continue
            weight = built.get(id(mine)) or _padded(_assemble(reader, mine, form), _rows_of(module))
            built[id(mine)] = weight  # a tied head and table share their parts: assembled once
            if isinstance(module, Linear):
                report[name] = f"{weight.source} on {set_quantized_weight(module, weight).kernel.name}"
                heads[id(mine)] = module.method
            else:  # the table comes last: a tied one reads its codes from the head's layout, held once
                set_quantized_embedding(module, weight, **head_rows(heads.get(id(mine)), weight))
                report[name] = f"{weight.source} on {TABLE_ROWS}"
    release_free_heap()
    return report


def _rows_of(module: nn.Module) -> int:
    return module.out_features if isinstance(module, Linear) else cast(torch.Tensor, module.weight).shape[0]


def _assemble(reader: GGUFTensorReader, parts: list[_Part], form: Form) -> QuantizedWeight:
    """The rank's weight from its parts' pieces, in row order: the codes as stored, or requantized."""
    ordered = sorted(parts, key=lambda p: p.rows.start)
    if not form.exact:
        dense = [_values(reader, part.info, piece) for part in ordered for piece in part.chunks()]
        return quantize(torch.cat(dense), form.bits, form.group_size, source=form.source)
    pieces = [_codes(reader, part.info, piece) for part in ordered for piece in part.chunks()]
    if len(pieces) == 1:
        return pieces[0]
    zeros = [p.zero for p in pieces if p.zero is not None]
    q, scale = torch.cat([p.q for p in pieces]), torch.cat([p.scale for p in pieces])
    return QuantizedWeight(form.bits, BLOCK, q, scale, torch.cat(zeros) if zeros else None, form.source)


def _codes(reader: GGUFTensorReader, info: TensorInfo, piece: SourcePiece) -> QuantizedWeight:
    """One piece's codes and scales, copied out of the mapped file (rows un-permuted to the model's order)."""
    raw = slices.raw(reader.raw(info), info, piece.dim, piece.start, piece.length)
    fields = codes(info, raw.copy())  # a contiguous copy of the piece's bytes only
    reader.release(info)
    if info.permute_heads:
        heads = slices.local_heads(info, piece.dim, piece.start, piece.length)
        fields = tuple(unpermute_rows(f, heads) for f in fields)
    return CONSTRUCTORS[info.qtype](*fields)


def _values(reader: GGUFTensorReader, info: TensorInfo, piece: SourcePiece) -> torch.Tensor:
    values = slices.values(reader.raw(info), info, piece.dim, piece.start, piece.length)
    reader.release(info)
    return values


def _padded(weight: QuantizedWeight, rows: int) -> QuantizedWeight:
    """The weight with zero rows (zero codes, scales and zeros: value 0) up to `rows` (an uneven vocabulary split)."""
    extra = rows - weight.out_features
    if extra <= 0:
        return weight

    def pad(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t.new_zeros(extra, t.shape[1])])

    zero = None if weight.zero is None else pad(weight.zero)
    return QuantizedWeight(weight.bits, weight.group_size, pad(weight.q), pad(weight.scale), zero, weight.source)
