"""The one capability surface: what a layer group needs (a hashable requirements record, so selection can be
cached) and the one check of a backend's declarations against it, a line per failure."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ..dtypes import KV_CACHE_DTYPES, MODEL_DTYPES, normalize_dtype, normalize_kv_cache_dtype
from ._geometry import SPARSE_DSA, SPARSE_NONE, AttentionGeometry, AttentionType, KVLayout


@dataclass(frozen=True, slots=True)
class AttentionRequirements:
    """Every capability a backend must have for one group of layers."""

    head_size: int
    """Query/key head size (MLA: qk_nope_head_dim + qk_rope_head_dim)."""
    dtype: str = "bfloat16"
    """Model compute dtype: float32, bfloat16 or float16."""
    kv_cache_dtype: str = "auto"
    attn_type: AttentionType = AttentionType.FULL
    use_mla: bool = False
    sliding_window: bool = False
    chunked_attention: bool = False
    logit_softcap: bool = False
    sinks: bool = False
    """Per-head attention sink logits in the softmax denominator (GPT-OSS)."""
    sparse_mode: str = SPARSE_NONE
    block_size: int | None = None
    """A block size the engine insists on; None lets the backend pick its preferred one."""
    kv_layout: KVLayout | None = None
    platform: str | None = None
    """Platform name; `select_attention_backend` fills it from the detected platform when None."""

    def __post_init__(self):
        if not isinstance(self.head_size, int) or self.head_size < 1:
            raise ValueError(f"head_size must be a positive int, got {self.head_size!r}")
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        object.__setattr__(self, "kv_cache_dtype", normalize_kv_cache_dtype(self.kv_cache_dtype))
        object.__setattr__(self, "attn_type", AttentionType.parse(self.attn_type))
        if self.kv_layout is not None:
            object.__setattr__(self, "kv_layout", KVLayout.parse(self.kv_layout))
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block_size must be >= 1 or None, got {self.block_size}")
        if self.attn_type is AttentionType.SLIDING and not self.sliding_window:
            object.__setattr__(self, "sliding_window", True)
        if self.attn_type is AttentionType.CHUNKED and not self.chunked_attention:
            object.__setattr__(self, "chunked_attention", True)

    def with_platform(self, platform: str) -> AttentionRequirements:
        return replace(self, platform=platform)

    def describe(self) -> str:
        parts = [self.attn_type.value, f"head_size={self.head_size}", self.dtype, f"kv={self.kv_cache_dtype}"]
        parts += [flag for flag in ("use_mla", "logit_softcap") if getattr(self, flag)]
        return "layers (" + ", ".join(parts) + ")"

    def to_dict(self) -> dict:
        out = asdict(self)
        out["attn_type"] = self.attn_type.value
        out["kv_layout"] = self.kv_layout.value if self.kv_layout else None
        return out

    @classmethod
    def from_geometry(cls, geometry: AttentionGeometry, dtype: str = "bfloat16", **runtime) -> AttentionRequirements:
        """Requirements of one constructed layer (runtime: kv_cache_dtype, block_size, platform, ...)."""
        runtime.setdefault("sparse_mode", SPARSE_DSA if geometry.indexer is not None else SPARSE_NONE)
        return cls(
            head_size=geometry.head_dim,
            dtype=dtype,
            attn_type=geometry.attn_type,
            use_mla=geometry.mla is not None,
            sliding_window=geometry.sliding_window is not None,
            chunked_attention=geometry.chunk_size is not None,
            logit_softcap=geometry.logit_softcap is not None,
            sinks=geometry.sinks,
            **runtime,
        )

    @classmethod
    def from_model_config(
        cls,
        cfg,
        layer_kind: str | AttentionType,
        kv_cache_dtype: str | None = "auto",
        dtype: str | None = None,
        **runtime,
    ) -> AttentionRequirements:
        """Requirements of the `layer_kind` layers of a resolved `kernelbay.config.ModelConfig`."""
        kind, sparse = _kind_and_sparse(str(getattr(layer_kind, "value", layer_kind)))
        runtime.setdefault("sparse_mode", sparse)
        mla = getattr(cfg, "mla", None)
        head_size = mla.qk_nope_head_dim + mla.qk_rope_head_dim if mla is not None else cfg.head_dim
        return cls(
            head_size=head_size,
            dtype=dtype or cfg.dtype,
            kv_cache_dtype=kv_cache_dtype or "auto",
            attn_type=kind,
            use_mla=mla is not None,
            logit_softcap=getattr(cfg, "attn_logit_softcapping", None) is not None,
            sinks=getattr(cfg, "attention_sinks", False),
            **runtime,
        )


# Config layer kinds that are a sparse mode of full attention rather than a mask shape.
_SPARSE_KINDS = {"blocksparse_attention": "blocksparse", "indexed_attention": SPARSE_DSA}


def _kind_and_sparse(layer_kind: str) -> tuple[AttentionType, str]:
    if layer_kind == "no_attention":
        raise ValueError("no_attention layers have no attention backend; skip them when selecting")
    if layer_kind in _SPARSE_KINDS:
        return AttentionType.FULL, _SPARSE_KINDS[layer_kind]
    return AttentionType.parse(layer_kind), SPARSE_NONE


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


def capability_failures(cls, req, fields=None, checks=_CHECKS) -> list[str]:
    """Every capability in `req` (or in its `fields` only) that `cls` does not declare, plus availability;
    `checks` is the kernel kind's table (kernelbay.moe passes its own)."""
    checked = [
        _failure(cls, field, declared, what, _wanted(req, field))
        for field, declared, what in checks
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


VOCABULARIES = {"dtypes": MODEL_DTYPES, "kv_cache_dtypes": KV_CACHE_DTYPES}
"""The declarations that must name known values: declaration -> the names it may hold."""


def check_declarations(cls, checks=_CHECKS, vocabularies=VOCABULARIES, kind: str = "attention backend") -> None:
    """Refuse a kernel class whose declarations cannot be right, naming the attribute (at class creation)."""
    problems = []
    for _field, declared, what in checks:
        values = getattr(cls, declared)
        if what is not None or values is ANY:
            continue
        needs = "__iter__" if declared in vocabularies else "__contains__"  # names are checked one by one
        if isinstance(values, str) or not hasattr(values, needs):
            problems.append(f"{declared} must be a set of values or ANY, got {values!r}")
        elif declared in vocabularies and (unknown := set(values) - set(vocabularies[declared])):
            problems.append(f"{declared}: unknown name(s) {', '.join(sorted(unknown))}")
    block_sizes = getattr(cls, "block_sizes", None)
    if block_sizes and cls.preferred_block_size not in block_sizes:
        problems.append(
            f"preferred_block_size {cls.preferred_block_size} is not among block_sizes {_listed(block_sizes)}"
        )
    if problems:
        raise TypeError(f"{kind} {cls.__module__}.{cls.__qualname__}: " + "; ".join(problems))
