"""Reading a config's keys: what config.json says, over what transformers parsed from it."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, overload

from kernelbay.errors import ConfigError

MAX_DIMENSION = 2**31 - 1  # one tensor dimension or a context length: int32-indexable
MAX_LAYERS = 4096  # the largest published checkpoints have ~130; anything beyond is a typo


def check_size(source: str, name: str, value: int, *, limit: int = MAX_DIMENSION) -> int:
    """`value` if 1 <= value <= limit, else a ConfigError naming the field and the range."""
    if not 1 <= value <= limit:
        raise ConfigError(f"{source}: {name}={value} must be an integer from 1 to {limit}.")
    return value


class Fields:
    """Key lookup with spellings: `raw` (config.json as written) wins over `parsed` (transformers' view).

    `raw` keeps what transformers may rename or drop (and tells which keys were really written);
    `parsed` fills class defaults and legacy spellings (`n_embd`, `rope_parameters`, ...).
    """

    def __init__(
        self,
        raw: Mapping[str, Any],
        parsed: Mapping[str, Any],
        source: str,
        folder: Path | None = None,
        read_tensors: Callable[[Path], dict[str, tuple[str, tuple[int, ...]]]] | None = None,
        *,
        paired: bool = False,
    ):
        self.raw = raw
        self.parsed = parsed
        self.source = source  # where the keys came from, for error messages
        self.folder = folder  # the model folder, whose stored tensors are evidence for keys left out
        self.read_tensors = read_tensors  # folder -> its stored tensors (the weight format reads the headers)
        self.paired = paired  # architectures and model_type written together by a weight format: no family check
        self.notes: list[str] = []  # how a default or a quirk was resolved, in words

    @cached_property
    def tensors(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """name -> (dtype, shape) of the folder's stored tensors (headers only); {} without any."""
        return self.read_tensors(self.folder) if self.folder is not None and self.read_tensors else {}

    def written(self, *names: str) -> bool:
        """True when config.json itself has one of these keys (even with a null value)."""
        return any(name in self.raw for name in names)

    def get(self, *names: str, default: Any = None) -> Any:
        """The first non-null value among `names`, looking in config.json first, then in the parse."""
        for layer in (self.raw, self.parsed):
            for name in names:
                value = layer.get(name)
                if value is not None:
                    return value
        return default

    @overload
    def get_int(self, *names: str, default: int) -> int: ...
    @overload
    def get_int(self, *names: str, default: None = None) -> int | None: ...
    def get_int(self, *names: str, default: int | None = None) -> int | None:
        value = self.get(*names)
        if value is None:
            return default
        return self.as_int(names[0], value)

    def required_int(self, *names: str) -> int:
        """A positive integer that must be written down, under any of its spellings."""
        value = self.as_written(*names)
        if value is None:
            raise self.missing(names)
        return self.as_int(names[0], value)

    def as_written(self, *names: str) -> Any:
        """The first non-null value among `names` as config.json writes it (a class default is no evidence: a copy
        may have dropped the key); transformers' parse only when there is no config.json."""
        layer = self.raw or self.parsed
        return next((layer[name] for name in names if layer.get(name) is not None), None)

    @overload
    def get_float(self, *names: str, default: float) -> float: ...
    @overload
    def get_float(self, *names: str, default: None = None) -> float | None: ...
    def get_float(self, *names: str, default: float | None = None) -> float | None:
        value = self.get(*names)
        return default if value is None else self.as_float(names[0], value)

    def get_bool(self, *names: str, default: bool = False) -> bool:
        value = self.get(*names)
        return default if value is None else bool(value)

    def missing(self, names: tuple[str, ...]) -> ConfigError:
        spellings = " / ".join(repr(n) for n in names)
        return ConfigError(f"{self.source}: required field {spellings} is missing (or null); add it to config.json.")

    def as_float(self, name: str, value: Any, *, positive: bool = False) -> float:
        """A finite number (and > 0 when `positive`), else a ConfigError naming `name`."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{self.source}: {name} must be a number, got {value!r}.")
        if isinstance(value, int) and abs(value) >= 2**63:
            raise ConfigError(f"{self.source}: {name}={value} is too large for a float field.")
        if not math.isfinite(value) or (positive and value <= 0):
            need = "a positive finite number" if positive else "a finite number"
            raise ConfigError(f"{self.source}: {name} must be {need}, got {value!r}.")
        return float(value)

    def as_int(self, name: str, value: Any) -> int:
        """An integer (an integral float such as 4096.0 too) within 64 bits, else a ConfigError naming `name`."""
        integral = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())
        if isinstance(value, bool) or not integral:
            raise ConfigError(f"{self.source}: {name} must be an integer, got {value!r}.")
        if abs(value) >= 2**63:
            raise ConfigError(f"{self.source}: {name}={value!r} does not fit in 64 bits.")
        return int(value)
