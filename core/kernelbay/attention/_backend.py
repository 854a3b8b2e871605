"""The AttentionBackend protocol: geometry-only construction, capability classmethods, paged forward."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar, cast

import torch

from ..dtypes import normalize_kv_cache_dtype, storage_dtype, torch_dtype
from . import cache_ops as ops
from ._capabilities import (
    ATTENTION_CHECKS,
    ATTENTION_GEOMETRY,
    AttentionRequirements,
    Kernel,
    KernelContractError,
    _Any,
)
from ._geometry import SPARSE_NONE, AttentionGeometry, AttentionType, KVLayout, MLASpec
from ._kv_spec import KVCacheSpec
from ._metadata import AttentionMetadata
from ._validation import NoOptions, parse_options

TMetadata = TypeVar("TMetadata", bound=AttentionMetadata)


@dataclass(frozen=True, slots=True)
class AttentionForwardArgs:
    """Options for one forward call (`backend.forward(q, k, v, metadata, AttentionForwardArgs(...))`)."""

    causal: bool = True
    """Mask each query from keys after its own position (decoder self-attention)."""
    update_kv_cache: bool = True
    """Write this call's k/v into the paged cache before attending (False: reuse what is cached)."""
    output: Any = None
    """Optional preallocated output tensor [T, num_heads, v_head_dim] to write into."""
    topk_indices: Any = None
    """DSA layers only: [T, index_topk] integer tensor, the keys each query attends to as positions in its own
    request's sequence (-1 pads; the causal mask still applies), picked by the model's indexer."""
    sinks: Any = None
    """Layers with attention sinks only (geometry.sinks): [num_heads] float tensor of per-head sink logits."""

    def __post_init__(self):
        for name in ("causal", "update_kv_cache"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"AttentionForwardArgs.{name} must be a bool, got {getattr(self, name)!r}")


_DEFAULT_ARGS = AttentionForwardArgs()


class AttentionContractError(KernelContractError):
    """A backend answered outside the AttentionBackend contract (e.g. `_attend` returned the wrong shape)."""


