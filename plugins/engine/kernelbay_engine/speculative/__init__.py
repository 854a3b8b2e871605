"""Speculative decoding: cheap proposals for a request's next tokens, verified by the target model in one step.

Each decode step, a proposer guesses up to `num_speculative_tokens` tokens that follow a request's sequence
(`ngram`: the continuation of the latest earlier occurrence of its last few tokens, prompt lookup; a draft folder:
an EAGLE-3 head reading the target's hidden states, speculative/eagle.py). The
scheduler feeds the request's last token and the guesses as one multi-token row of the step (the same cached-
context row chunked prefill uses), so the target scores every guess in one forward; `verify.accept_drafts`
keeps the longest prefix the target agrees with plus one token of its own (greedy: identical to plain
decoding; sampling: rejection sampling, so tokens follow the target distribution). The rejected guesses'
cache slots are given back (`KVCacheManager.truncate`); they never reach the prefix cache, which registers
only blocks of accepted tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kernelbay_engine.speculative.ngram import NgramProposer

if TYPE_CHECKING:
    from kernelbay_engine.request import Request
    from kernelbay_engine.scheduler import ScheduledChunk

NGRAM = "ngram"
"""`speculative=` value for prompt-lookup (n-gram) proposals."""
DEFAULT_NUM_SPECULATIVE_TOKENS = 4
MAX_NUM_SPECULATIVE_TOKENS = 32


class Proposer(Protocol):
    """What the engine asks of a proposer (NgramProposer; EagleProposer, speculative/eagle.py) each step."""

    def propose_requests(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        """Before a step: each running request's proposals, at most its limit (0 for a request that is not
        decoding)."""
        ...

    def observe(self, chunks: Sequence[ScheduledChunk]) -> None:
        """After the target ran a step over `chunks`."""
        ...

    def release(self, request: Request) -> None:
        """The request finished, was aborted or preempted: drop whatever the proposer keeps for it."""
        ...


@dataclass(slots=True)
class SpeculationStats:
    """Proposals verified and accepted since the engine started (what `LLM.stats()` reports)."""

    draft_tokens: int = 0
    """Proposed tokens the target verified."""
    accepted_tokens: int = 0
    """Of those, tokens the target accepted."""
    verifications: int = 0
    """Request-steps that verified at least one proposed token."""

    def record(self, proposed: int, accepted: int) -> None:
        self.draft_tokens += proposed
        self.accepted_tokens += accepted
        self.verifications += 1


__all__ = [
    "DEFAULT_NUM_SPECULATIVE_TOKENS",
    "MAX_NUM_SPECULATIVE_TOKENS",
    "NGRAM",
    "NgramProposer",
    "Proposer",
    "SpeculationStats",
]
