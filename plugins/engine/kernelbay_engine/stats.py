"""`EngineStats`: a snapshot of what the engine holds now (what a server's /metrics reports)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counts read from the scheduler and its block ledger at one moment (`LLM.stats()`)."""

    running: int
    """Requests in the running batch (prefilling or decoding)."""
    waiting: int
    """Requests queued for admission (new, or preempted and to be recomputed)."""
    kv_blocks_used: int
    """KV-cache blocks held by requests."""
    kv_blocks_total: int
    """KV-cache blocks in the whole cache."""
    kv_blocks_cached: int
    """Blocks whose keys and values are in the prefix cache (held by requests, or kept after them until evicted)."""
    prefix_caching: bool
    """Prompts reuse cached prefix blocks (`LLM.prefix_caching` says why or why not)."""
    prefix_cache_queries: int
    """Prompt tokens looked up in the prefix cache since the engine started (counted at each admission)."""
    prefix_cache_hits: int
    """Of those, tokens found cached, whose keys and values were not computed again."""
