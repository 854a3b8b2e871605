"""The one capability check: a backend's declarations against a requirements record, a line per failure."""

from __future__ import annotations

from ..dtypes import KV_CACHE_DTYPES, MODEL_DTYPES
from ._requirements import AttentionRequirements
from ._types import KVLayout


class _Any:
    """`ANY`: a declaration that contains every value (`head_sizes = ANY`)."""

    def __contains__(self, value) -> bool:
        return True

    def __repr__(self) -> str:
        return "ANY"


ANY = _Any()

# Every declaration in the order failures are listed (geometry first): requirement field, declaration,
# and for a boolean feature what the failure line says (None: a set of accepted values).
_CHECKS = (
    ("head_size", "head_sizes", None),
    ("use_mla", "mla", "multi-head latent attention"),
    ("sliding_window", "sliding_window", "sliding-window attention"),
    ("encoder", "encoder", "bidirectional encoder attention"),
    ("chunked_attention", "chunked_attention", "chunked attention"),
    ("logit_softcap", "logit_softcap", "attention logit soft-capping"),
    ("sinks", "sinks", "attention sinks"),
    ("dtype", "dtypes", None),
    ("kv_cache_dtype", "kv_cache_dtypes", None),
    ("block_size", "block_sizes", None),
    ("kv_layout", "kv_layouts", None),
    ("sparse_mode", "sparse_modes", None),
    ("fused_rope", "fused_rope", "fused RoPE"),
    ("fused_qkv", "fused_qkv", "fused QKV input"),
    ("platform", "platforms", None),
)
# Every requirement field a declaration answers; geometry is fixed when a layer is built, the rest (dtypes,
# cache, platform) is chosen at run time. Asked for no `fields`, capability_failures adds availability too.
CAPABILITIES = frozenset(field for field, _, _ in _CHECKS)
GEOMETRY = frozenset(
    {"head_size", "use_mla", "sliding_window", "encoder", "chunked_attention", "logit_softcap", "sparse_mode", "sinks"}
)


def _listed(values) -> str:
    if values is ANY:
        return "any"
    ordered = sorted(values, key=lambda v: (not isinstance(v, int), v if isinstance(v, int) else str(v)))
    return ", ".join(str(v) for v in ordered) or "none declared"


def _wanted(req: AttentionRequirements, field: str):
    if field == "encoder":
        return req.attn_type.value == "encoder_attention"
    value = getattr(req, field)
    return value.value if isinstance(value, KVLayout) else value


def capability_failures(cls, req: AttentionRequirements, fields=None) -> list[str]:
    """Every capability in `req` (or in its `fields` only) that `cls` does not declare, plus availability."""
    checked = [
        _failure(cls, field, declared, what, _wanted(req, field))
        for field, declared, what in _CHECKS
        if fields is None or field in fields
    ]
    failures = [line for line in checked if line]
    if fields is None:
        unavailable = _unavailable(cls, cls.is_available())
        if unavailable:
            failures.append(unavailable)
    return failures


def _unavailable(cls, answer) -> str | None:
    """The failure line for is_available()'s answer; an answer that breaks the contract is never "available"."""
    if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], bool)):
        return (
            f"available: {cls.__name__}.is_available() must return (bool, str), got {answer!r}; "
            f"fix the backend ({cls.__module__})"
        )
    available, reason = answer
    return None if available else f"available: {reason}"


def _failure(cls, field: str, declared: str, what: str | None, wanted) -> str | None:
    if what is not None:
        return f"{declared}: {what} is not supported" if wanted and not getattr(cls, declared) else None
    if wanted is None or wanted in _declared(cls, declared):
        return None
    return f"{field}: {wanted} is not supported (supported: {_listed(getattr(cls, declared))})"


def _declared(cls, declared: str):
    values = getattr(cls, declared)
    if declared == "kv_layouts" and values is not ANY:
        return {KVLayout.parse(v).value for v in values}
    return values


def check_declarations(cls) -> None:
    """Refuse a backend class whose declarations cannot be right, naming the attribute (at class creation)."""
    problems = []
    for _field, declared, what in _CHECKS:
        values = getattr(cls, declared)
        if what is not None:
            continue
        if values is not ANY and (isinstance(values, str) or not hasattr(values, "__contains__")):
            problems.append(f"{declared} must be a set of values or ANY, got {values!r}")
    unknown = {
        "dtypes": set(cls.dtypes) - set(MODEL_DTYPES) if cls.dtypes is not ANY else set(),
        "kv_cache_dtypes": set(cls.kv_cache_dtypes) - set(KV_CACHE_DTYPES) if cls.kv_cache_dtypes is not ANY else set(),
    }
    problems += [f"{declared}: unknown name(s) {', '.join(sorted(v))}" for declared, v in unknown.items() if v]
    if cls.block_sizes and cls.preferred_block_size not in cls.block_sizes:
        problems.append(
            f"preferred_block_size {cls.preferred_block_size} is not among block_sizes {_listed(cls.block_sizes)}"
        )
    if problems:
        raise TypeError(f"attention backend {cls.__module__}.{cls.__qualname__}: " + "; ".join(problems))
