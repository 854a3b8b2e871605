"""How much cache one layer needs per token, and the shape of its paged cache tensor."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..dtypes import ELEMENT_BYTES, normalize_kv_cache_dtype, torch_dtype
from ._geometry import KVLayout


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    """Paged-cache geometry of one attention layer: k and v planes of `num_kv_heads x head_dim` per token, or
    for MLA one plane of the latent (`num_kv_heads == 1`), with a DSA layer's indexer keys after it."""

    num_kv_heads: int
    head_dim: int
    dtype: str  # the storage dtype (never "auto": resolve it first)
    block_size: int = 16
    layout: KVLayout = KVLayout.NHD
    mla: bool = False
    index_head_dim: int = 0  # DSA (MLA only): the indexer key cached per token after the latent
    stride_order: tuple[int, ...] = (0, 1, 2, 3, 4)
    """Physical order of the `cache_shape` dims in memory, outermost first (the tensor keeps its logical shape;
    (0, 3, 1, 2, 4) with NHD stores each KV head's blocks together)."""

    def __post_init__(self):
        for name in ("num_kv_heads", "head_dim", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"KVCacheSpec.{name} must be >= 1, got {getattr(self, name)}")
        dtype = normalize_kv_cache_dtype(self.dtype)
        if dtype == "auto":
            raise ValueError("KVCacheSpec.dtype must be a storage dtype; resolve 'auto' to the model dtype first")
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "layout", KVLayout.parse(self.layout))
        if self.mla and self.num_kv_heads != 1:
            raise ValueError(
                f"an MLA cache stores one latent per token: num_kv_heads must be 1, got {self.num_kv_heads}"
            )
        if self.index_head_dim < 0 or (self.index_head_dim and not self.mla):
            raise ValueError(
                f"KVCacheSpec.index_head_dim must be >= 0 and only set on an MLA cache (DSA keys ride beside the "
                f"latent), got {self.index_head_dim} with mla={self.mla}"
            )
        object.__setattr__(self, "stride_order", tuple(int(d) for d in self.stride_order))
        if sorted(self.stride_order) != list(range(5)):
            raise ValueError(
                f"KVCacheSpec.stride_order must order the 5 cache dims (a permutation of 0..4), got {self.stride_order}"
            )

    @property
    def planes(self) -> int:
        """2 (k and v) for standard attention, 1 (the latent) for MLA."""
        return 1 if self.mla else 2

    @property
    def bytes_per_token(self) -> int:
        """Cache bytes one token takes in this layer."""
        return self.planes * self.num_kv_heads * self.entry_width * ELEMENT_BYTES[self.dtype]

    @property
    def index_bytes_per_token(self) -> int:
        """The DSA indexer keys' share of `bytes_per_token` (0 without an indexer)."""
        return self.planes * self.num_kv_heads * self.index_head_dim * ELEMENT_BYTES[self.dtype]

    @property
    def entry_width(self) -> int:
        """Elements one token stores per plane and KV head: head_dim, plus the indexer key under DSA."""
        return self.head_dim + self.index_head_dim

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    @property
    def page_size_bytes(self) -> int:
        """vLLM's name for `bytes_per_block` (which a spec storing more, scales say, overrides): the engine's plan."""
        return self.bytes_per_block

    def cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        """(planes, num_blocks, block_size, kv_heads, entry_width) for NHD; block_size and kv_heads swap for HND."""
        if self.layout is KVLayout.NHD:
            return (self.planes, num_blocks, self.block_size, self.num_kv_heads, self.entry_width)
        return (self.planes, num_blocks, self.num_kv_heads, self.block_size, self.entry_width)

    def allocate(self, num_blocks: int, device="cpu"):
        """A zeroed cache tensor of `cache_shape(num_blocks)` in the storage dtype, laid out in `stride_order`
        (`zeroed`: on the CPU a large cache costs memory as it fills)."""
        shape = self.cache_shape(num_blocks)
        physical = zeroed([shape[d] for d in self.stride_order], torch_dtype(self.dtype), device)
        inverse = sorted(range(5), key=self.stride_order.__getitem__)
        return physical.permute(*inverse)


_LAZY_MIN_BYTES = 2**20  # below this a plain torch.zeros costs nothing worth saving


def zeroed(shape: list[int], dtype, device="cpu"):
    """torch.zeros(shape), but on the CPU over a private anonymous mmap for large tensors: the kernel hands out
    zero-filled pages on first touch, so every slot reads 0 (as backends padding over unused slots expect)
    while untouched pages are not resident (torch.zeros writes, hence commits, every page)."""
    import mmap

    import torch

    device = torch.device(device)
    numel = math.prod(shape)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or nbytes < _LAZY_MIN_BYTES or not hasattr(mmap, "MAP_PRIVATE"):
        return torch.zeros(shape, dtype=dtype, device=device)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(pages, dtype=torch.uint8).view(dtype).view(shape)  # the tensor keeps `pages` alive
