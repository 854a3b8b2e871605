"""Prompt-lookup (n-gram) proposals: no extra model, only the request's own tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kernelbay_engine.request import Request
    from kernelbay_engine.scheduler import ScheduledChunk

MIN_NGRAM = 2
"""Shortest suffix looked up: a single token recurs too often to predict what follows it."""
MAX_NGRAM = 4
"""Longest suffix looked up (a longer match is rarely more precise and costs more to find)."""


class NgramProposer:
    """Proposes the tokens that followed the latest earlier occurrence of the sequence's last n tokens, for the
    longest n from MAX_NGRAM down to MIN_NGRAM that occurs earlier (vLLM's prompt lookup)."""

    def __init__(self, num_speculative_tokens: int, min_n: int = MIN_NGRAM, max_n: int = MAX_NGRAM):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram lengths must satisfy 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.num_speculative_tokens = num_speculative_tokens
        self.min_n = min_n
        self.max_n = max_n

    def propose_requests(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        return [self.propose(r.all_token_ids(), limit) for r, limit in zip(requests, limits, strict=True)]

    def observe(self, chunks: Sequence[ScheduledChunk]) -> None:
        """Nothing to keep: proposals come from the tokens alone."""

    def release(self, request: Request) -> None:
        """Nothing kept."""

    def propose(self, token_ids: Sequence[int], limit: int) -> list[int]:
        """Up to min(limit, num_speculative_tokens) tokens that may follow `token_ids` (empty: no earlier match)."""
        count = min(limit, self.num_speculative_tokens)
        if count <= 0 or len(token_ids) <= self.min_n:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            start = _latest_match(tokens, n)
            if start is not None:
                return tokens[start + n : start + n + count].tolist()
        return []


def _latest_match(tokens: np.ndarray, n: int) -> int | None:
    """Start of the latest occurrence of the last `n` tokens that ends before the last token, or None."""
    windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)  # every n-gram followed by a token
    hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
    return int(hits[-1]) if hits.size else None
