"""How many KV-cache blocks a memory budget buys, priced at what one block really takes in every layer's cache."""

from __future__ import annotations

import math

from kernelbay.errors import RequestTooLarge
from kernelbay.memory import parse_memory

DEFAULT_KV_CACHE_MEMORY = 512 * 2**20
"""Cap of the default cache: enough for max_num_seqs full-context requests, at most this many bytes."""


class KVCacheTooSmall(RequestTooLarge, ValueError):
    """The cache budget holds no block at all, so no request could ever run (exit code 12)."""


def plan_num_blocks(
    *,
    bytes_per_block: int,
    block_size: int,
    kv_cache_memory: int | float | str | None,
    max_num_seqs: int,
    max_model_len: int,
) -> int:
    """Blocks for an explicit budget, or by default for max_num_seqs full-context requests, capped at 512 MiB.

    The cap is a cap: when one full-context request does not fit it, the cache is the cap, and a request
    that needs more than the whole cache is refused when it is submitted (RequestTooLarge).
    `bytes_per_block`: one block across every attention layer, i.e. the sum of the allocated specs'
    `page_size_bytes` (scales and all), so the plan and the cache tensors agree on what a block costs.
    """
    if bytes_per_block < 1:
        raise ValueError(f"bytes_per_block must be positive, got {bytes_per_block!r}")
    if kv_cache_memory is not None:
        blocks = parse_memory(kv_cache_memory) // bytes_per_block
        what = f"kv_cache_memory {kv_cache_memory!r}"
    else:
        full_context = math.ceil(max_model_len / block_size)  # blocks one full-context request holds
        blocks = min(DEFAULT_KV_CACHE_MEMORY // bytes_per_block, max_num_seqs * full_context)
        what = "the default KV cache (512 MiB)"
    if blocks < 1:
        raise KVCacheTooSmall(
            f"{what} holds no KV-cache block (one block of {block_size} tokens takes {bytes_per_block} "
            f"bytes across the model's layers); give kv_cache_memory at least that much"
        )
    return int(blocks)
