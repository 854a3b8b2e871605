"""`kernelbay explain --tensor-parallel-size N`: what one rank of N holds and runs, worked out on meta (no weights
read): its attention and FFN geometry, its share of the weights and its KV bytes per token. A file run on its own
codes (GGUF) counts each layer it keeps quantized at its codes' bytes, and is refused where a share cuts them."""

from __future__ import annotations

from pathlib import Path


def tensor_parallel_section(config, options: dict) -> dict | None:
    """None without `--tensor-parallel-size` (or with 1); else the per-rank figures, or why N cannot shard it."""
    from kernelbay.errors import ConfigError
    from kernelbay_engine.args import FILE_QUANTIZATION
    from kernelbay_engine.distributed.sharding import file_shard_problems, plan_rank_share
    from kernelbay_engine.distributed.sizes import rank_config, size_problems
    from kernelbay_engine.explain.text import human_bytes

    n = options.get("tensor_parallel_size") or 1
    if n == 1:
        return None
    model_impl, codes = options.get("model_impl", "auto"), _keeps_codes(config, options)
    problems = size_problems(config, n)
    if codes and not problems:
        problems = file_shard_problems(config.source, config, n, quantization=FILE_QUANTIZATION, model_impl=model_impl)
    if problems:
        return _refused(n, problems)
    rank = rank_config(config, n)
    try:
        whole, share, sharded = (coded_rank_share if codes else plan_rank_share)(config, n, model_impl)
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


def _keeps_codes(config, options: dict) -> bool:
    """Whether the model runs on its file's own codes (a GGUF file, unless --quantization none)."""
    from kernelbay_engine.args import FILE_QUANTIZATION, quantization_for

    return quantization_for(options.get("quantization"), Path(config.source)) == FILE_QUANTIZATION


def coded_rank_share(config, n: int, model_impl: str = "auto") -> tuple[int, int, int]:
    """`plan_rank_share` for a file run on its own codes: a layer the file keeps quantized counts its codes (bits per
    weight, float32 scales, and zeros for 4 bits, per group), every other parameter its float bytes."""
    from kernelbay_engine.distributed.sharding import rank_on_meta, rank_rules
    from kernelbay_engine.loading.formats import format_for

    path = Path(config.source)
    fmt = format_for(path)
    whole, model, shards = rank_on_meta(config, n, model_impl)
    forms = fmt.shard_forms(model, path, rank_rules(model, shards), shards.sources)
    total = _coded_bytes(whole, fmt.quantized_forms(whole, path))
    return total, _coded_bytes(model, forms), _coded_bytes(model, forms, shards.sharded)


def _coded_bytes(model, forms: dict, names: set[str] | None = None) -> int:
    """Bytes of `model`'s parameters (on meta, each once), a coded layer's weight at its form's (`forms`: layer path
    -> a record with bits and group_size, or why it keeps float weights)."""
    coded = {f"{path}.weight": form for path, form in forms.items() if not isinstance(form, str)}
    total = 0
    for name, param in model.named_parameters():
        if names is not None and name not in names:
            continue
        form = coded.get(name)
        if form is None:
            total += param.numel() * param.element_size()
            continue
        groups = param.numel() // form.group_size
        total += param.numel() * form.bits // 8 + groups * 4 * (2 if form.bits == 4 else 1)
    return total
