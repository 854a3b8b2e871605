"""Int8 paged KV storage with one float32 scale per (plane, block, kv head).

A block's scale only grows: when a new token is larger than anything stored in its block so far, the
block's existing int8 entries are re-quantised to the new scale before the token is written.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelbay.attention import KVCacheSpec, KVLayout, zeroed

QMAX = 127.0


@dataclass(frozen=True, slots=True)
class Int8KVCacheSpec(KVCacheSpec):
    """A KVCacheSpec whose payload is int8; scales ([planes, num_blocks, kv_heads] float32) live beside it."""

    dtype: str = "int8"

    def __post_init__(self):
        for name in ("num_kv_heads", "head_dim", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"Int8KVCacheSpec.{name} must be >= 1, got {getattr(self, name)}")
        if self.dtype != "int8":
            raise ValueError(f"Int8KVCacheSpec stores int8; got dtype {self.dtype!r} (use KVCacheSpec for others)")
        if self.mla:
            raise ValueError("Int8KVCacheSpec does not cache MLA latents; ACME_INT8 does not declare mla")
        object.__setattr__(self, "layout", KVLayout.parse(self.layout))
        if self.layout is not KVLayout.NHD:
            raise ValueError("Int8KVCacheSpec pages are NHD ([block_size, kv_heads, head_dim] per block); got HND")

    @property
    def bytes_per_block(self) -> int:
        """int8 payload plus one float32 scale per plane and kv head."""
        return self.planes * self.num_kv_heads * (self.block_size * self.head_dim + 4)

    @property
    def bytes_per_token(self) -> int:
        return -(-self.bytes_per_block // self.block_size)

    def allocate(self, num_blocks: int, device="cpu") -> torch.Tensor:
        """The int8 payload, shaped `cache_shape(num_blocks)`; the backend allocates the scales beside it."""
        return zeroed(self.cache_shape(num_blocks), torch.int8, device)  # untouched pages stay non-resident


class Int8PagedKV:
    """payload: [2, num_blocks, block_size, kv_heads, head_dim] int8 (NHD); scales: [2, num_blocks, kv_heads]."""

    def __init__(self, payload: torch.Tensor):
        if payload.dtype != torch.int8 or payload.dim() != 5 or payload.shape[0] != 2:
            raise ValueError(
                f"the ACME_INT8 cache must be an int8 tensor [2, blocks, block_size, kv_heads, head_dim]"
                f" (allocate it with AcmeInt8Backend.get_kv_cache_spec(...).allocate(n)); got "
                f"{payload.dtype} {tuple(payload.shape)}"
            )
        self.payload = payload
        _, blocks, self.block_size, heads, _ = payload.shape
        self.scales = torch.zeros(2, blocks, heads, dtype=torch.float32, device=payload.device)

    def write(self, plane: int, values: torch.Tensor, slots: torch.Tensor) -> None:
        """Quantise `values` [T, kv_heads, head_dim] into flat `slots` [T] of `plane` (0: keys, 1: values)."""
        blocks = torch.div(slots, self.block_size, rounding_mode="floor")
        token_max = values.detach().abs().amax(dim=-1).float()  # [T, kv_heads]
        old = self.scales[plane].clone()
        # A token at offset 0 starts its block afresh: a recycled block must not keep its last owner's scale.
        old[blocks[slots % self.block_size == 0]] = 0.0
        index = blocks.unsqueeze(-1).expand_as(token_max)
        new = (old * QMAX).scatter_reduce(0, index, token_max, "amax", include_self=True) / QMAX
        self._rescale_blocks(plane, blocks.unique(), old, new)
        safe = torch.where(new > 0, new, torch.ones_like(new))
        quantised = (values.float() / safe[blocks].unsqueeze(-1)).round_().clamp_(-QMAX, QMAX).to(torch.int8)
        flat = self.payload[plane].view(-1, *self.payload.shape[3:])
        flat.index_copy_(0, slots, quantised)
        self.scales[plane] = new

    def _rescale_blocks(self, plane: int, blocks: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> None:
        """Entries already in `blocks` were quantised with `old`; bring them to `new` (only ever larger)."""
        ratio = torch.where(new[blocks] > 0, old[blocks] / new[blocks].clamp_min(1e-30), torch.ones_like(old[blocks]))
        stored = self.payload[plane, blocks].float() * ratio[:, None, :, None]
        self.payload[plane, blocks] = stored.round_().clamp_(-QMAX, QMAX).to(torch.int8)

    def gather(self, plane: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """int8 entries [N, kv_heads, head_dim] and their scales [N, kv_heads] at flat `slots` [N]."""
        flat = self.payload[plane].view(-1, *self.payload.shape[3:])
        blocks = torch.div(slots, self.block_size, rounding_mode="floor")
        return flat.index_select(0, slots), self.scales[plane][blocks]

    def dequantise(self, plane: int, slots: torch.Tensor) -> torch.Tensor:
        """float32 [N, kv_heads, head_dim] at `slots`: what the kernel effectively attends over."""
        entries, scales = self.gather(plane, slots)
        return entries.float() * scales.unsqueeze(-1)
