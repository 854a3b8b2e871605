"""A model-free runner over a paged token cache: the next token is a hash of every token in the request's cache.

Like the real runner it keeps no block accounting: it writes each step's tokens into the slots the
request's block table names and reads the whole sequence back through that table. A block handed to
two requests at once, a table too short for its tokens, or tokens fed out of order change or break
the output.
"""

from __future__ import annotations

import torch

VOCAB = 97


def next_token(tokens: list[int]) -> int:
    """Deterministic function of the whole sequence: any corrupted cache changes the output."""
    acc = len(tokens)
    for t in tokens:
        acc = (acc * 31 + t) % 1_000_003
    return acc % VOCAB


class FakeRunner:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.slots: list[int | None] = [None] * (num_blocks * block_size)
        """Token id cached at each flat slot (block * block_size + offset)."""
        self.steps: list[list[tuple[int, int]]] = []
        """Per step: (request_id, number of new tokens)."""
        self.prefills: dict = {}
        """request_id -> how many times it was fed from position 0 (more than once: recomputed)."""

    def step(self, requests) -> torch.Tensor:
        logits = torch.zeros(len(requests), VOCAB)
        for row, r in enumerate(requests):
            if r.start_pos == 0:
                self.prefills[r.request_id] = self.prefills.get(r.request_id, 0) + 1
            end = r.start_pos + len(r.token_ids)
            assert len(r.block_table) == -(-end // self.block_size), f"request {r.request_id}: table {r.block_table}"
            for pos, token in enumerate(r.token_ids, r.start_pos):
                self.slots[self._slot(r.block_table, pos)] = token
            cached = [self.slots[self._slot(r.block_table, pos)] for pos in range(end)]
            logits[row, next_token(cached)] = 1.0
        self.steps.append([(r.request_id, len(r.token_ids)) for r in requests])
        return logits

    def _slot(self, table: tuple[int, ...], pos: int) -> int:
        return table[pos // self.block_size] * self.block_size + pos % self.block_size


def reference_tokens(prompt: list[int], max_tokens: int) -> list[int]:
    """What the fake model generates for `prompt` alone (greedy, no EOS)."""
    tokens, out = list(prompt), []
    for _ in range(max_tokens):
        out.append(next_token(tokens))
        tokens.append(out[-1])
    return out
