"""Shard a rank's model: which slice of every checkpoint tensor it reads, and how its layers combine over the ranks.

The rank's model is built from its per-rank config (`sizes.rank_config`: its share of the heads, KV heads and FFN
width), so every family's own code builds per-rank projections and attention geometry. This pass compares it with
the whole model (both on meta, nothing allocated) and, for every parameter, reads the split off the shapes:
- a dimension that shrank is split: the rank reads its block of it (its heads; with fewer KV heads than ranks the
  KV head it shares with its neighbours), per part for fused projections (q/k/v, gate/up, GPT-2's c_attn);
- a linear whose input features shrank is row-parallel (`layers.RowParallel`: summed over the ranks, the bias on
  rank 0); one whose output shrank is column-parallel and needs nothing;
- what did not shrink is replicated (norms, MLA's latent projections, DSA's indexer, routers, shared experts).
Three modules are split explicitly: the embedding and the LM head by vocabulary rows, and each MoE layer's experts
by expert (`layers.ExpertParallel`: the engine's stacked `Experts`, or a family's own storage through its
`for_experts`), the router whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from kernelbay.errors import ConfigError
from kernelbay_engine.distributed.group import TensorParallelGroup
from kernelbay_engine.distributed.layers import ExpertParallel, RowParallel, VocabParallelEmbedding, VocabParallelHead
from kernelbay_engine.distributed.parallel import ParallelConfig
from kernelbay_engine.layers.linear import ExpertLinear, Linear, MergedLinear
from kernelbay_engine.layers.moe import Experts, moe_layers
from kernelbay_engine.loading.plan import NameRules, SourcePiece
from kernelbay_engine.models.quant import (
    Fp8BlockLinearMethod,
    LinearQuantization,
    UnquantizedLinearMethod,
    create_weights,
)

if TYPE_CHECKING:
    from kernelbay_engine.models.base import CausalLM


@dataclass
class RankShards:
    """What the pass decided for one rank's model."""

    sources: dict[str, tuple[SourcePiece, ...]] = field(default_factory=dict)
    """Model-side tensor name -> the pieces of the checkpoint tensor this rank reads (absent: the whole tensor)."""
    ignore: list[str] = field(default_factory=list)
    """Regexes of checkpoint tensors this rank does not hold (other ranks' experts)."""
    zero_bias: list[Linear] = field(default_factory=list)
    """Row-parallel linears whose bias only rank 0 adds (the others zero theirs once loaded)."""
    padded: list[str] = field(default_factory=list)
    """Parameters with rows past the checkpoint's (an uneven vocabulary split): zeroed before loading."""
    sharded: set[str] = field(default_factory=set)
    """Parameters this rank holds a share of (not a replica)."""
    rank: int = 0
    file_codes: dict[str, str] = field(default_factory=dict)
    """quantization="gguf": layer path -> what it runs on the rank's share of the file's codes, or why it does not."""


def shard_model(model: nn.Module, whole: nn.Module, parallel: ParallelConfig, group: TensorParallelGroup) -> RankShards:
    """Split `model` (the rank's, on meta) against `whole` (the full model, on meta); see the module docstring."""
    shards = RankShards(rank=parallel.rank)
    skip = _shard_vocabulary(model, parallel, group, shards) | _shard_experts(model, parallel, group, shards)
    whole_modules = dict(whole.named_modules())
    for path, module in model.named_modules():
        if path in skip or any(path.startswith(f"{s}.") for s in skip):
            continue
        reference = whole_modules.get(path)
        if reference is None:
            raise ConfigError(f"tensor parallelism: {path} exists only in the per-rank model; it cannot be sharded")
        _shard_module(path, module, reference, parallel, group, shards)
    return shards


def _shard_module(path, module, reference, parallel, group, shards: RankShards) -> None:
    if isinstance(module, Linear):
        _check_fp8_blocks(path, module, reference)
    if isinstance(module, Linear) and module.in_features != reference.in_features:
        if module.out_features != reference.out_features:
            raise ConfigError(f"tensor parallelism: {path} would be split on both its inputs and outputs")
        module.combine = RowParallel(group)
        if module.has_bias:
            shards.zero_bias.append(module)
    for name, param in module.named_parameters(recurse=False):
        full = reference._parameters[name]
        if param.shape == full.shape:
            continue
        shards.sharded.add(_join(path, name))
        if isinstance(module, MergedLinear) and not isinstance(module, ExpertLinear) and name in MERGED_PARAMS:
            _merged_pieces(path, name, module, reference, parallel, shards)
        else:
            transposed = name == "weight" and module.checkpoint_transposed if isinstance(module, Linear) else False
            shards.sources[_join(path, name)] = (_piece(path, name, param.shape, full.shape, parallel, transposed),)


