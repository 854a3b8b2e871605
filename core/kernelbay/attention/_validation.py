"""A backend's typed `Options` (a dataclass; unknown keys are an error): what `AttentionBackend.parse_options`
builds from a mapping, the command line's strings typed as the fields declare."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass

from .._trace import bool_word
from ..errors import ConfigError, close_matches


@dataclass(frozen=True, slots=True)
class NoOptions:
    """A backend that takes no options."""


def _coerce(backend: str, key: str, kind, value):
    """CLI values arrive as strings (`--backend-option SDPA.key=value`); turn them into the declared type."""
    if not isinstance(value, str) or kind is str:
        return value
    if kind is bool:
        if (answer := bool_word(value)) is not None:
            return answer
        raise ConfigError(f"option {backend}.{key} expects a bool (true/false), got {value!r}")
    if kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            raise ConfigError(f"option {backend}.{key} expects {kind.__name__}, got {value!r}") from None
    return value


def parse_options(backend: str, options_cls: type, values) -> object:
    """An instance of `options_cls` from None, an instance, or a mapping; unknown keys raise ConfigError."""
    if values is None:
        return options_cls()
    if isinstance(values, options_cls):
        return values
    if not isinstance(values, Mapping):
        raise ConfigError(
            f"options for attention backend {backend} must be a mapping or "
            f"{options_cls.__name__}, got {type(values).__name__}"
        )
    hints = typing.get_type_hints(options_cls)
    known = [f.name for f in dataclasses.fields(options_cls)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown option(s) for attention backend {backend}: {', '.join(unknown)}",
            [_unknown_line(backend, key, known) for key in unknown],
        )
    try:
        return options_cls(**{k: _coerce(backend, k, hints.get(k), v) for k, v in values.items()})
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"invalid options for attention backend {backend}: {exc}") from exc


def _unknown_line(backend: str, key: str, known: list[str]) -> str:
    line = f"{backend}.{key} is not an option; known options: {', '.join(known) or '(none)'}"
    matches = close_matches(key, known)
    return line + (f"; did you mean {', '.join(matches)}?" if matches else "")