class AttentionBackend(Kernel, Generic[TMetadata]):
    """Subclass, declare capabilities as class attributes and implement `_attend`
    (docs/guides/attention-backend-plugin.md, "Protocol reference")."""

    SLOT = "attention_backend"
    CHECKS = ATTENTION_CHECKS
    GEOMETRY = ATTENTION_GEOMETRY
    ContractError = AttentionContractError
    Metadata: ClassVar[type[AttentionMetadata]] = AttentionMetadata
    Options: ClassVar[type] = NoOptions

    # -- capability declarations: conservative, what a backend does not declare it does not get ----------
    head_sizes: ClassVar[Collection[int] | _Any] = frozenset()
    dtypes: ClassVar[Collection[str] | _Any] = frozenset()
    kv_cache_dtypes: ClassVar[Collection[str] | _Any] = frozenset({"auto"})  # "auto": K/V in the model dtype
    block_sizes: ClassVar[Collection[int] | _Any] = frozenset()
    kv_layouts: ClassVar[Collection[KVLayout] | _Any] = frozenset()
    platforms: ClassVar[Collection[str] | _Any] = frozenset()
    sparse_modes: ClassVar[Collection[str] | _Any] = frozenset({SPARSE_NONE})
    mla: ClassVar[bool] = False
    sliding_window: ClassVar[bool] = False
    encoder: ClassVar[bool] = False
    chunked_attention: ClassVar[bool] = False
    logit_softcap: ClassVar[bool] = False
    sinks: ClassVar[bool] = False
    preferred_block_size: ClassVar[int] = 16  # not a capability: `get_kv_cache_spec`'s when the engine does not insist

    # -- per-step and per-layer hooks --------------------------------------------------------------
    @classmethod
    def prepare(
        cls,
        requests: Sequence,
        block_size: int,
        layout: KVLayout | str = KVLayout.NHD,
        device: str | torch.device = "cpu",
    ) -> TMetadata:
        """This backend's metadata for one step: `[(query_len, context_len, block_table_row), ...]`."""
        # `Metadata` is the class a backend declares as its TMetadata (a ClassVar cannot name the type variable).
        return cast(TMetadata, cls.Metadata.build(requests, block_size, layout, device))

    @classmethod
    def parse_options(cls, values) -> object:
        return parse_options(cls.name or cls.__name__, cls.Options, values)

    @classmethod
    def get_kv_cache_spec(
        cls,
        geometry: AttentionGeometry,
        model_dtype: str,
        kv_cache_dtype: str | None = "auto",
        block_size: int | None = None,
        layout: KVLayout | str = KVLayout.NHD,
    ) -> KVCacheSpec:
        """The cache this backend wants for a layer; override to prefer another block size."""
        mla = geometry.mla
        return KVCacheSpec(
            num_kv_heads=1 if mla else geometry.num_kv_heads,
            head_dim=mla.latent_dim if mla else geometry.head_dim,
            dtype=storage_dtype(kv_cache_dtype, model_dtype),
            block_size=block_size or cls.preferred_block_size,
            layout=KVLayout.parse(layout),
            mla=mla is not None,
            index_head_dim=geometry.indexer.index_head_dim if geometry.indexer else 0,
            stride_order=cls.get_kv_cache_stride_order(layout),
        )

    @classmethod
    def get_kv_cache_stride_order(cls, layout: KVLayout | str = KVLayout.NHD) -> tuple[int, ...]:
        """Physical order of the cache tensor's dims (see `KVCacheSpec.stride_order`); default: as declared."""
        return (0, 1, 2, 3, 4)

    # -- instance ----------------------------------------------------------------------------------
    def __init__(
        self, geometry: AttentionGeometry, *, kv_b_proj=None, kv_cache_dtype: str | None = "auto", options=None
    ):
        """One layer's backend, from the layer's geometry record (`create_attention` builds one from sizes)."""
        if not isinstance(geometry, AttentionGeometry):
            raise TypeError(f"{type(self).__name__} is built from an AttentionGeometry, got {type(geometry).__name__}")
        self.geometry = geometry
        self._refuse_unsupported_geometry()
        if geometry.mla is not None and kv_b_proj is None:
            raise ValueError(
                f"layer {geometry.layer_idx}: an MLA layer needs kv_b_proj (latent -> per-head k_nope || v)"
            )
        self.kv_b_proj = kv_b_proj
        self.kv_cache_dtype = normalize_kv_cache_dtype(kv_cache_dtype)
        self.options = type(self).parse_options(options)
        self.kv_cache: torch.Tensor | None = None
        self.k_scale = self.v_scale = 1.0
        self._views: tuple[torch.Tensor, KVLayout, ops.CacheViews] | None = None

    def _refuse_unsupported_geometry(self) -> None:
        self._refuse(AttentionRequirements.from_geometry(self.geometry, "float32"), f"layer {self.geometry.layer_idx}")

    def kv_cache_spec(
        self, model_dtype: str, block_size: int | None = None, layout: KVLayout | str = KVLayout.NHD
    ) -> KVCacheSpec:
        return type(self).get_kv_cache_spec(self.geometry, model_dtype, self.kv_cache_dtype, block_size, layout)

    def attach_kv_cache(self, kv_cache: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
        """Give this layer its cache tensor (shape from `KVCacheSpec.cache_shape`)."""
        planes = 1 if self.geometry.mla else 2
        if kv_cache.dim() != 5 or kv_cache.shape[0] != planes:
            raise ValueError(
                f"layer {self.geometry.layer_idx}: kv_cache must be 5-D with {planes} plane(s) "
                f"(see KVCacheSpec.cache_shape), got shape {tuple(kv_cache.shape)}"
            )
        if self.kv_cache_dtype != "auto" and kv_cache.dtype != torch_dtype(self.kv_cache_dtype):
            raise ValueError(
                f"layer {self.geometry.layer_idx}: kv_cache_dtype is {self.kv_cache_dtype} but the "
                f"cache tensor is {kv_cache.dtype}"
            )
        self.kv_cache, self.k_scale, self.v_scale = kv_cache, float(k_scale), float(v_scale)
        self._views = None

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        metadata: TMetadata,
        forward_args: AttentionForwardArgs | None = None,
    ) -> torch.Tensor:
        """q [T, H, head_dim], k/v [T, kv_heads, head_dim] (MLA: latent [T, kv_lora_rank], k_pe [T, rope])
        -> [T, H, v_head_dim]. Writes k/v into the paged cache, then attends."""
        if forward_args is not None and not isinstance(forward_args, AttentionForwardArgs):
            raise TypeError(f"forward_args must be an AttentionForwardArgs, got {type(forward_args).__name__}")
        args = forward_args or _DEFAULT_ARGS
        self._check_inputs(q, metadata)
        g = self.geometry
        self._check_extra("topk_indices", args.topk_indices, (q.shape[0], g.indexer.index_topk) if g.indexer else None)
        self._check_extra("sinks", args.sinks, (g.num_heads,) if g.sinks else None)
        if args.update_kv_cache:
            self.write_kv(k, v, metadata)
        out = self._attend(q, metadata, args)
        shape = (q.shape[0], g.num_heads, g.v_head_dim)
        self._check_output(out, shape, q.dtype, "_attend", f" on layer {g.layer_idx}", "[T, num_heads, v_head_dim] = ")
        if args.output is not None:
            return args.output.copy_(out)
        return out

    def _attached_cache(self) -> torch.Tensor:
        if self.kv_cache is None:
            raise RuntimeError(
                f"layer {self.geometry.layer_idx}: no KV cache attached; the engine must call "
                f"Attention.bind / attach_kv_cache before forward"
            )
        return self.kv_cache

    def _check_inputs(self, q: torch.Tensor, metadata: AttentionMetadata) -> None:
        self._attached_cache()
        if not isinstance(metadata, self.Metadata):
            raise TypeError(
                f"{self.name} needs {self.Metadata.__name__} (build it with {type(self).__name__}"
                f".prepare), got {type(metadata).__name__}"
            )
        g = self.geometry
        if q.shape[1:] != (g.num_heads, g.head_dim) or q.shape[0] != metadata.num_tokens:
            raise ValueError(
                f"layer {g.layer_idx}: q must be [T={metadata.num_tokens}, {g.num_heads}, "
                f"{g.head_dim}], got {tuple(q.shape)}"
            )

    def _check_extra(self, name: str, value, shape: tuple | None) -> None:
        """A DSA layer needs its indexer's picks and a sinks layer its per-head logits (`shape`: what the layer
        needs, None when it has no such input); any other layer must not get them."""
        layer, (floating, dims, meaning, has, lacks) = self.geometry.layer_idx, _EXTRAS[name]
        if shape is None:
            if value is not None:
                raise ValueError(f"layer {layer}: {name} given to a layer {lacks}")
            return
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape or value.is_floating_point() != floating:
            got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)
            kind = "a float" if floating else "an integer"
            raise ValueError(
                f"layer {layer} {has}: pass AttentionForwardArgs({name}=...), {kind} tensor {dims} = {list(shape)} "
                f"of {meaning}, got {got}"
            )

    def _mla_plane(self, mla: MLASpec) -> torch.Tensor:
        """The MLA plane's latent ‖ k_pe columns (a DSA cache keeps its indexer keys after them)."""
        return self._attached_cache()[0][..., : mla.latent_dim]

    def _index_plane(self) -> torch.Tensor:
        g = self.geometry
        if g.indexer is None or g.mla is None:
            raise ValueError(f"layer {g.layer_idx} has no indexer (not DSA): it caches no indexer keys")
        return self._attached_cache()[0][..., g.mla.latent_dim :]

    def write_index_keys(self, keys: torch.Tensor, metadata: AttentionMetadata) -> None:
        """DSA: store this step's indexer keys [T, index_head_dim] at `metadata.slot_mapping`."""
        ops.write_plane(self._index_plane(), keys.unsqueeze(1), metadata.slot_mapping, metadata.layout, self.k_scale)

    def read_index_keys(self, slots: torch.Tensor, layout: KVLayout, dtype: torch.dtype) -> torch.Tensor:
        """DSA: the indexer keys at `slots` [N] as [N, index_head_dim]."""
        return ops.read_plane(self._index_plane(), slots, layout, dtype, self.k_scale)[:, 0]

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, metadata: AttentionMetadata) -> None:
        """Store this step's keys/values (MLA: latent ‖ k_pe) at `metadata.slot_mapping`."""
        slots, layout, cache = metadata.slot_mapping, metadata.layout, self._attached_cache()
        if self.geometry.mla is not None:
            entry = torch.cat([k, v], dim=-1).unsqueeze(1)
            ops.write_plane(self._mla_plane(self.geometry.mla), entry, slots, layout, self.k_scale)
            return
        ops.write_planes(cache, self.cache_views(layout), (k, v), slots, layout, (self.k_scale, self.v_scale))

    def cache_views(self, layout: KVLayout) -> ops.CacheViews:
        """Views of the attached cache in `layout`, made once per cache tensor (see `CacheViews`)."""
        cache, memo = self._attached_cache(), self._views
        if memo is None or memo[0] is not cache or memo[1] is not layout:
            memo = self._views = (cache, layout, ops.cache_views(cache, layout))
        return memo[2]

    def read_kv(self, slots: torch.Tensor, layout: KVLayout, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values at `slots` [N] as [N, kv_heads, head_dim] each (MLA: latent [N, kv_lora], k_pe [N, rope])."""
        cache = self._attached_cache()
        if self.geometry.mla is not None:
            entry = ops.read_plane(self._mla_plane(self.geometry.mla), slots, layout, dtype, self.k_scale)[:, 0]
            return entry.split([self.geometry.mla.kv_lora_rank, self.geometry.mla.qk_rope_head_dim], dim=-1)
        return (
            ops.read_plane(cache[0], slots, layout, dtype, self.k_scale),
            ops.read_plane(cache[1], slots, layout, dtype, self.v_scale),
        )

    def is_causal(self, args: AttentionForwardArgs) -> bool:
        """Encoder layers never mask the future, whatever the call says."""
        return args.causal and self.geometry.attn_type is not AttentionType.ENCODER

    def _attend(self, q: torch.Tensor, metadata: TMetadata, args: AttentionForwardArgs) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement _attend(q, metadata, args)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(layer={self.geometry.layer_idx}, {self.geometry.attn_type.value})"


_NO_SINKS = "built without them; build it with sinks=True"
# forward's per-layer inputs: floating, shape, what they are, what a layer needing them is / one refusing them lacks.
_EXTRAS = {
    "topk_indices": (False, "[T, index_topk]", "key positions (-1 pads)", "is DSA", "without an indexer (not DSA)"),
    "sinks": (True, "[num_heads]", "per-head sink logits", "has attention sinks", _NO_SINKS),
}


def backend_class(backend: str | type[AttentionBackend]) -> type[AttentionBackend]:
    """A backend class from a class or an installed backend name."""
    if not isinstance(backend, type):
        from ..registry import resolve

        return resolve("attention_backend", backend)
    if not issubclass(backend, AttentionBackend):
        raise TypeError(f"{backend.__name__} is not an AttentionBackend subclass")
    return backend


def create_attention(
    layer_idx: int,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int | None = None,
    *,
    backend: str | type[AttentionBackend],
    scale: float | None = None,
    kv_b_proj=None,
    kv_cache_dtype: str | None = "auto",
    options=None,
    **geometry,
) -> AttentionBackend:
    """A backend for one layer from its sizes; `geometry` is the rest of `AttentionGeometry` (an unknown argument
    is a TypeError naming it; nothing falls back to full attention)."""
    record = AttentionGeometry(
        layer_idx, num_heads, head_dim, num_kv_heads or num_heads, scale or head_dim**-0.5, **geometry
    )
    return build_backend(backend, record, kv_b_proj=kv_b_proj, kv_cache_dtype=kv_cache_dtype, options=options)


def build_backend(backend: str | type[AttentionBackend], geometry: AttentionGeometry, **instance) -> AttentionBackend:
    """A backend instance for a layer whose geometry record is already built (kv_b_proj, kv_cache_dtype, options)."""
    return backend_class(backend)(geometry, **instance)