def _piece(path, name, shape, full_shape, parallel: ParallelConfig, transposed: bool) -> SourcePiece:
    """The one split dimension of a parameter, as a slice of the checkpoint tensor."""
    split = [d for d, (a, b) in enumerate(zip(shape, full_shape, strict=True)) if a != b]
    if len(split) != 1:
        raise ConfigError(
            f"tensor parallelism: {_join(path, name)} {list(full_shape)} -> {list(shape)} is split on {len(split)} "
            "dimensions; only one can be"
        )
    dim = split[0]
    local = shape[dim]
    stored_dim = 1 - dim if transposed else dim
    return SourcePiece(stored_dim, _block(path, name, parallel, full_shape[dim], local) * local, local)


def _block(path: str, name: str, parallel: ParallelConfig, full: int, local: int) -> int:
    try:
        return parallel.block(full, local)
    except ValueError as err:
        raise ConfigError(f"tensor parallelism: {_join(path, name)} cannot be split: {err}") from None


MERGED_PARAMS = ("weight", "bias", "weight_scale_inv")  # a fused projection's parameters split part by part


def _merged_pieces(path, name, module: MergedLinear, reference: MergedLinear, parallel, shards: RankShards) -> None:
    """A fused projection: each part split by head on its own (q/k/v parts differ in size with GQA); an FP8 scale's
    rows are those of its weight's blocks (`_check_fp8_blocks`: each part's share is whole blocks)."""
    out_dim = 1 if name == "weight" and module.checkpoint_transposed else 0
    whole_rows, rows = reference.part_rows(), module.part_rows()
    fused, parent = [], path.rpartition(".")[0]
    for part, (start, local) in rows.items():
        full_start, full = whole_rows[part]
        begin = _block(path, f"{part} part of {name}", parallel, full, local) * local
        mine = _held_rows(module, name, start, local, part)
        first = _held_rows(module, name, begin, local, part).start  # where the rank's share of the part starts
        whole_first = _held_rows(reference, name, full_start, full, part).start
        length = mine.stop - mine.start
        fused.append(SourcePiece(out_dim, whole_first + first, length, mine.start))
        shards.sources[_join(parent, part, name)] = (SourcePiece(0, first, length),)  # a part stored on its own
    shards.sources[_join(path, name)] = tuple(fused)
    if module.in_features != reference.in_features:
        raise ConfigError(f"tensor parallelism: the fused {path} would be split on its inputs too")


def rank_rules(model: CausalLM, shards: RankShards) -> NameRules:
    """The family's checkpoint naming for a rank's model: other ranks' experts ignored too."""
    rules = model.checkpoint_rules()
    return NameRules(rules.renames, (*rules.ignore, *shards.ignore), rules.tied)


def _held_rows(linear: MergedLinear, name: str, start: int, size: int, part: str) -> slice:
    """Rows of parameter `name` holding output rows [start, start + size) (an FP8 scale: its blocks' rows)."""
    method = linear.method
    assert method is not None  # created with the model
    return method.row_slice(linear, name, start, size, part)


def _check_fp8_blocks(path: str, module: Linear, reference: Linear) -> None:
    """An FP8 layer's share must be whole scale blocks (each scale then covers the same weights as in the whole)."""
    method = module.method
    if not isinstance(method, Fp8BlockLinearMethod) or module.batch_shape:
        return
    rows, cols = method.block_size
    parts = module.parts.values() if isinstance(module, MergedLinear) else (module.out_features,)
    cut = []
    if module.out_features != reference.out_features and any(size % rows for size in parts):
        cut.append(f"its share of the outputs ({' + '.join(map(str, parts))} rows) is not whole blocks of {rows} rows")
    if module.in_features != reference.in_features and module.in_features % cols:
        cut.append(f"its share of the inputs ({module.in_features}) is not whole blocks of {cols} columns")
    if cut:
        raise ConfigError(
            f"tensor parallelism: {path} holds FP8 weights with {rows}x{cols} scale blocks, and a rank's share would "
            f"cut them: {'; '.join(cut)}; choose a tensor_parallel_size that splits on whole blocks"
        )


def plan_rank_share(config, n: int, model_impl: str = "auto") -> tuple[int, int, int]:
    """(whole model, one rank's share, the sharded part of that share) in bytes, worked out on meta with no process
    group (nothing communicates): also what refuses, before any rank starts, a model whose tensors cannot split."""
    whole, model, shards = rank_on_meta(config, n, model_impl)
    total = weight_bytes(whole, meta=True)
    return total, weight_bytes(model, meta=True), weight_bytes(model, shards.sharded, meta=True)


