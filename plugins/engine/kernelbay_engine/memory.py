"""Memory sizes as users write them, and how many KV-cache blocks a budget buys, priced at what one block really
takes in every layer's cache."""

from __future__ import annotations

import contextlib
import errno
import math
import re
from collections.abc import Iterator

from kernelbay.errors import InputError
from kernelbay_engine.errors import RequestTooLarge


class MemorySizeError(InputError, ValueError):
    """A memory size that cannot be read or is not positive (a ValueError too, as it always was)."""


_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "tib": 2**40,
}
_MAX_MEMORY = 2**60  # 1 EiB: beyond any device, so surely a typo
_MEMORY = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_memory(value: int | float | str) -> int:
    """Bytes from an int (bytes) or a string with a unit: "512MiB", "2GiB", "1.5GB"."""
    if isinstance(value, bool):
        raise MemorySizeError(f"memory must be a number of bytes or a string like '2GiB', got {value!r}")
    if isinstance(value, int):
        amount = float(min(value, _MAX_MEMORY + 1))  # float() of a huge int would overflow
    elif isinstance(value, float):
        amount = value
    elif isinstance(value, str):
        amount = _parse_text(value)
    else:
        raise MemorySizeError(f"memory must be a number of bytes or a string like '2GiB', got {type(value).__name__}")
    if not math.isfinite(amount) or amount < 1:
        raise MemorySizeError(f"memory must be positive (at least one byte), got {value!r}")
    if amount > _MAX_MEMORY:
        raise MemorySizeError(f"memory {value!r} is more than 1 EiB; check the unit (e.g. '512MiB', '2GiB')")
    return int(amount)


def _parse_text(value: str) -> float:
    match = _MEMORY.match(value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise MemorySizeError(
            f"cannot read memory size {value!r}; write bytes or a number with a unit "
            f"such as '512MiB', '2GiB' or '1.5GB'"
        )
    return float(match.group(1)) * _UNITS[unit]


DEFAULT_BLOCK_SIZE = 16
"""Tokens per KV-cache block unless `LLM(block_size=...)` says otherwise."""
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


class KVCacheUnallocatable(InputError, MemoryError):
    """The planned KV cache is more than the device can allocate (exit code 1, naming kv_cache_memory)."""


@contextlib.contextmanager
def cache_allocation_errors(kv_cache_memory: int | float | str | None, num_bytes: int) -> Iterator[None]:
    """Allocating `num_bytes` of cache: the device refusing it is a KVCacheUnallocatable naming kv_cache_memory."""
    try:
        yield
    except (MemoryError, RuntimeError, OSError) as err:
        if isinstance(err, InputError) or not _out_of_memory(err):
            raise
        raise KVCacheUnallocatable(
            f"{_cache_named(kv_cache_memory, num_bytes)} cannot be allocated on this device ({str(err)[:120]}); "
            "give a smaller kv_cache_memory"
        ) from err


def _cache_named(kv_cache_memory: int | float | str | None, num_bytes: int) -> str:
    if kv_cache_memory is None:
        return f"the default KV cache ({num_bytes} bytes)"
    if isinstance(kv_cache_memory, str):
        return f"kv_cache_memory={kv_cache_memory!r} ({num_bytes} bytes)"
    return f"kv_cache_memory={num_bytes} bytes"


def _out_of_memory(err: BaseException) -> bool:
    """torch's CPU allocator (RuntimeError), CUDA's OutOfMemoryError, an anonymous mmap (ENOMEM), MemoryError."""
    if isinstance(err, OSError):
        return err.errno == errno.ENOMEM
    text = str(err).lower()
    return isinstance(err, MemoryError) or "can't allocate" in text or "out of memory" in text
