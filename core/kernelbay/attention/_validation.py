"""Options: a backend's typed `Options` (unknown keys are an error) and the whole attention option set,
checked in one pass with every violation reported in one ConfigError."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import cast

from ..errors import ConfigError, close_matches, unknown_name_message
from ._capabilities import AttentionRequirements
from ._geometry import SPARSE_NONE, MLASpec


@dataclass(frozen=True, slots=True)
class NoOptions:
    """A backend that takes no options."""


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _coerce(backend: str, key: str, kind, value):
    """CLI values arrive as strings (`--backend-option SDPA.key=value`); turn them into the declared type."""
    if not isinstance(value, str) or kind is str:
        return value
    if kind is bool:
        if value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
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


@dataclass(frozen=True, slots=True)
class AttentionOptions:
    """Everything a user can combine about attention for one model; not checked field by field on purpose:
    `validate_options` checks it whole and reports every problem at once."""

    backend: str | None = None
    dtype: str = "bfloat16"
    kv_cache_dtype: str = "auto"
    sparse_mode: str = SPARSE_NONE
    chunked_attention: bool = False
    attention_chunk_size: int | None = None
    sliding_window: bool = False
    logit_softcap: bool = False
    block_size: int | None = None
    kv_layout: str | None = None
    head_size: int | None = None
    mla: object | None = None
    """MLA geometry (an MLASpec, as `ModelConfig.mla` holds, or a mapping of its fields) when the model uses MLA."""
    backend_options: Mapping[str, Mapping] = field(default_factory=dict)  # by backend name: {"SDPA": {"key": 1}}
    platform: str | None = None


Rule = Callable[[AttentionOptions], Iterable[str]]
# The options that are requirement fields by the same name: the requirements record checks and answers them.
_REQUIREMENT_FIELDS = (
    {f.name for f in dataclasses.fields(AttentionOptions)} & {f.name for f in dataclasses.fields(AttentionRequirements)}
) - {"head_size"}


def _requirements(o: AttentionOptions, mla: MLASpec | None) -> AttentionRequirements:
    """The options as the one requirements record (a ConfigError lists every bad name and size)."""
    shared = {name: getattr(o, name) for name in _REQUIREMENT_FIELDS}
    head_size = o.head_size or (mla.qk_head_dim if mla else 1)  # 1: unknown, not checked
    return AttentionRequirements(head_size=head_size, use_mla=mla is not None, **shared)


def _names_rule(o: AttentionOptions) -> list[str]:
    try:
        _requirements(o, None)
    except ConfigError as exc:
        return exc.violations
    return []


def _combination_rule(o: AttentionOptions) -> list[str]:
    out = []
    if o.chunked_attention and not (o.attention_chunk_size or 0) >= 1:
        out.append(f"chunked attention needs attention_chunk_size >= 1, got {o.attention_chunk_size}")
    if o.sparse_mode != SPARSE_NONE and _mixed_precision(o):
        out.append(
            f"sparse attention ({o.sparse_mode}) cannot be combined with a KV cache in another precision "
            f"than the model (kv_cache_dtype={o.kv_cache_dtype}, dtype={o.dtype}); use kv_cache_dtype=auto"
        )
    if o.mla is not None:
        try:
            MLASpec.from_any(o.mla)
        except ValueError as exc:
            out.append(str(exc))
    return out


def _mixed_precision(o: AttentionOptions) -> bool:
    try:
        req = _requirements(o, None)
    except ConfigError:
        return False  # a bad name is the names rule's
    return req.kv_cache_dtype not in ("auto", req.dtype)


def _load_backend(name: str):
    from ..registry import names
    from ._selector import load_backend

    known = names("attention_backend")
    if name not in known:
        return None, unknown_name_message("attention backend", name, known)
    cls, broken = load_backend("attention_backend", name)
    return cls, broken and f"attention backend {name} {broken}"


def _capability_lines(cls, o: AttentionOptions) -> list[str]:
    """The backend's one capability check, asked with the options as a requirements record."""
    try:
        mla = MLASpec.from_any(o.mla) if o.mla is not None else None
        req = _requirements(o, mla)
    except ValueError:
        return []  # a bad name, size or MLA geometry is reported by the other rules
    # every declaration, not availability: options may be checked on another machine than they run on
    fields = {check.field for check in cls.CHECKS} - (set() if o.head_size or mla else {"head_size"})
    return [f"attention backend {cls.name}: {line}" for line in cls.capability_failures(req, fields=fields)]


def _backend_rule(o: AttentionOptions) -> list[str]:
    if o.backend is None:
        return []
    cls, problem = _load_backend(o.backend)
    return [problem] if problem else _capability_lines(cls, o)


def _backend_options_rule(o: AttentionOptions) -> list[str]:
    out = []
    for name, values in o.backend_options.items():
        cls, problem = _load_backend(name)
        if problem:
            out.append(f"backend_options: {problem}")
            continue
        try:
            cls.parse_options(values)
        except ConfigError as exc:
            out += exc.violations or [str(exc)]
    return out


BUILTIN_RULES: tuple[Rule, ...] = (_names_rule, _combination_rule, _backend_rule, _backend_options_rule)


def _plugin_lines(options: AttentionOptions) -> list[str]:
    """Rules plugins register through `register_config_rules`, each line tagged with its plugin; a rule that
    crashes (or is no rule at all) is a reported problem, not a crash."""
    from ..hooks import collect

    out = []
    for rule, plugin in collect("register_config_rules"):
        try:
            out += [f"[{plugin}] {line}" for line in cast(Rule, rule)(options) or ()]
        except Exception as exc:  # noqa: BLE001
            out.append(f"[{plugin}] rule {getattr(rule, '__name__', repr(rule))} raised {type(exc).__name__}: {exc}")
    return out


def validate_options(options: AttentionOptions | Mapping, extra_rules: Iterable[Rule] = ()) -> AttentionOptions:
    """Check the whole option set (built-in rules, plugin rules, `extra_rules`); raise one ConfigError
    listing every violation, else return the options record."""
    if isinstance(options, Mapping):
        options = _options_from_mapping(options)
    violations = [line for rule in (*BUILTIN_RULES, *extra_rules) for line in rule(options)]
    violations += _plugin_lines(options)
    if violations:
        raise ConfigError(f"{len(violations)} problem(s) in the attention options:", violations)
    return options


def _options_from_mapping(values: Mapping) -> AttentionOptions:
    known = [f.name for f in dataclasses.fields(AttentionOptions)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(
            "unknown attention option(s):", [unknown_name_message("attention option", key, known) for key in unknown]
        )
    return AttentionOptions(**values)
