"""The attention options of one model, checked whole before any weight is read: every violation in one ConfigError.

`AttentionOptions` holds what a user can combine about attention for one model (dtypes, KV cache, block size,
the layers' needs, a requested backend, each backend's own options); `validate_options` checks the names (as the
requirements record reads them), the combinations that cannot work together (chunked attention without a chunk
size, sparse attention over a KV cache in another precision, incomplete MLA geometry), a named backend's
declarations (not its availability: options may be checked on another machine than they run on) and each
backend's options (`AttentionBackend.parse_options`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kernelbay.attention import SPARSE_NONE, AttentionRequirements, MLASpec
from kernelbay.errors import ConfigError, unknown_name_message


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
    from kernelbay.attention import load_backend
    from kernelbay.registry import names

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


def validate_options(options: AttentionOptions | Mapping, extra_rules: Iterable[Rule] = ()) -> AttentionOptions:
    """Check the whole option set (the built-in rules, then `extra_rules`); raise one ConfigError listing every
    violation, else return the options record."""
    if isinstance(options, Mapping):
        options = _options_from_mapping(options)
    violations = [line for rule in (*BUILTIN_RULES, *extra_rules) for line in rule(options)]
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
