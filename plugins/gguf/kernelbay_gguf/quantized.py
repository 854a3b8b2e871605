"""Keep a GGUF file's quantized linear weights on kernelbay_engine.quant's CPU kernels (`quantization="gguf"`).

The rule, per linear layer (fused q/k/v and gate/up assembled row by row, Llama's Q/K rows un-permuted
like the float path, a tied LM head from the embedding's tensor):

- Q8_0 and Q5_0 (int8 groups of 32: Q5_0's codes less 16), Q4_0, Q4_1 and Q4_K (int4 groups of 32 with
  per-group zeros: Q4_K's 6-bit sub-block scales and mins multiplied out): the file's own codes and scales,
  exactly, also when a fused layer's parts mix types of one width (Q5_0 q/k with a Q8_0 v);
- Q5_1, Q2_K, Q3_K, Q5_K, Q6_K (no kernel runs their codes: Q6_K's scales are per 16 weights, the int4
  kernel's smallest group is 32), or parts of both widths: dequantized, then requantized to int8 groups of 32
  (`quantize(dense, 8, 32)`: per group an error of at most half of max|w| / 127, below each type's own step);
- F32 / F16 / BF16 (not quantized in the file) and per-expert weights keep the weights as loaded.

The token embedding table takes the same form as its tensor (`set_quantized_embedding`: codes held, rows
dequantized per lookup); a tied LM head's codes are assembled once for both and held once (the table reads its
rows from the head's int8_dot layout), so the model holds no float table and no second copy of the codes.

Q8_0, Q4_0 and Q4_1 blocks are shuffled straight into int8_dot's packed layout (`dot_codes`: the same codes in
another byte order), so a load makes no one-byte copy of them; `QuantizedWeight.q` unpacks them for any other consumer.

`forms(model, path)` says this per layer from the header alone (what `explain --quantization gguf` shows);
`keep_quantized(model, path)` applies it and reports each layer's kernel.
"""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import Q4_K as Q4_K_BLOCKS
from torch import nn

from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.loading import NameRules
from kernelbay_engine.loading.plan import make_plan
from kernelbay_engine.models.quant import UnquantizedLinearMethod
from kernelbay_engine.quant import (
    QuantizedWeight,
    from_q4_0,
    from_q4_1,
    from_q8_0,
    quantize,
    set_quantized_embedding,
    set_quantized_weight,
)
from kernelbay_engine.quant.kernels import dot_code_rows, dot_scale_rows, holds_scales
from kernelbay_gguf.parsed import open_source, release_free_heap
from kernelbay_gguf.slices import unpermute_rows
from kernelbay_gguf.tensors import GGUFSource, GGUFTensorReader, TensorInfo

BLOCK = 32  # weights per Q8_0 / Q4_0 / Q4_1 block, and per Q4_K sub-block
REQUANTIZED = frozenset({Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q5_K, Q.Q6_K})
REQUANT_BITS, REQUANT_GROUP = 8, 32
Parts = list[tuple[TensorInfo, tuple]]  # a weight's file tensors and the rows each fills


def _f16(blocks: np.ndarray, at: int) -> torch.Tensor:
    """The float16 field at byte `at` of every block -> float32 [rows, blocks]."""
    return torch.from_numpy(np.ascontiguousarray(blocks[..., at : at + 2]).view(np.float16)[..., 0].astype(np.float32))


