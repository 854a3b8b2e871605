"""The one capability surface of every kernel kind (attention backends, MoE kernels): declarations checked at
class creation, the one question the selector, option validation and the kit ask of them, and what a group of
attention layers needs (a hashable requirements record, so selection can be cached)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar, NamedTuple

import torch

from ..dtypes import KV_CACHE_DTYPES, MODEL_DTYPES, normalize_dtype, normalize_kv_cache_dtype
from ..errors import ConfigError, KernelbayError
from ._geometry import SPARSE_DSA, SPARSE_NONE, AttentionGeometry, AttentionType, KVLayout


class _Any:
    """`ANY`: a declaration that contains every value (`head_sizes = ANY`)."""

    def __contains__(self, value) -> bool:
        return True

    def __repr__(self) -> str:
        return "ANY"


ANY = _Any()
BACKEND_ENV = "KERNELBAY_ATTENTION_BACKEND"
MOE_BACKEND_ENV = "KERNELBAY_MOE_BACKEND"
# The kernel kinds: slot kind (also the LLM argument requesting one) -> (what users call it, the variable forcing
# one, the Platform method listing its priority).
KERNEL_KINDS = {
    "attention_backend": ("attention backend", BACKEND_ENV, "backend_priority"),
    "moe_backend": ("MoE backend", MOE_BACKEND_ENV, "moe_backend_priority"),
}


class Check(NamedTuple):
    """One row of a kernel kind's declaration table: the requirement field a declaration answers."""

    field: str
    declared: str
    feature: str | None = None  # a boolean declaration: what its failure line calls the feature
    names: Collection[str] | None = None  # a closed vocabulary: the names the declaration may hold


class Requirements:
    """What every kernel kind's requirements record (a frozen slotted dataclass) shares."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]
    platform: str | None

    def with_platform(self, platform: str):
        return replace(self, platform=platform)

    def to_dict(self) -> dict:
        return {name: getattr(value, "value", value) for name, value in asdict(self).items()}


class KernelContractError(KernelbayError, RuntimeError):
    """A kernel answered outside its kind's contract (wrong output shape or dtype)."""


class Kernel:
    """What every kernel kind's protocol shares: a registry name, conservative declarations checked against
    the kind's table, `is_available`, the one capability question and the checks at its boundaries."""

    name: ClassVar[str] = ""
    SLOT: ClassVar[str]  # the kind's registry slot kind, a KERNEL_KINDS key
    CHECKS: ClassVar[tuple[Check, ...]] = ()  # the kind's declarations, in the order failures are listed
    GEOMETRY: ClassVar[frozenset[str]] = frozenset()  # the fields fixed at construction (which refuses them)
    ContractError: ClassVar[type[KernelContractError]] = KernelContractError

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        check_declarations(cls)

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        """Whether the kernels can run in this process (libraries importable, a device present), and why not."""
        return True, "available"

    @classmethod
    def capability_failures(cls, req, fields: Collection[str] | None = None) -> list[str]:
        """Every capability `req` needs that this kernel does not declare, one line each, then availability
        (empty: capable). `fields` limits the question to those fields (construction asks GEOMETRY, option
        validation everything but availability); an override must accept and pass it on."""
        asked = [check for check in cls.CHECKS if fields is None or check.field in fields]
        failures = [line for check in asked if (line := _failure(cls, check, getattr(req, check.field)))]
        if fields is None and (unavailable := _unavailable(cls, cls.is_available())):
            failures.append(unavailable)
        return failures

    def _refuse(self, req, what: str) -> None:
        """A geometry the class does not declare is a ValueError at construction, never a kernel that computes
        something else."""
        failures = type(self).capability_failures(req, self.GEOMETRY)
        if failures:
            raise ValueError(
                f"{KERNEL_KINDS[self.SLOT][0]} {self.name} cannot build {what}: {'; '.join(failures)}. Pick a "
                f"capable one (see `kernelbay explain`) instead of silently computing something else"
            )

    def _check_output(self, out, shape: tuple, dtype, method: str, where: str = "", names: str = "") -> None:
        """A wrong answer is this kernel's error at the boundary, not a traceback deep in the model nor (with a
        broadcasting copy or a reshape) a silently wrong result."""
        if isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(shape) and out.dtype == dtype:
            return
        got = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise self.ContractError(
            f"{KERNEL_KINDS[self.SLOT][0]} {self.name} ({type(self).__module__}) broke the forward contract{where}: "
            f"{method} must return a {dtype} tensor {names}{list(shape)}, got {got}; fix the backend or pick another "
            f"with {self.SLOT}=..."
        )