def rank_on_meta(config, n: int, model_impl: str = "auto", rank: int = 0) -> tuple[nn.Module, CausalLM, RankShards]:
    """(whole model, rank `rank`'s model, its shards), all on meta, sharded with no process group."""
    from kernelbay_engine.distributed.sizes import rank_config
    from kernelbay_engine.models.auto import AutoModelForCausalLM

    whole = AutoModelForCausalLM.from_config(config, model_impl=model_impl)
    model = cast("CausalLM", AutoModelForCausalLM.from_config(rank_config(config, n), model_impl=model_impl))
    no_group = cast("TensorParallelGroup", None)  # the layers keep it, and never call it here
    return whole, model, shard_model(model, whole, ParallelConfig(n, rank), no_group)


def _shard_vocabulary(model, parallel: ParallelConfig, group: TensorParallelGroup, shards: RankShards) -> set[str]:
    """The embedding and the LM head split by vocabulary rows (the head's logits gathered for sampling)."""
    embedding = model.input_embeddings()
    vocab, hidden = embedding.weight.shape
    rows = parallel.padded_share(vocab)
    first = parallel.rank * rows
    path = _path_of(model, embedding)
    sharded = VocabParallelEmbedding(rows, hidden, first=first, group=group, scale=embedding.scale)
    sharded.weight = nn.Parameter(torch.empty(rows, hidden, dtype=embedding.weight.dtype, device="meta"), False)
    _replace(model, path, sharded)
    held = max(0, min(rows, vocab - first))
    shards.sources[f"{path}.weight"] = (SourcePiece(0, first, held),)
    shards.sharded.add(f"{path}.weight")
    if held < rows:
        shards.padded.append(f"{path}.weight")
    head = model.lm_head
    if head.method is not None and not isinstance(head.method, UnquantizedLinearMethod):
        raise ConfigError(f"tensor parallelism: the LM head's {type(head.method).__name__} weights are not sharded yet")
    with torch.device("meta"):
        local = Linear(hidden, rows, bias=head.has_bias, quantizable=False)
        create_weights(local, LinearQuantization(), embedding.weight.dtype)
    local.combine = VocabParallelHead(group, vocab)
    model.lm_head = local
    shards.sharded.add("lm_head.weight")  # tied: the table's rows, or the head's own codes of them (GGUF)
    if model.tied:
        model.tie_weights()
    else:
        shards.sources["lm_head.weight"] = (SourcePiece(0, first, held),)
        if held < rows:
            shards.padded.append("lm_head.weight")
    if head.has_bias:
        raise ConfigError("tensor parallelism: an LM head with a bias is not sharded yet")
    return {path, "lm_head"}


def _shard_experts(model, parallel: ParallelConfig, group: TensorParallelGroup, shards: RankShards) -> set[str]:
    """Each MoE layer keeps experts [rank * E/N, (rank + 1) * E/N); the router and any shared expert stay whole."""
    done = set()
    dtype = model.input_embeddings().weight.dtype  # the model's (an FP8 expert's weight is stored as FP8)
    for layer in moe_layers(model):
        path = _path_of(model, layer)
        geometry, old = layer.geometry, layer.experts
        count = geometry.num_experts // parallel.world_size
        first = parallel.rank * count
        layer.geometry = replace(geometry, num_experts=count, top_k=min(geometry.top_k, count))
        local = _local_experts(old, layer.geometry, first, dtype)
        layer.experts = cast("Experts", local)  # or a family's own storage with Experts' interface (GPT-OSS's)
        layer.expert_parallel = ExpertParallel(first, count, group)
        for name, _ in local.named_parameters():  # transformers' stacked layout [E, ...]
            shards.sources[f"{path}.experts.{name}"] = (SourcePiece(0, first, count),)
        shards.sharded.update(f"{path}.experts.{n}" for n, _ in local.named_parameters())
        others = [str(e) for e in range(geometry.num_experts) if not first <= e < first + count]
        if others:
            shards.ignore.append(rf"{re.escape(path)}\.experts\.(?:{'|'.join(others)})\..*")
        done.add(f"{path}.experts")
    return done


