"""How many KV-cache blocks a memory budget buys, priced at what one block really takes in every layer's cache."""

from __future__ import annotations

import math

from kernelbay.memory import parse_memory

DEFAULT_KV_CACHE_MEMORY = 512 * 2**20
"""Cap of the default cache: enough for max_num_seqs full-context requests, at most this many bytes."""


def plan_num_blocks(
    *,
    bytes_per_block: int,
    block_size: int,
    kv_cache_memory: int | float | str | None,
    max_num_seqs: int,
    max_model_len: int,
) -> int:
    """Blocks for an explicit budget, or by default for max_num_seqs full-context requests (capped).

    `bytes_per_block`: one block across every attention layer, i.e. the sum of the allocated specs'
    `page_size_bytes` (scales and all), so the plan and the cache tensors agree on what a block costs.
    """
    if bytes_per_block < 1:
        raise ValueError(f"bytes_per_block must be positive, got {bytes_per_block!r}")
    if kv_cache_memory is not None:
        blocks = parse_memory(kv_cache_memory) // bytes_per_block
    else:
        full_context = math.ceil(max_model_len / block_size)  # blocks one full-context request holds
        blocks = max(min(DEFAULT_KV_CACHE_MEMORY // bytes_per_block, max_num_seqs * full_context), full_context)
    if blocks < 1:
        raise ValueError(
            f"kv_cache_memory {kv_cache_memory!r} holds no KV-cache block (one block of {block_size} "
            f"tokens takes {bytes_per_block} bytes across the model's layers); give it at least that much"
        )
    return int(blocks)
