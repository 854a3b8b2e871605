"""A model-free runner: the next token is a hash of every token in the request's cache.

It keeps each request's cache as a token list and a real `KVCacheManager` with the scheduler's
block count, so a step that feeds tokens out of order, reuses a freed request's cache, or needs
more blocks than exist fails loudly.
"""

from __future__ import annotations

import torch

from kernelbay_engine.kv_cache import KVCacheManager

VOCAB = 97


def next_token(tokens: list[int]) -> int:
    """Deterministic function of the whole sequence: any corrupted cache changes the output."""
    acc = len(tokens)
    for t in tokens:
        acc = (acc * 31 + t) % 1_000_003
    return acc % VOCAB


class FakeRunner:
    def __init__(self, num_blocks: int, block_size: int):
        self.kv = KVCacheManager(num_blocks, block_size)
        self.cache: dict = {}
        self.steps: list[list[tuple[int, int]]] = []
        """Per step: (request_id, number of new tokens)."""
        self.prefills: dict = {}
        """request_id -> how many times it was fed from position 0 (more than once: recomputed)."""

    def step(self, requests) -> torch.Tensor:
        logits = torch.zeros(len(requests), VOCAB)
        for row, r in enumerate(requests):
            if r.start_pos == 0:
                self.prefills[r.request_id] = self.prefills.get(r.request_id, 0) + 1
            cached = self.cache.setdefault(r.request_id, [])
            assert r.start_pos == len(cached), f"request {r.request_id} fed from {r.start_pos}, cache {len(cached)}"
            self._grow(r.request_id, len(r.token_ids))
            cached.extend(r.token_ids)
            logits[row, next_token(cached)] = 1.0
        self.steps.append([(r.request_id, len(r.token_ids)) for r in requests])
        return logits

    def _grow(self, request_id, count: int) -> None:
        if request_id in self.kv:
            self.kv.append(request_id, count)
        else:
            self.kv.allocate(request_id, count)

    def free(self, request_id) -> None:
        del self.cache[request_id]
        self.kv.free(request_id)


def reference_tokens(prompt: list[int], max_tokens: int) -> list[int]:
    """What the fake model generates for `prompt` alone (greedy, no EOS)."""
    tokens, out = list(prompt), []
    for _ in range(max_tokens):
        out.append(next_token(tokens))
        tokens.append(out[-1])
    return out
