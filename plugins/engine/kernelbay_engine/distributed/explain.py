"""`kernelbay explain --tensor-parallel-size N`: what one rank of N holds and runs, worked out on meta (no weights
read): its attention and FFN geometry, its share of the weights and its KV bytes per token."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from kernelbay_engine.distributed.group import TensorParallelGroup


def tensor_parallel_section(config, options: dict) -> dict | None:
    """None without `--tensor-parallel-size` (or with 1); else the per-rank figures, or why N cannot shard it."""
    from kernelbay_engine.distributed.sizes import rank_config, size_problems
    from kernelbay_engine.explain.text import human_bytes

    n = options.get("tensor_parallel_size") or 1
    if n == 1:
        return None
    problems = size_problems(config, n)
    if problems:
        return {
            "tensor_parallel_size": n,
            "refused": problems,
            "lines": [f"tensor par.  N={n} refused: {p}" for p in problems],
        }
    rank = rank_config(config, n)
    whole, share, sharded = _weight_bytes(config, n, options.get("model_impl", "auto"))
    kv_dtype = options.get("kv_cache_dtype", "auto")
    section = {
        "tensor_parallel_size": n,
        "per_rank": {
            "attention_heads": rank.num_attention_heads,
            "kv_heads": rank.num_key_value_heads if config.mla is None else 0,
            "intermediate_size": rank.intermediate_size,
            "experts": config.moe.num_experts // n if config.moe is not None else 0,
            "weight_bytes": share,
            "sharded_weight_bytes": sharded,
            "kv_bytes_per_token": rank.kv_bytes_per_token(kv_dtype),
        },
        "whole_weight_bytes": whole,
        "dtype": config.dtype,
    }
    r = section["per_rank"]
    experts = f", {r['experts']} experts" if r["experts"] else ""
    kv = "latent replicated (MLA)" if config.mla is not None else f"{r['kv_heads']} KV heads"
    section["lines"] = [
        f"tensor par.  N={n}, per rank: {r['attention_heads']} heads, {kv}, FFN {r['intermediate_size']}{experts}",
        f"             weights {human_bytes(share)} of {human_bytes(whole)} per rank ({human_bytes(sharded)} "
        f"sharded, the rest replicated); KV cache {r['kv_bytes_per_token']:,} bytes/token per rank",
    ]
    return section


def _weight_bytes(config, n: int, model_impl: str) -> tuple[int, int, int]:
    """(whole model, one rank's share, the sharded part of that share) in bytes, from the models built on meta."""
    from kernelbay_engine.distributed.load import weight_bytes
    from kernelbay_engine.distributed.parallel import ParallelConfig
    from kernelbay_engine.distributed.sharding import shard_model
    from kernelbay_engine.distributed.sizes import rank_config
    from kernelbay_engine.models.auto import AutoModelForCausalLM

    whole = AutoModelForCausalLM.from_config(config, model_impl=model_impl)
    total = weight_bytes(whole, meta=True)
    model = AutoModelForCausalLM.from_config(rank_config(config, n), model_impl=model_impl)
    no_group = cast("TensorParallelGroup", None)  # nothing runs here: the layers never call it
    shards = shard_model(model, whole, ParallelConfig(n, 0), no_group)
    return total, weight_bytes(model, meta=True), weight_bytes(model, shards.sharded, meta=True)