def _local_experts(old: nn.Module, geometry, first: int, dtype: torch.dtype) -> nn.Module:
    """The rank's experts [first, first + geometry.num_experts), on meta: the engine's stacked `Experts` in the
    whole layer's weight format, or a family's own storage through its `for_experts(geometry)` (GPT-OSS's
    interleaved or MXFP4-packed experts, each expert's tensors whole)."""
    if not isinstance(old, Experts):
        for_experts = getattr(old, "for_experts", None)
        if for_experts is None:
            raise ConfigError(
                f"tensor parallelism: the experts module {type(old).__name__} cannot be split across ranks; give it "
                "for_experts(geometry) (the same storage for fewer experts, on meta) or use the engine's Experts"
            )
        return for_experts(geometry)
    gate, up = old.gate_up_proj.parts
    (down,) = old.down_proj.parts
    with torch.device("meta"):
        local = Experts(
            geometry.hidden_size,
            geometry.intermediate_size,
            geometry.num_experts,
            bias=geometry.has_bias,
            names=(gate, up, down),
        )
        create_weights(local, _format_of(old.gate_up_proj), dtype)
    for linear in (local.gate_up_proj, local.down_proj):
        linear.first_expert = first  # per-expert checkpoint names keep their global number
    return local


def _format_of(experts: Linear) -> LinearQuantization:
    """The weight format of an MoE layer's experts (FP8 blocks, or plain), for the rank's own experts."""
    method = experts.method
    return LinearQuantization(method.block_size) if isinstance(method, Fp8BlockLinearMethod) else LinearQuantization()


def _path_of(model: nn.Module, target: nn.Module) -> str:
    return next(path for path, m in model.named_modules() if m is target)


def _replace(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, module)


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def weight_bytes(model: nn.Module, names: set[str] | None = None, *, meta: bool = False) -> int:
    """Bytes of `model`'s loaded parameters (each storage once) and of the weights its layers hold quantized (a GGUF
    file's codes: `<layer>.weight`), or of those named in `names`; `meta=True` counts a model built on meta (each
    parameter once) instead."""
    if meta:
        params = dict(model.named_parameters())
        return sum(p.numel() * p.element_size() for name, p in params.items() if names is None or name in names)
    return _parameter_bytes(model, names) + _quantized_bytes(model, names)


def _quantized_bytes(model: nn.Module, names: set[str] | None) -> int:
    """Bytes of the codes quantized layers and embedding tables hold in place of a `weight` parameter."""
    from kernelbay_engine.quant import QuantizedEmbedding, QuantizedLinearMethod

    total = 0
    for path, module in model.named_modules():
        method = getattr(module, "method", None)
        if isinstance(method, (QuantizedLinearMethod, QuantizedEmbedding)) and (
            names is None or _join(path, "weight") in names
        ):
            total += method.nbytes
    return total


def _parameter_bytes(model: nn.Module, names: set[str] | None) -> int:
    seen, total = set(), 0
    for name, p in model.named_parameters(remove_duplicate=False):
        if (names is not None and name not in names) or p.is_meta:
            continue
        key = (p.untyped_storage().data_ptr(), p.storage_offset())
        if key not in seen:
            seen.add(key)
            total += p.numel() * p.element_size()
    return total


def check_file_shards(folder, config, n: int, *, quantization: str | None, model_impl: str = "auto") -> None:
    """Refuse, before any rank starts, weights a rank cannot read its share of (`file_shard_problems`)."""
    from kernelbay_engine.args import EngineArgumentError

    problems = file_shard_problems(folder, config, n, quantization=quantization, model_impl=model_impl)
    if problems:
        raise EngineArgumentError(f"tensor_parallel_size={n} cannot run {folder}: " + "; ".join(problems))


def file_shard_problems(folder, config, n: int, *, quantization: str | None, model_impl: str = "auto") -> list[str]:
    """Why the ranks cannot read their shares of the weights at `folder`: a format that cannot read slices, or a
    file's own quantized codes (quantization="gguf") that a rank's share would cut (worked out on meta)."""
    from pathlib import Path

    from kernelbay_engine.args import FILE_QUANTIZATION
    from kernelbay_engine.loading import open_checkpoint
    from kernelbay_engine.loading.formats import format_for

    if n == 1:
        return []
    path = Path(folder)
    fmt = format_for(path)
    if not hasattr(open_checkpoint(path).reader(), "read_slice_into"):
        return [f"{fmt.name} weights cannot be read in slices (each rank reads only its share)"]
    if quantization != FILE_QUANTIZATION:
        return []
    if not hasattr(fmt, "shard_problems"):
        return [f"{fmt.name} files cannot keep their own codes sharded; quantization='none' dequantizes them"]
    _, model, shards = rank_on_meta(config, n, model_impl)
    return fmt.shard_problems(model, path, rank_rules(model, shards), shards.sources)