def _f16_field(raw: np.ndarray, block_bytes: int, at: int) -> torch.Tensor:
    """`_f16` in one strided pass (no contiguous copy of the field first) where the blocks lie whole in memory at
    even sizes (Q8_0's 34 bytes, Q4_0's 18, Q4_1's 20): the bytes seen as 16-bit words."""
    if not raw.flags.c_contiguous or block_bytes % 2 or at % 2:
        return _f16(raw.reshape(raw.shape[0], -1, block_bytes), at)
    words = raw.view(np.uint16).reshape(raw.shape[0], -1, block_bytes // 2)[..., at // 2]
    return torch.from_numpy(words.view(np.float16).astype(np.float32))


def _nibbles(qs: np.ndarray) -> torch.Tensor:
    """[rows, blocks, 16] bytes -> uint8 [rows, blocks * 32]: low nibbles are weights 0-15, high ones 16-31."""
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    return torch.from_numpy(np.ascontiguousarray(codes).reshape(qs.shape[0], -1))


def _q4_k(raw: np.ndarray) -> tuple[torch.Tensor, ...]:
    """Q4_K super-blocks of 256 (d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles) as Q4_1's
    (q, scale, min) over their eight sub-blocks of 32: value = q * (d * sc) - dmin * m."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 144)
    sc, m = Q4_K_BLOCKS.get_scale_min(np.ascontiguousarray(blocks[..., 4:16]).reshape(-1, 12))
    scale = _f16(blocks, 0)[..., None] * torch.from_numpy(sc.astype(np.float32)).view(*blocks.shape[:2], 8)
    low = _f16(blocks, 2)[..., None] * torch.from_numpy(m.astype(np.float32)).view(*blocks.shape[:2], 8)
    # 32 bytes per pair of sub-blocks: the low nibbles are the first, the high nibbles the second
    qs = blocks[..., 16:].reshape(rows, -1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(2, 1)
    q = torch.from_numpy(np.ascontiguousarray(qs & 0x0F).reshape(rows, -1))
    return q, scale.reshape(rows, -1), -low.reshape(rows, -1)


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
    if info.qtype == Q.Q4_K:
        return _q4_k(raw)
    if info.qtype == Q.Q5_0:  # scale, 32 high bits (little-endian), then the low nibbles; value = (q - 16) * d
        blocks = raw.reshape(rows, -1, 6 + BLOCK // 2)
        high = np.unpackbits(blocks[..., 2:6], axis=-1, bitorder="little")
        low = np.concatenate([blocks[..., 6:] & 0x0F, blocks[..., 6:] >> 4], axis=-1)
        q = ((low | (high << 4)).astype(np.int8) - 16).reshape(rows, -1)
        return torch.from_numpy(q), _f16(blocks, 0)
    blocks = raw.reshape(rows, -1, 4 + BLOCK // 2)  # Q4_1: scale, min, then the nibbles
    return _nibbles(blocks[..., 4:]), _f16(blocks, 0), _f16(blocks, 2)


DOT_DIRECT = frozenset({Q.Q8_0, Q.Q4_0, Q.Q4_1})  # blocks that are int8_dot's codes in another byte order


def _even_blocks(blocks: np.ndarray) -> np.ndarray:
    """[rows, blocks, bytes] with a zero block appended where the count is odd (int8_dot packs blocks in pairs)."""
    if blocks.shape[1] % 2 == 0:
        return blocks
    return np.concatenate([blocks, np.zeros((blocks.shape[0], 1, blocks.shape[2]), np.uint8)], axis=1)


def dot_codes(info: TensorInfo, raw: np.ndarray) -> tuple[torch.Tensor, ...]:
    """(codes in int8_dot's layout, scale[, min]) of a Q8_0 / Q4_0 / Q4_1 tensor's bytes [rows, bytes per row]: the
    layout `kernels._dot_layout` packs from `codes`' one-byte codes, built from the blocks by byte shuffles alone."""
    rows = raw.shape[0]
    if info.qtype == Q.Q8_0:  # u = q + 128, as bits: two's complement
        blocks = raw.reshape(rows, -1, 2 + BLOCK)
        u = _even_blocks(blocks[..., 2:] ^ np.uint8(0x80))
        return torch.from_numpy(u.reshape(rows, -1)), _f16_field(raw, 2 + BLOCK, 0)
    head = 2 if info.qtype == Q.Q4_0 else 4  # Q4_0: scale; Q4_1: scale, min; then 16 bytes of nibbles
    blocks = raw.reshape(rows, -1, head + BLOCK // 2)
    pairs = _even_blocks(blocks[..., head:]).reshape(rows, -1, 2, BLOCK // 2)
    a, b = pairs[:, :, 0], pairs[:, :, 1]  # a block's byte i holds weights i (low nibble) and i + 16 (high)
    # int8_dot's byte i of a pair holds weight i of the first block (low nibble) and of the second (high)
    low, high = (a & 0x0F) | (b << 4), (a >> 4) | (b & 0xF0)
    codes = torch.from_numpy(np.concatenate([low, high], axis=-1).reshape(rows, -1))
    size = head + BLOCK // 2
    scale = _f16_field(raw, size, 0)
    return (codes, scale) if head == 2 else (codes, scale, _f16_field(raw, size, 2))


def _from_q4_k(q, scale, low) -> QuantizedWeight:
    return replace(from_q4_1(q, scale, low), source="GGUF Q4_K")


def _from_q5_0(q, scale) -> QuantizedWeight:
    return replace(from_q8_0(q, scale), source="GGUF Q5_0")


CONSTRUCTORS = {Q.Q8_0: from_q8_0, Q.Q5_0: _from_q5_0, Q.Q4_0: from_q4_0, Q.Q4_1: from_q4_1, Q.Q4_K: _from_q4_k}
EXACT_BITS = {Q.Q8_0: 8, Q.Q5_0: 8, Q.Q4_0: 4, Q.Q4_1: 4, Q.Q4_K: 4}  # the width each type's codes are kept at


@dataclass(frozen=True, slots=True)
class Form:
    """What one linear layer's file tensors become: a `QuantizedWeight` of `bits` in groups of `group_size`."""

    bits: int
    group_size: int
    source: str  # "GGUF Q4_K" (its codes), "GGUF Q6_K, requantized to int8 groups of 32"
    exact: bool  # the file's codes carried over (else dequantized, then requantized)


def _form(parts: Parts | None, layer: Linear) -> Form | str:
    """The layer's form, or why it keeps the weights it loaded with."""
    if layer.batch_shape:
        return "per-expert weights: the MoE kernel runs them"
    if type(layer.method) is not UnquantizedLinearMethod:
        return f"weights are {layer.method!r}"
    if "weight" not in layer._parameters:
        return "no weight"
    return _type_form(parts)


def _type_form(parts: Parts | None) -> Form | str:
    """The form the file's tensor types give a weight, or why it keeps the weight it loaded with."""
    if not parts:
        return "no tensor of the file fills it"
    if any(index and (len(index) != 1 or not isinstance(index[0], slice)) for _, index in parts):
        return "its parts are not whole row ranges"
    kinds = sorted({info.qtype for info, _ in parts})
    names = "/".join(q.name for q in kinds)
    if any(q not in CONSTRUCTORS and q not in REQUANTIZED for q in kinds):
        return f"stored as {names}: not quantized in the file"
    widths = {EXACT_BITS.get(q) for q in kinds}
    if len(widths) == 1 and None not in widths:
        return Form(widths.pop(), BLOCK, f"GGUF {names}", exact=True)
    unkept = [q.name for q in kinds if q not in EXACT_BITS]
    why = f"no kernel runs {'/'.join(unkept)} codes" if unkept else "parts of 4- and 8-bit types"
    return Form(REQUANT_BITS, REQUANT_GROUP, f"GGUF {names}, requantized to int8 groups of 32 ({why})", False)


def _assemble(reader: GGUFTensorReader, parts: Parts, form: Form) -> QuantizedWeight:
    """One weight [out, in] from its parts, each at its rows (un-permuted like the float path)."""
    ordered = [info for info, _ in sorted(parts, key=lambda p: p[1][0].start if p[1] else 0)]
    if not form.exact:
        dense = torch.cat([reader.values(info) for info in ordered])
        for info in ordered:
            reader.release(info)
        return quantize(dense, form.bits, form.group_size, source=form.source)
    if all(info.qtype in DOT_DIRECT for info in ordered):
        return _assemble_dot_codes(reader, ordered, form)
    pieces = []
    for info in ordered:
        fields = codes(info, reader.raw(info))  # copies of the bytes: the pages can go
        reader.release(info)
        if info.permute_heads:
            fields = tuple(unpermute_rows(f, info.permute_heads) for f in fields)
        pieces.append(CONSTRUCTORS[info.qtype](*fields))
    if len(pieces) == 1:
        return pieces[0]
    q, scale = torch.cat([p.q for p in pieces]), torch.cat([p.scale for p in pieces])
    zero = None if form.bits == 8 else torch.cat([p.zero for p in pieces if p.zero is not None])
    return QuantizedWeight(form.bits, BLOCK, q, scale, zero, form.source)


def _assemble_dot_codes(reader: GGUFTensorReader, ordered: list[TensorInfo], form: Form) -> QuantizedWeight:
    """`_assemble` of Q8_0 / Q4_0 / Q4_1 parts: the codes straight in int8_dot's layout (its packing then copies
    nothing); `QuantizedWeight.q` unpacks them for any other consumer. Scales and zeros as from_q8_0 / from_q4_*."""
    parts = []
    for info in ordered:
        parts.append(dot_part(info, reader.raw(info)))  # copies of the bytes: the pages can go
        reader.release(info)
    codes, scale = _rows([part[0] for part in parts]), _rows([part[1] for part in parts])
    zeros = [part[2] for part in parts if part[2] is not None]  # 4-bit parts' (a fused layer's are of one width)
    zero = _rows(zeros) if zeros else None
    return QuantizedWeight(form.bits, BLOCK, None, scale, zero, form.source, dot_codes=codes)


def dot_part(info: TensorInfo, raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(codes in int8_dot's layout, scale, zero or None for Q8_0) of one Q8_0 / Q4_0 / Q4_1 tensor, rows un-permuted:
    scale and zero as from_q8_0 / from_q4_0 / from_q4_1 give them (value = (u - 8) * scale + zero for 4 bits)."""
    fields = dot_codes(info, raw)
    if info.permute_heads:
        fields = tuple(unpermute_rows(f, info.permute_heads) for f in fields)
    if info.qtype == Q.Q8_0:
        return fields[0], fields[1], None
    zero = fields[2] + 8 * fields[1] if info.qtype == Q.Q4_1 else torch.zeros_like(fields[1])
    return fields[0], fields[1], zero


def _rows(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _parts_by_weight(model: nn.Module, source: GGUFSource) -> dict[int, Parts]:
    """id(weight parameter) -> the file's tensors that fill it (a tied LM head finds the embedding's)."""
    rules = model.checkpoint_rules() if hasattr(model, "checkpoint_rules") else NameRules()
    plan = make_plan(model, source.names, rules)
    params = dict(model.named_parameters())
    parts: dict[int, Parts] = defaultdict(list)
    for name, target in plan.assignments.items():
        if target.param in params:  # not one an MoE kernel repacked and released (held once, by the kernel)
            parts[id(params[target.param])].append((source.entries[name], target.index))
    return parts


def _layers(model: nn.Module, parts: dict[int, Parts]):
    """(path, layer, its parts, its form) of every Linear; works on a model built on `meta` too."""
    for name, layer in model.named_modules():
        if isinstance(layer, Linear):
            weight = layer._parameters.get("weight")
            mine = parts.get(id(weight)) if weight is not None else None
            yield name, layer, mine, _form(mine, layer)


def _table(model: nn.Module, parts: dict[int, Parts]) -> list:
    """[(path, token embedding, its parts, its form)]: the table is held as the file's codes too (a tied LM
    head's are the same parts, assembled once); [] for a family whose table holds no plain `weight`."""
    table = model.input_embeddings() if hasattr(model, "input_embeddings") else None
    weight = table._parameters.get("weight") if table is not None and hasattr(table, "method") else None
    if weight is None:
        return []
    path = next(name for name, module in model.named_modules() if module is table)
    mine = parts.get(id(weight))
    return [(path, table, mine, _type_form(mine))]


def _peak_order(layers: list) -> list:
    """The order that keeps the peak lowest: on meta (load_quantized) nothing is freed as layers go, so the
    largest (the LM head, whose packing copies are the biggest) first, while the least is resident; on a loaded
    model each layer frees its float weight, so module order, which leaves the LM head for when most are freed."""
    on_meta = all(layer.weight.is_meta for _, layer, _, form in layers if not isinstance(form, str))
    return sorted(layers, key=lambda item: -item[1].in_features * item[1].out_features) if on_meta else layers


def forms(model: nn.Module, path: str | Path) -> dict[str, Form | str]:
    """Layer path (and the token embedding's) -> the form its weight takes under `quantization="gguf"`, or why
    it keeps its loaded weight."""
    parts = _parts_by_weight(model, open_source(Path(path)))
    return {name: form for name, _, _, form in [*_layers(model, parts), *_table(model, parts)]}


TABLE_ROWS = "rows dequantized per lookup"  # what a kept-quantized embedding table runs (its report entry)


def keep_quantized(model: nn.Module, path: str | Path) -> dict[str, str]:
    """Layer path -> what it runs now ("GGUF Q4_1 on int4_group"; the token embedding "GGUF Q8_0 on rows
    dequantized per lookup") or why it keeps its loaded weights."""
    source = open_source(Path(path))
    parts_of = _parts_by_weight(model, source)
    layers, table = list(_layers(model, parts_of)), _table(model, parts_of)
    tables = {id(item[2]): item for item in table if isinstance(item[3], Form)}  # by its parts: a tied head's too
    report: dict[str, str] = {name: str(form) for name, _, _, form in [*layers, *table] if not isinstance(form, Form)}
    with source.reader() as reader, torch.inference_mode(), _one_thread():
        for name, module, parts, form in _peak_order(layers):
            if isinstance(form, Form) and parts is not None:
                quantized = _assemble(reader, parts, form)
                report[name] = f"{quantized.source} on {set_quantized_weight(module, quantized).kernel.name}"
                tied = tables.pop(id(parts), None)  # a tied table: set now, so no copy of the codes outlives this
                if tied is not None:
                    report[tied[0]] = _set_table(tied[1], quantized, module.method)
        for name, module, parts, form in tables.values():  # untied tables, or a head that keeps its weight
            report[name] = _set_table(module, _assemble(reader, parts, form), None)
    release_free_heap()
    return {name: report[name] for name, *_ in [*layers, *table]}  # in module order, the table last


def _set_table(module: nn.Module, quantized: QuantizedWeight, head_method) -> str:
    """Hold the token embedding as `quantized`'s codes (and scales) read where its tied head keeps them, if it does."""
    set_quantized_embedding(module, quantized, **head_rows(head_method, quantized))
    return f"{quantized.source} on {TABLE_ROWS}"


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """torch on one thread while the codes are unpacked and packed: ~2,000 small memory-bound ops, each of which, split
    over threads, pays a barrier (and on a busy machine waits for a descheduled thread): SmolLM2's Q4_1 load took
    6-7 s on two threads with both cores shared by other work, 1.1-1.3 s on one, in the same minutes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def head_rows(head_method, quantized: QuantizedWeight) -> dict:
    """Where a tied table reads its rows: the LM head's int8_dot layout holds the codes, and the scales where its
    float16 ones are exactly the table's (a file's blocks), so each is held once, not a copy for each; {} (the table
    keeps its own) for a head on another kernel, or no head."""
    native = getattr(head_method, "native", None)
    if native is None:
        return {}
    rows = {"code_rows": functools.partial(dot_code_rows, native)}
    if holds_scales(native, quantized.scale):
        rows["scale_rows"] = functools.partial(dot_scale_rows, native)
    return rows


def load_quantized(path: str | Path, *, progress: bool | None = None, moe_backend: str | None = None):
    """(model, report): the model in `path` with `keep_quantized`'s forms built straight from the file's codes
    into the kernels' packed form before anything else loads, so those weights never exist as float; the loader
    then reads only the rest (embedding, norms, float and per-expert tensors: the plan skips held weights).
    `LLM(path, quantization="gguf")` loads the same way."""
    from kernelbay_engine import AutoModelForCausalLM

    report: dict[str, str] = {}
    model = AutoModelForCausalLM.from_pretrained(
        path, progress=progress, moe_backend=moe_backend, before_load=lambda m: report.update(keep_quantized(m, path))
    )
    return model, report
