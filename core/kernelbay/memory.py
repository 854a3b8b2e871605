"""How many KV-cache blocks a memory budget buys."""

from __future__ import annotations

import math
import re

DEFAULT_KV_CACHE_MEMORY = 512 * 2**20
"""Cap of the default cache: enough for max_num_seqs full-context requests, at most this many bytes."""

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}
_MEMORY = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_memory(value: int | float | str) -> int:
    """Bytes from an int (bytes) or a string with a unit: "512MiB", "2GiB", "1.5GB"."""
    if isinstance(value, bool):
        raise ValueError(f"memory must be a number of bytes or a string like '2GiB', got {value!r}")
    if isinstance(value, (int, float)):
        amount = float(value)
    else:
        match = _MEMORY.match(str(value))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(f"cannot read memory size {value!r}; write bytes or a number with a unit "
                             f"such as '512MiB', '2GiB' or '1.5GB'")
        amount = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(amount) or amount <= 0:
        raise ValueError(f"memory must be positive, got {value!r}")
    return int(amount)


def tokens_that_fit(memory_bytes: int, bytes_per_token: int) -> int:
    """Tokens of KV cache `memory_bytes` holds (every layer of the model cached per token)."""
    return memory_bytes // bytes_per_token if bytes_per_token > 0 else 0


def plan_num_blocks(*, bytes_per_token: int, block_size: int, kv_cache_memory: int | float | str | None,
                    max_num_seqs: int, max_model_len: int) -> int:
    """Blocks for an explicit budget, or by default for max_num_seqs full-context requests (capped)."""
    block_bytes = max(1, bytes_per_token * block_size)
    if kv_cache_memory is not None:
        budget = parse_memory(kv_cache_memory)
    else:
        budget = min(DEFAULT_KV_CACHE_MEMORY, max_num_seqs * max_model_len * bytes_per_token)
        budget = max(budget, max_model_len * bytes_per_token)
    blocks = budget // block_bytes
    if blocks < 1:
        raise ValueError(f"kv_cache_memory {kv_cache_memory!r} holds no KV-cache block ({block_bytes} bytes = "
                         f"{block_size} tokens x {bytes_per_token} bytes); give it at least that much")
    return int(blocks)
