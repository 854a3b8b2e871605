"""The small frozen records a `ModelConfig` is made of: RoPE, quantization, block-sparse (MLA and the DSA
indexer are the attention contract's `MLASpec` / `IndexerSpec`); and the read-only JSON they keep."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from kernelbay.errors import ConfigError

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
SCALED_ROPE_TYPES = ("linear", "dynamic", "yarn", "llama3")  # the types that need a factor


class FrozenDict(dict):
    """A dict that refuses changes but still pickles (a worker process receives configs by pickle)."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("this mapping is part of a frozen config and cannot be changed")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def __reduce__(self):
        return (FrozenDict, (dict(self),))


def frozen_json(value: Any) -> Any:
    """A read-only copy of JSON data: dicts become FrozenDicts, lists become tuples."""
    if isinstance(value, Mapping):
        return FrozenDict({str(k): frozen_json(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen_json(v) for v in value)
    return value


def thawed_json(value: Any) -> Any:
    """The JSON-safe inverse of `frozen_json` (mappings -> dicts, tuples -> lists); records by their to_dict."""
    if hasattr(value, "to_dict"):  # a Record, or an attention geometry record
        return value.to_dict()
    if isinstance(value, Mapping):
        return {k: thawed_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thawed_json(v) for v in value]
    return value


class Record:
    """`to_dict()` for the frozen records: their fields as JSON data (but `NOT_IN_DICT`), plus what `derived()` adds."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every subclass is a dataclass
    NOT_IN_DICT: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict:
        out = {f.name: thawed_json(getattr(self, f.name)) for f in fields(self) if f.name not in self.NOT_IN_DICT}
        return out | self.derived()

    def derived(self) -> dict:
        return {}


def require_positive(owner: str, **values: int | None) -> None:
    bad = [f"{name}={value!r}" for name, value in values.items() if not (isinstance(value, int) and value > 0)]
    if bad:
        raise ConfigError(f"{owner}: these must be positive integers", bad)


@dataclass(frozen=True, slots=True)
class RopeConfig(Record):
    """Rotary position embedding, resolved from `rope_scaling` / `rope_parameters` and top-level keys."""

    theta: float
    rope_type: str = "default"
    factor: float | None = None
    rotary_dim: int = 0  # rotated channels per head (< head_dim for partial rotary)
    scaling: Mapping[str, Any] = field(default_factory=FrozenDict, hash=False)
    original_max_position_embeddings: int | None = None
    local_theta: float | None = None  # base of sliding-window layers when it differs (a family rule: Gemma 3)

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ConfigError(f"Unknown rope_type {self.rope_type!r}; known: {', '.join(ROPE_TYPES)}.")
        if not self.theta > 0:
            raise ConfigError(f"rope_theta must be positive, got {self.theta!r}.")
        require_positive("RoPE", rotary_dim=self.rotary_dim)
        if self.rotary_dim % 2:
            raise ConfigError(f"rotary_dim {self.rotary_dim} is odd; rotary embedding rotates channel pairs.")
        if self.rope_type in SCALED_ROPE_TYPES and not self.factor:
            raise ConfigError(f"rope_type {self.rope_type!r} needs a positive 'factor' in rope_scaling.")


@dataclass(frozen=True, slots=True)
class QuantConfig(Record):
    """What `quantization_config` says, parsed but not judged: the MODELS side decides what loads."""

    quant_method: str  # "fp8", "mxfp4", "compressed-tensors", "modelopt", "gptq", ...
    element_type: str | None = None  # the quantized weights' element: "e4m3" / "e5m2" (fp8), "e2m1" (mxfp4)
    weight_block_size: tuple[int, int] | None = None  # [out, in] tile that shares one scale
    weight_granularity: str | None = None  # "block" | "tensor" | "channel" | "group"
    activation_scheme: str | None = None  # "dynamic" | "static"
    modules_to_not_convert: tuple[str, ...] = ()  # names/patterns kept in the checkpoint dtype
    kv_cache_dtype: str | None = None  # e.g. "fp8_e4m3" when the checkpoint ships KV scales
    raw: Mapping[str, Any] = field(default_factory=FrozenDict, hash=False, repr=False)
    NOT_IN_DICT = ("raw",)  # the whole quantization_config, kept for the loaders

    def __post_init__(self) -> None:
        if not self.quant_method:
            raise ConfigError("quantization_config has no quant_method and none could be inferred.")
        if self.weight_block_size is not None:
            if len(self.weight_block_size) != 2:
                raise ConfigError(f"weight_block_size must be [rows, cols], got {list(self.weight_block_size)}.")
            require_positive("weight_block_size", rows=self.weight_block_size[0], cols=self.weight_block_size[1])


@dataclass(frozen=True, slots=True)
class BlockSparseGeometry(Record):
    """Phi-3-small block-sparse attention: local blocks plus every `vert_stride`-th block."""

    block_size: int
    num_local_blocks: int
    vert_stride: int
    homo_head_pattern: bool = False

    def __post_init__(self) -> None:
        sizes = {"block_size": self.block_size, "num_local_blocks": self.num_local_blocks}
        require_positive("block-sparse attention", **sizes, vert_stride=self.vert_stride)
