"""Bounds every config value must respect, checked once for explain and run alike.

config.json is parsed strictly (no NaN/Infinity, integers within 64 bits, bounded nesting), and the
sizes a model is built from must be positive and plausible: an absurd layer count would otherwise
allocate per-layer tuples until memory runs out.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..errors import ConfigError, MalformedConfig

MAX_DIMENSION = 2**31 - 1  # one tensor dimension or a context length: int32-indexable
MAX_LAYERS = 4096  # the largest published checkpoints have ~130; anything beyond is a typo
MAX_JSON_DEPTH = 64  # real configs nest 3-4 deep (text_config.rope_scaling.*)
INT64_LIMIT = 2**63


class _Rejected(ValueError):
    """A JSON literal config.json may not hold; turned into MalformedConfig with the file named."""


class _NonFinite:
    """Stands in for NaN/Infinity while parsing, so the key that holds it can be named afterwards."""

    def __init__(self, literal: str):
        self.literal = literal


def _finite_float(text: str) -> float | _NonFinite:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text[:40])


def _int64(text: str) -> int:
    if len(text.lstrip("-")) > 19 or abs(int(text)) >= INT64_LIMIT:
        raise _Rejected(f"the integer {text[:40]}{'...' if len(text) > 40 else ''} does not fit in 64 bits")
    return int(text)


def parse_config_text(text: str, file: Path) -> Any:
    """json.loads, strict about what a config may hold; every refusal is a MalformedConfig naming `file`."""
    try:
        data = json.loads(text, parse_constant=_NonFinite, parse_float=_finite_float, parse_int=_int64)
    except _Rejected as exc:
        raise MalformedConfig(f"{file} is not a valid config: {exc}.") from None
    except RecursionError:
        raise MalformedConfig(f"{file} nests too deeply to parse; a config.json is a few levels deep.") from None
    depth, bad = _scan(data)
    if depth > MAX_JSON_DEPTH:
        raise MalformedConfig(f"{file} nests more than {MAX_JSON_DEPTH} levels deep; a config.json is a few levels.")
    if bad is not None:
        path, value = bad
        raise MalformedConfig(
            f"{file}: {path} is {value.literal}, which is not a finite JSON number "
            "(JSON has no NaN or Infinity); write a finite number, or null"
        )
    return data


def _scan(data: Any) -> tuple[int, tuple[str, _NonFinite] | None]:
    """Nesting depth of parsed JSON and the first NaN/Infinity with its key path, without recursion."""
    deepest, bad, stack = 0, None, [(data, 1, "")]
    while stack:
        value, depth, path = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(value, _NonFinite) and bad is None:
            bad = (path or "the top level", value)
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        stack.extend((child, depth + 1, f"{path}.{key}" if path else str(key)) for key, child in items)
    return deepest, bad


def check_size(source: str, name: str, value: int, *, limit: int = MAX_DIMENSION, minimum: int = 1) -> int:
    """`value` if minimum <= value <= limit, else a ConfigError naming the field and the range."""
    if not minimum <= value <= limit:
        raise ConfigError(f"{source}: {name}={value} must be an integer from {minimum} to {limit}.")
    return value


def check_written_layer_count(raw: dict[str, Any], source: str) -> None:
    """The layer count as written, bounded before transformers builds anything per layer."""
    from ._geometry import LAYERS

    for part in (raw, raw.get("text_config"), raw.get("vision_config")):
        if not isinstance(part, dict):
            continue
        for name in LAYERS:
            value = part.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                check_size(source, name, value, limit=MAX_LAYERS)


def check_finite(source: str, name: str, value: float, *, positive: bool = False) -> float:
    """A finite float (and > 0 when `positive`), else a ConfigError naming the field."""
    if not math.isfinite(value) or (positive and value <= 0):
        need = "a positive finite number" if positive else "a finite number"
        raise ConfigError(f"{source}: {name} must be {need}, got {value!r}.")
    return value
