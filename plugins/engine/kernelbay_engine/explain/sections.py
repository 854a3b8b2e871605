"""The explain document's `sections`: `kv_memory`, what `--memory` holds in the engine's KV-cache blocks,
`linear_kernels` (`--quantization`, quant/explain.py), `prepack` (how plain CPU linears are packed,
layers/prepack.py), `tensor_parallel` (distributed/explain.py) and `draft` (an
EAGLE-3 draft folder, speculative/explain.py). `prepack` answers for every model whose linears keep plain weights;
the others answer None when their option is not given (or the model is no
draft); they import torch only when asked for.
"""

from __future__ import annotations

from kernelbay.errors import KernelbayError
from kernelbay_engine.memory import DEFAULT_BLOCK_SIZE, MemorySizeError, parse_memory


def _linear_kernels(config, options: dict) -> dict | None:
    from kernelbay_engine.quant.explain import linear_kernels_section

    return linear_kernels_section(config, options)


def _prepack(config, options: dict) -> dict | None:
    """How the CPU linears of a model with plain weights are packed (None where linear_kernels answers instead: a
    GGUF file's codes, or --quantization int8 / int4)."""
    from pathlib import Path

    from kernelbay_engine.args import NO_QUANTIZATION, quantization_for

    requested = options.get("quantization")
    if requested not in (None, NO_QUANTIZATION) or quantization_for(requested, Path(config.source)) is not None:
        return None
    from kernelbay_engine.layers.prepack import explain_rule

    return explain_rule(config.dtype)


def _tensor_parallel(config, options: dict) -> dict | None:
    from kernelbay_engine.distributed.explain import tensor_parallel_section

    return tensor_parallel_section(config, options)


def kv_memory_section(config, options: dict) -> dict | None:
    """None without `--memory`; else the tokens it holds in whole blocks, as `LLM(kv_cache_memory=...)` does."""
    from .text import human_bytes

    if options.get("memory") is None:
        return None
    try:
        budget = parse_memory(options["memory"])
    except MemorySizeError as err:
        raise MemorySizeError(f"--memory: {err}") from None
    block = bytes_per_block(config, options.get("backend"), options.get("kv_cache_dtype", "auto"))
    blocks = budget // block if block else 0
    section: dict = {
        "memory_bytes": budget,
        "block_size": DEFAULT_BLOCK_SIZE,
        "bytes_per_block": block,
        "tokens_that_fit": blocks * DEFAULT_BLOCK_SIZE,
    }
    priced = f"{blocks:,} blocks of {DEFAULT_BLOCK_SIZE} tokens, {human_bytes(block)} each" if block else "no KV cache"
    section["lines"] = [f"kv memory    {human_bytes(budget)} holds {blocks * DEFAULT_BLOCK_SIZE:,} tokens ({priced})"]
    return section


def bytes_per_block(config, backend: str | None, kv_cache_dtype: str, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """One block across every layer, priced as the engine prices it: by the chosen backends' own cache specs
    (`page_size_bytes`, scales and all); by the config's bytes per token where no backend is selected."""
    from kernelbay_engine.selection import select_attention

    per_layer = config.layer_kv_bytes_per_token(kv_cache_dtype)
    try:
        selection = select_attention(config, kv_cache_dtype=kv_cache_dtype, requested=backend)
    except KernelbayError:  # no backend can run it: explain's attention section says why
        return sum(per_layer) * block_size
    return sum(
        _layer_page(config, i, selection, kv_cache_dtype, block_size, per_layer[i]) for i in range(len(per_layer))
    )


def _layer_page(config, index: int, selection, kv_cache_dtype: str, block_size: int, config_bytes: int) -> int:
    if config_bytes == 0:  # a layer without a cache
        return 0
    try:
        geometry = config.layer_geometry(index, scale=1.0)  # the scale does not change the cache
        backend = selection.backend_for(config.layer_types[index]).backend_cls
        spec = backend.get_kv_cache_spec(geometry, config.dtype, kv_cache_dtype, block_size)
        return int(spec.page_size_bytes)
    except ValueError:  # a geometry the config cannot describe exactly: price it as the config does
        return config_bytes * block_size


def _draft(config, options: dict) -> dict | None:
    if not config.is_draft:
        return None
    from kernelbay_engine.speculative.explain import draft_section

    return draft_section(config, options)


# Section name -> `section(config, options) -> dict | None`, in the document's order.
SECTIONS = {
    "kv_memory": kv_memory_section,
    "linear_kernels": _linear_kernels,
    "prepack": _prepack,
    "tensor_parallel": _tensor_parallel,
    "draft": _draft,
}