@dataclass(frozen=True, slots=True)
class AttentionRequirements(Requirements):
    """Every capability a backend must have for one group of layers."""

    head_size: int  # query/key head size (MLA: qk_nope_head_dim + qk_rope_head_dim)
    dtype: str = "bfloat16"  # model compute dtype
    kv_cache_dtype: str = "auto"
    attn_type: AttentionType = AttentionType.FULL
    use_mla: bool = False
    sliding_window: bool = False
    chunked_attention: bool = False
    logit_softcap: bool = False
    sinks: bool = False  # per-head attention sink logits in the softmax denominator (GPT-OSS)
    sparse_mode: str = SPARSE_NONE
    block_size: int | None = None  # one the engine insists on; None: the backend's preferred one
    kv_layout: KVLayout | None = None
    platform: str | None = None  # None: `select_attention_backend` fills in the detected platform

    def __post_init__(self):
        """Every bad name or size at once (option validation lists them as its own violations)."""
        problems = []
        for name, parse in _PARSERS:
            value = getattr(self, name)
            try:
                if value is not None or name not in _OPTIONAL:
                    object.__setattr__(self, name, parse(value))
            except ValueError as exc:
                problems.append(f"{name}: {exc}")
        for name in ("head_size", "block_size"):
            value = getattr(self, name)
            if (value is not None or name not in _OPTIONAL) and not (isinstance(value, int) and value >= 1):
                problems.append(f"{name} must be a positive int, got {value!r}")
        if problems:
            raise ConfigError("invalid attention requirements:", problems)
        if self.attn_type is AttentionType.SLIDING:
            object.__setattr__(self, "sliding_window", True)
        if self.attn_type is AttentionType.CHUNKED:
            object.__setattr__(self, "chunked_attention", True)

    @property
    def encoder(self) -> bool:
        """Bidirectional layers (the `encoder` declaration answers it)."""
        return self.attn_type is AttentionType.ENCODER

    def describe(self) -> str:
        parts = [self.attn_type.value, f"head_size={self.head_size}", self.dtype, f"kv={self.kv_cache_dtype}"]
        parts += [flag for flag in ("use_mla", "logit_softcap") if getattr(self, flag)]
        return "layers (" + ", ".join(parts) + ")"

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


_PARSERS = (
    ("dtype", normalize_dtype),
    ("kv_cache_dtype", normalize_kv_cache_dtype),
    ("attn_type", AttentionType.parse),
    ("kv_layout", KVLayout.parse),
)
_OPTIONAL = {"kv_layout", "block_size"}  # None: not insisted on


# The attention backend's table (AttentionBackend.CHECKS), geometry first.
ATTENTION_CHECKS = (
    Check("head_size", "head_sizes"),
    Check("use_mla", "mla", "multi-head latent attention"),
    Check("sliding_window", "sliding_window", "sliding-window attention"),
    Check("encoder", "encoder", "bidirectional encoder attention"),
    Check("chunked_attention", "chunked_attention", "chunked attention"),
    Check("logit_softcap", "logit_softcap", "attention logit soft-capping"),
    Check("sinks", "sinks", "attention sinks"),
    Check("dtype", "dtypes", names=MODEL_DTYPES),
    Check("kv_cache_dtype", "kv_cache_dtypes", names=KV_CACHE_DTYPES),
    Check("block_size", "block_sizes"),
    Check("kv_layout", "kv_layouts", names=tuple(KVLayout)),
    Check("sparse_mode", "sparse_modes"),
    Check("platform", "platforms"),
)
ATTENTION_GEOMETRY = frozenset(  # fixed when a layer is built; dtypes, cache and platform are chosen at run time
    {"head_size", "use_mla", "sliding_window", "encoder", "chunked_attention", "logit_softcap", "sparse_mode", "sinks"}
)


def _listed(values) -> str:
    if values is ANY:
        return "any"
    ordered = sorted(values, key=lambda v: (not isinstance(v, int), v if isinstance(v, int) else str(v)))
    return ", ".join(str(v) for v in ordered) or "none declared"


def _unavailable(cls, answer) -> str | None:
    """The failure line for is_available()'s answer; an answer that breaks the contract is never "available"."""
    if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], bool)):
        return (
            f"available: {cls.__name__}.is_available() must return (bool, str), got {answer!r}; "
            f"fix the backend ({cls.__module__})"
        )
    available, reason = answer
    return None if available else f"available: {reason}"


def _failure(cls, check: Check, wanted) -> str | None:
    declared = getattr(cls, check.declared)
    if check.feature is not None:
        return f"{check.declared}: {check.feature} is not supported" if wanted and not declared else None
    if wanted is None or wanted in declared:
        return None
    return f"{check.field}: {wanted} is not supported (supported: {_listed(declared)})"


def check_declarations(cls) -> None:
    """Refuse a kernel class whose declarations cannot be right, naming the attribute (at class creation)."""
    problems = []
    for check in cls.CHECKS:
        values = getattr(cls, check.declared)
        if check.feature is not None or values is ANY:
            continue
        needs = "__contains__" if check.names is None else "__iter__"  # names are checked one by one
        if isinstance(values, str) or not hasattr(values, needs):
            problems.append(f"{check.declared} must be a set of values or ANY, got {values!r}")
        elif check.names is not None and (unknown := set(values) - set(check.names)):
            problems.append(f"{check.declared}: unknown name(s) {', '.join(sorted(map(str, unknown)))}")
    block_sizes, preferred = getattr(cls, "block_sizes", None), getattr(cls, "preferred_block_size", None)
    if block_sizes and preferred not in block_sizes:
        problems.append(f"preferred_block_size {preferred} is not among block_sizes {_listed(block_sizes)}")
    if problems:
        raise TypeError(f"{KERNEL_KINDS[cls.SLOT][0]} {cls.__module__}.{cls.__qualname__}: " + "; ".join(problems))
