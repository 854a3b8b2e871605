"""`Attention`: the nn.Module model code instantiates, one per attention layer."""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Iterator

import torch

from kernelbay.attention import (
    AttentionBackend,
    AttentionGeometry,
    AttentionMetadata,
    AttentionType,
    build_backend,
)
from kernelbay.errors import KernelbayError
from kernelbay_engine.failures import KernelRaised


class AttentionLayerRegistry:
    """Weak references to a model's attention layers, keyed by layer index (`_0`, `_1` on collision)."""

    def __init__(self):
        self._layers: dict[str, weakref.ref] = {}

    def register(self, layer: Attention) -> str:
        key = str(layer.layer_idx)
        if key in self._layers:
            first = self._layers.pop(key)
            self._layers[f"{key}_0"] = first
        if f"{key}_0" in self._layers:
            suffix = sum(1 for k in self._layers if k.startswith(f"{key}_"))
            key = f"{key}_{suffix}"
        self._layers[key] = weakref.ref(layer)
        return key

    def layers(self) -> dict[str, Attention]:
        """Live layers by key, in registration order."""
        live = {k: ref() for k, ref in self._layers.items()}
        return {k: layer for k, layer in live.items() if layer is not None}


_ACTIVE: contextvars.ContextVar[AttentionLayerRegistry | None] = contextvars.ContextVar(
    "kernelbay_attn_layers", default=None
)


@contextlib.contextmanager
def collect_attention_layers() -> Iterator[AttentionLayerRegistry]:
    """`with collect_attention_layers() as layers: model = build()` registers every Attention built inside."""
    registry = AttentionLayerRegistry()
    token = _ACTIVE.set(registry)
    try:
        yield registry
    finally:
        _ACTIVE.reset(token)


class Attention(torch.nn.Module):
    """One attention layer: holds its geometry; the engine binds a backend and a cache tensor."""

    def __init__(self, geometry: AttentionGeometry, *, kv_b_proj: torch.nn.Module | None = None, prefix: str = ""):
        """`geometry`: the layer's record, built once from the config (`ModelConfig.layer_geometry(i)`); an MLA
        layer also takes `kv_b_proj`, the up-projection its backend may absorb."""
        super().__init__()
        self.geometry = geometry
        layer_idx = geometry.layer_idx
        if self.geometry.mla is not None and kv_b_proj is None:
            raise ValueError(f"layer {layer_idx} ({prefix or 'attention'}): MLA needs kv_b_proj")
        self.layer_idx, self.prefix = layer_idx, prefix
        self.kv_b_proj = kv_b_proj
        self.backend: AttentionBackend | None = None
        registry = _ACTIVE.get()
        if registry is not None:
            registry.register(self)

    @property
    def attn_type(self) -> AttentionType:
        return self.geometry.attn_type

    def bind(
        self,
        backend_cls: str | type[AttentionBackend],
        kv_cache: torch.Tensor,
        kv_cache_dtype: str | None = None,
        *,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        options=None,
    ) -> AttentionBackend:
        """Build this layer's backend instance and give it its cache tensor (the engine calls this)."""
        backend = build_backend(
            backend_cls, self.geometry, kv_b_proj=self.kv_b_proj, kv_cache_dtype=kv_cache_dtype, options=options
        )
        backend.attach_kv_cache(kv_cache, k_scale, v_scale)
        self.backend = backend
        return backend

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metadata: AttentionMetadata, forward_args=None
    ) -> torch.Tensor:
        """q [T, H, head_dim], k/v [T, kv_heads, head_dim] (MLA: latent, k_pe) -> [T, H, v_head_dim]."""
        backend = self._bound()
        try:
            return backend.forward(q, k, v, metadata, forward_args)
        except KernelbayError:
            raise
        except Exception as err:  # whatever a plugin's kernel raises is named as its failure
            raise KernelRaised("attention", backend.name, self, err) from err

    def cached_index_keys(self, keys: torch.Tensor, metadata: AttentionMetadata) -> list[torch.Tensor]:
        """DSA: write this step's indexer keys [T, index_head_dim] into the paged cache, then return each
        request's keys over its whole sequence ([seq_len, index_head_dim] per request, in step order)."""
        backend = self._bound()
        backend.write_index_keys(keys, metadata)
        every = backend.read_index_keys(metadata.kv_gather_index, metadata.layout, keys.dtype)
        return list(every.split(list(metadata.seq_lens_host)))

    def _bound(self) -> AttentionBackend:
        if self.backend is None:
            raise RuntimeError(
                f"attention layer {self.layer_idx} ({self.prefix or 'attention'}) is not bound; "
                f"the engine must call Attention.bind(backend, kv_cache) first"
            )
        return self.backend

    def extra_repr(self) -> str:
        g = self.geometry
        backend = self.backend.name if self.backend else "unbound"
        return (
            f"layer={g.layer_idx}, heads={g.num_heads}/{g.num_kv_heads}, head_dim={g.head_dim}, "
            f"{g.attn_type.value}, backend={backend}"
        )


def attention_layers(module: torch.nn.Module) -> dict[str, Attention]:
    """Every Attention under `module`, keyed like the layer registry (index, `_0`/`_1` on collision)."""
    registry = AttentionLayerRegistry()
    for sub in module.modules():
        if isinstance(sub, Attention):
            registry.register(sub)
    return registry.layers()
