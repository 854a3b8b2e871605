"""`kernelbay explain --tensor-parallel-size N`: what one rank of N holds and runs, worked out on meta (no weights
read): its attention and FFN geometry, its share of the weights and its KV bytes per token."""

from __future__ import annotations


def tensor_parallel_section(config, options: dict) -> dict | None:
    """None without `--tensor-parallel-size` (or with 1); else the per-rank figures, or why N cannot shard it."""
    from kernelbay.errors import ConfigError
    from kernelbay_engine.distributed.sharding import plan_rank_share
    from kernelbay_engine.distributed.sizes import rank_config, size_problems
    from kernelbay_engine.explain.text import human_bytes

    n = options.get("tensor_parallel_size") or 1
    if n == 1:
        return None
    problems = size_problems(config, n)
    if problems:
        return _refused(n, problems)
    rank = rank_config(config, n)
    try:
        whole, share, sharded = plan_rank_share(config, n, options.get("model_impl", "auto"))
    except ConfigError as err:  # a tensor that cannot split (an FP8 share that cuts its scale blocks)
        return _refused(n, [str(err)])
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


def _refused(n: int, problems: list[str]) -> dict:
    return {
        "tensor_parallel_size": n,
        "refused": problems,
        "lines": [f"tensor par.  N={n} refused: {p}" for p in problems],
    }
