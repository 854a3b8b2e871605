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
    spec_draft_tokens: int = 0
    """Speculative decoding: proposed tokens the model verified since the engine started."""
    spec_accepted_tokens: int = 0
    """Of those, tokens the model accepted (each one a token gained without a step of its own)."""
    spec_verifications: int = 0
    """Request-steps that verified proposals (each also emits one token of the model's own)."""

    @property
    def spec_acceptance_rate(self) -> float:
        """Accepted share of the proposed tokens (0 when none was proposed)."""
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else 0.0

    @property
    def spec_mean_accepted_length(self) -> float:
        """Tokens a verifying request gains per step: its accepted proposals plus the model's own token
        (vLLM's mean acceptance length; 1 would be plain decoding, 0 when nothing was verified)."""
        if not self.spec_verifications:
            return 0.0
        return (self.spec_accepted_tokens + self.spec_verifications) / self.spec_verifications
