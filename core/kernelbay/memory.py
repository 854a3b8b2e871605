"""Memory sizes as users write them, and how many tokens of KV cache a budget holds (`kernelbay explain`)."""

from __future__ import annotations

import math
import re

from .errors import InputError


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


def tokens_that_fit(
    memory_bytes: int, bytes_per_token: int, *, block_size: int = 16, bytes_per_block: int | None = None
) -> int:
    """Tokens of KV cache `memory_bytes` holds, in whole blocks of `block_size` as the engine holds them.

    `bytes_per_block`: one block across every layer as the backends allocate it (their specs' page_size_bytes,
    scales and all); by default `block_size` tokens of `bytes_per_token` (every layer cached per token)."""
    block = bytes_per_block if bytes_per_block is not None else bytes_per_token * block_size
    return memory_bytes // block * block_size if block > 0 else 0
