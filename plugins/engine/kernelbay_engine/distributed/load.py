"""A rank's model: built from its per-rank config on meta, sharded against the whole model, and filled with only
its slices of the checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from kernelbay_engine.distributed.group import TensorParallelGroup
from kernelbay_engine.distributed.sharding import RankShards, rank_rules, shard_model
from kernelbay_engine.distributed.sizes import rank_config
from kernelbay_engine.layers.moe import bind_moe_backends
from kernelbay_engine.loading import load_weights, open_checkpoint
from kernelbay_engine.loading.formats import format_for

if TYPE_CHECKING:
    from kernelbay_engine.models.base import CausalLM


def load_rank_model(
    folder,
    config,
    group: TensorParallelGroup,
    *,
    dtype: str | None = None,
    model_impl: str = "auto",
    moe_backend: str | None = None,
    attention_backend: str | None = None,
    progress: bool | None = False,
    file_codes: bool = False,
) -> tuple[nn.Module, RankShards]:
    """This rank's share of the model at `folder` (`config`: its whole ModelConfig), loaded, MoE kernels bound;
    `file_codes`: its linears keep the file's own quantized codes (a GGUF file's, `quantization="gguf"`), read from
    the rank's share of each tensor before the rest loads."""
    from kernelbay_engine.models.auto import AutoModelForCausalLM

    parallel = group.parallel
    whole = AutoModelForCausalLM.from_config(config, dtype=dtype, model_impl=model_impl)
    model = cast(
        "CausalLM",
        AutoModelForCausalLM.from_config(rank_config(config, parallel.world_size), dtype=dtype, model_impl=model_impl),
    )
    shards = shard_model(model, whole, parallel, group)
    del whole
    for name in shards.padded:  # rows past the checkpoint's (uneven vocabulary split) stay zero
        _zeros(model, name)
    model.tie_weights()  # a tied head shares the zeroed table
    rules = rank_rules(model, shards)
    if file_codes:
        shards.file_codes = format_for(Path(folder)).keep_quantized_shard(model, Path(folder), rules, shards.sources)
    load_weights(model, open_checkpoint(folder), rules, progress=progress, sources=shards.sources)
    model.tie_weights()
    if not parallel.is_driver:  # a row-parallel bias is added once, by rank 0
        for linear in shards.zero_bias:
            linear.bias.data.zero_()
    bind_moe_backends(model, moe_backend)  # each layer's kernel built for this rank's experts
    model.requested_attention_backend = attention_backend
    model.eval()
    return model, shards


def _zeros(model: nn.Module, name: str) -> None:
    module_path, _, attr = name.rpartition(".")
    module = model.get_submodule(module_path)
    param = module._parameters[attr]
    assert param is not None
    module._parameters[attr] = nn.Parameter(torch.zeros(param.shape, dtype=param.dtype), requires_grad=False)
