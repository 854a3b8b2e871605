"""What the driver broadcasts to the workers each time, and what each rank reports once loaded."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Allocate:
    """Allocate every layer's KV cache of `num_blocks` blocks (the driver's scheduler planned it)."""

    num_blocks: int


@dataclass(frozen=True, slots=True)
class Step:
    """Run one engine step: the scheduled batch (runner `StepRequest`s) and the rows wanting every position's logits."""

    requests: tuple
    every_position: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GatherEmbedding:
    """Join the gather of the token table's vocabulary rows (`layers.whole_embedding`): a draft model on the driver
    looks tokens up in the whole table."""


@dataclass(frozen=True, slots=True)
class Stop:
    """Leave the loop and exit."""


@dataclass(frozen=True, slots=True)
class RankReport:
    """One rank once loaded: its share of the weights and KV cache, its kernels and its registry."""

    rank: int
    pid: int
    weight_bytes: int
    """Every parameter this rank holds."""
    sharded_weight_bytes: int
    """The parameters it holds a share of (the rest are replicas)."""
    bytes_per_block: int
    """One KV block across its layers (its KV heads only)."""
    attention_backends: tuple[tuple[str, str], ...]
    moe_backend: str | None
    geometry: tuple[int, int, int]
    """(attention heads, KV heads, FFN width) of its layers."""
    registry: tuple = ()
    """Its registry's slots with provenance (`handoff.registry_summary`)."""
    imported_at_start: tuple[str, ...] = ()
    """Exported provider modules already imported when its registry was rebuilt (lazy: none)."""
