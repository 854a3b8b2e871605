"""Memory sizes as users write them, and how many tokens of KV cache a budget holds (`kernelbay explain`)."""

from __future__ import annotations

import math
import re

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
            raise ValueError(
                f"cannot read memory size {value!r}; write bytes or a number with a unit "
                f"such as '512MiB', '2GiB' or '1.5GB'"
            )
        amount = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(amount) or amount <= 0:
        raise ValueError(f"memory must be positive, got {value!r}")
    return int(amount)


def tokens_that_fit(memory_bytes: int, bytes_per_token: int) -> int:
    """Tokens of KV cache `memory_bytes` holds (every layer of the model cached per token)."""
    return memory_bytes // bytes_per_token if bytes_per_token > 0 else 0
