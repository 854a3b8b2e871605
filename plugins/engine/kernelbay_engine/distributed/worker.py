"""A worker rank: rebuild the parent's registry, join the group, load its shard, then run every step the driver
broadcasts until it says stop. Started by `torch.multiprocessing` (`spawn_entry`), or in each non-zero rank of a
`torchrun` launch (`serve_rank`)."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field

from kernelbay_engine.distributed.group import Rendezvous, TensorParallelGroup
from kernelbay_engine.distributed.parallel import ParallelConfig
from kernelbay_engine.distributed.protocol import Allocate, GatherEmbedding, RankReport, Step, Stop


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything a rank needs to load its shard the way the driver loads its own (picklable)."""

    folder: str
    world_size: int
    rendezvous: Rendezvous
    timeout_s: float
    options: dict = field(default_factory=dict)
    """dtype, model_impl, moe_backend, attention_backend, attention_backend_options, kv_cache_dtype, block_size,
    trust_remote_code, prepack_weights, max_num_seqs, quantization."""
    handoff: dict | None = None
    """The parent's registry (`handoff.registry_handoff`); None under torchrun (every rank ran the same script)."""
    threads: int = 1


def spawn_entry(index: int, spec: WorkerSpec) -> None:
    """`torch.multiprocessing` target: worker `index` is rank index + 1 (the driver is rank 0)."""
    imported: list[str] = []
    if spec.handoff is not None:
        from kernelbay_engine.distributed.handoff import adopt_registry

        imported = adopt_registry(spec.handoff)
    serve_rank(spec, ParallelConfig(spec.world_size, index + 1), imported)


def serve_rank(spec: WorkerSpec, parallel: ParallelConfig, imported_at_start: Sequence[str] = ()) -> None:
    """Join, load, report, then serve steps until Stop; a failure is left in the store for the driver, then raised."""
    import torch

    torch.set_num_threads(spec.threads)
    group = TensorParallelGroup.join(parallel, spec.rendezvous, timeout_s=spec.timeout_s)
    try:
        runner, shards = build_rank_runner(spec, group)
        group.gather(rank_report(runner, shards, tuple(imported_at_start)))
        _quantize_and_prepack(runner.model, spec.options)  # after the report, which counts the loaded weights
        _serve(runner, group)
    except BaseException as err:
        group.report_failure(f"{type(err).__name__}: {err}"[:2000])
        traceback.print_exc(file=sys.stderr)
        group.close(abort=True)
        raise
    group.close()


def _serve(runner, group: TensorParallelGroup) -> None:
    while True:
        message = group.broadcast()
        if isinstance(message, Stop):
            group.barrier()  # the driver waits for every rank to have read Stop before anyone closes
            return
        if isinstance(message, Allocate):
            runner.allocate_cache(message.num_blocks)
        elif isinstance(message, Step):
            runner.step_with_all_logits(message.requests, message.every_position)
        elif isinstance(message, GatherEmbedding):
            from kernelbay_engine.distributed.layers import whole_embedding

            whole_embedding(runner.model)  # the driver keeps the gathered table
        else:
            raise TypeError(f"unexpected message from the driver: {message!r}")


def _quantize_and_prepack(model, options: dict) -> None:
    """A worker's linears quantized and prepacked as the driver's LLM does its own (same mode and policy)."""
    from kernelbay_engine.args import FILE_QUANTIZATION
    from kernelbay_engine.layers.prepack import prepack_linear_weights
    from kernelbay_engine.quant import quantize_model

    if options.get("quantization") not in (None, FILE_QUANTIZATION):  # a file's own codes were kept as it loaded
        quantize_model(model, options["quantization"])

    prepack_linear_weights(model, policy=options.get("prepack_weights", "auto"))


def build_rank_runner(spec: WorkerSpec, group: TensorParallelGroup, runner_cls=None):
    """This rank's model and runner (cache planned, not allocated), loaded as the driver loads rank 0's."""
    from kernelbay_engine.args import FILE_QUANTIZATION
    from kernelbay_engine.config import ModelConfig
    from kernelbay_engine.distributed.load import load_rank_model
    from kernelbay_engine.runner import ModelRunner

    o = spec.options
    config = ModelConfig.from_pretrained(spec.folder, trust_remote_code=o.get("trust_remote_code", False))
    model, shards = load_rank_model(
        spec.folder,
        config,
        group,
        dtype=o.get("dtype"),
        model_impl=o.get("model_impl", "auto"),
        moe_backend=o.get("moe_backend"),
        attention_backend=o.get("attention_backend"),
        file_codes=o.get("quantization") == FILE_QUANTIZATION,
    )
    runner = (runner_cls or ModelRunner)(
        model,
        block_size=o.get("block_size", 16),
        attention_backend=o.get("attention_backend"),
        kv_cache_dtype=o.get("kv_cache_dtype", "auto"),
        attention_backend_options=o.get("attention_backend_options"),
    )
    return runner, shards


def rank_report(runner, shards, imported_at_start: tuple[str, ...] = ()) -> RankReport:
    """What this rank holds and runs (`shards`: the sharding pass's `RankShards` for its model)."""
    from kernelbay_engine.distributed.handoff import registry_summary
    from kernelbay_engine.distributed.sharding import weight_bytes
    from kernelbay_engine.layers.moe import moe_layers

    model = runner.model
    moe = [layer.backend.name for layer in moe_layers(model) if layer.backend is not None]
    config = model.config
    return RankReport(
        rank=shards.rank,
        pid=os.getpid(),
        weight_bytes=weight_bytes(model),
        sharded_weight_bytes=weight_bytes(model, shards.sharded),
        bytes_per_block=runner.bytes_per_block,
        attention_backends=tuple((kind, r.backend_name) for kind, r in runner.cache.selection.groups),
        moe_backend=moe[0] if moe else None,
        geometry=(config.num_attention_heads, config.num_key_value_heads, config.intermediate_size),
        registry=tuple(registry_summary()),
        imported_at_start=imported_at_start,
    )
