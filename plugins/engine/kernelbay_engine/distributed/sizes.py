"""What tensor parallelism of N can shard, checked before any weight is read, and the per-rank config a rank's
model is built from (its heads, KV heads and FFN width; hidden size, vocabulary and experts stay whole in it)."""

from __future__ import annotations

import os
from dataclasses import replace

from kernelbay_engine.args import EngineArgumentError


def size_problems(config, n: int) -> list[str]:
    """Every reason `config` cannot run at tensor_parallel_size=n (empty: it can)."""
    if n == 1:
        return []
    problems = []
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    if heads % n:
        problems.append(f"num_attention_heads={heads} is not divisible by {n} (each rank takes an equal share)")
    if config.mla is None and kv % n and n % kv:
        problems.append(
            f"num_key_value_heads={kv} neither divides by {n} nor divides {n} (KV heads are split, or replicated "
            f"when fewer than the ranks)"
        )
    if config.intermediate_size % n:
        problems.append(f"intermediate_size={config.intermediate_size} is not divisible by {n}")
    if config.moe is not None and config.moe.num_experts % n:
        problems.append(f"the {config.moe.num_experts} experts do not split evenly over {n} ranks")
    return problems + _unsupported(config)


def _unsupported(config) -> list[str]:
    """What the sharded layers do not handle yet (refused, never run wrong)."""
    problems = []
    method = config.quantization.quant_method if config.quantization is not None else None
    if method not in _SHARDED_METHODS:
        problems.append(f"{method} checkpoints are not sharded yet: no rule splits their weights")
    if len(set(config.layer_num_kv_heads) - {0}) > 1:  # Nemotron-NAS's per-layer grouping (a config, not built)
        problems.append("layers with different KV head counts are not sharded yet")
    return problems


# fp8: weights and block scales split together (sharding._check_fp8_blocks); mxfp4: only experts are packed, and
# they split whole (each expert's blocks and scales with it)
_SHARDED_METHODS = (None, "fp8", "mxfp4")


def check_tensor_parallel(config, n: int, *, source: str, quantization: str | None = None) -> None:
    """Refuse, with every reason, a tensor_parallel_size this model or machine cannot run (before any load)."""
    problems = size_problems(config, n) + _group_problems(config, n, quantization)
    limit = max_ranks()
    if n > limit:
        problems.append(f"this machine runs at most {limit} ranks (one per CPU core{_gpu_note()})")
    if problems:
        raise EngineArgumentError(
            f"tensor_parallel_size={n} cannot run {config.architecture} ({source}): " + "; ".join(problems)
        )


def _group_problems(config, n: int, quantization: str | None) -> list[str]:
    """Each rank quantizes its own shard once loaded: a row-parallel linear's input share must hold whole groups, so
    that its groups are those of the unsharded weight."""
    from kernelbay_engine.args import FILE_QUANTIZATION

    if n == 1 or quantization in (None, FILE_QUANTIZATION):  # a file's codes: file_shard_problems checks them
        return []
    from kernelbay_engine.quant.method import quant_mode

    group = quant_mode(quantization).group_size
    if group is None:  # per output row: a rank's scale covers its share of the row
        return []
    widths = {
        "the attention output's input share (heads x v_head_dim / N)": config.num_attention_heads
        * config.v_head_dim
        // n,
        "the FFN down projection's input share (intermediate_size / N)": config.intermediate_size // n,
    }
    return [
        f"quantization={quantization!r} quantizes groups of {group} inputs, but {what} is {width}"
        for what, width in widths.items()
        if width % group
    ]


def check_options(n: int, *, model_impl: str) -> None:
    """Options sharded ranks cannot honour, refused by name."""
    if n > 1 and model_impl == "transformers":
        raise EngineArgumentError("model_impl='transformers' (the fallback) is not sharded; use model_impl='native'")


def max_ranks() -> int:
    """Ranks this machine can run: one per CUDA device where there are any, else one per CPU core."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count()
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _gpu_note() -> str:
    return "" if max_ranks() == (os.cpu_count() or 1) else " or CUDA device"


def rank_config(config, n: int):
    """The config one of `n` ranks builds its model from: its share of the heads, KV heads and FFN width."""
    if n == 1:
        return config
    kv = max(config.num_key_value_heads // n, 1)
    return replace(
        config,
        num_attention_heads=config.num_attention_heads // n,
        num_key_value_heads=kv,
        layer_num_kv_heads=tuple(kv if k else 0 for k in config.layer_num_kv_heads),
        intermediate_size=config.intermediate_size // n,
    )
