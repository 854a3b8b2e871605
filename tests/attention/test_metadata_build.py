"""build_metadata's fields against a token-by-token reference, on random steps (mixed prefill and decode,
scattered and consecutive blocks, spare blocks in a table, block sizes 1 to 16), and the decode gather index."""

from __future__ import annotations

import random

import pytest
import torch

from kernelbay.attention import build_metadata, padded_slots


def _random_step(rng: random.Random, block_size: int) -> list[tuple[int, int, tuple[int, ...]]]:
    pool = list(range(64))
    rng.shuffle(pool)
    rows = []
    for _ in range(rng.randint(1, 4)):
        query_len = rng.choice([1, 1, rng.randint(1, 20)])
        context_len = rng.choice([0, rng.randint(0, 40)])
        need = -(-(query_len + context_len) // block_size) + rng.randint(0, 2)  # spare blocks are allowed
        if rng.random() < 0.5:  # one run of consecutive ids
            first = rng.randint(0, 200)
            table = tuple(range(first, first + need))
        else:
            table = tuple(pool.pop() + 300 * len(rows) for _ in range(need))
        rows.append((query_len, context_len, table))
    return rows


def _slot(table: tuple[int, ...], pos: int, block_size: int) -> int:
    return table[pos // block_size] * block_size + pos % block_size


@pytest.mark.parametrize("seed", range(40))
def test_fields_match_a_token_by_token_reference(seed):
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 16])
    rows = _random_step(rng, block_size)
    md = build_metadata(rows, block_size)
    positions = [p for q, c, _ in rows for p in range(c, c + q)]
    assert md.positions.tolist() == positions and md.positions.dtype == torch.int64
    assert md.slot_mapping.tolist() == [_slot(t, p, block_size) for q, c, t in rows for p in range(c, c + q)]
    assert md.kv_gather_index.tolist() == [_slot(t, p, block_size) for q, c, t in rows for p in range(q + c)]
    assert md.kv_gather_index.dtype == md.slot_mapping.dtype == md.kv_start_loc.dtype == torch.int64
    starts, kv_starts = [0], [0]
    for q, c, _ in rows:
        starts.append(starts[-1] + q)
        kv_starts.append(kv_starts[-1] + q + c)
    assert md.query_start_loc.tolist() == starts and md.kv_start_loc.tolist() == kv_starts
    assert md.query_lens.tolist() == [q for q, _, _ in rows] and md.seq_lens.tolist() == [q + c for q, c, _ in rows]
    assert md.query_start_loc.dtype == md.query_lens.dtype == md.seq_lens.dtype == md.block_tables.dtype == torch.int32
    width = max(len(t) for _, _, t in rows)
    assert md.block_tables.tolist() == [list(t) + [-1] * (width - len(t)) for _, _, t in rows]
    runs = []
    for q, c, t in rows:
        need = -(-(q + c) // block_size)
        runs.append(t[0] * block_size if list(t[:need]) == list(range(t[0], t[0] + need)) else None)
    assert md.run_start_slots == tuple(runs)
    assert (md.num_reqs, md.num_tokens, md.max_seq_len) == (len(rows), len(positions), max(q + c for q, c, _ in rows))


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("extra", [0, 5])
def test_padded_slots_pad_each_row_with_its_first_key(seed, extra):
    """Each request's keys, then its slot 0 up to `width` (wider than the longest, as FLEX's buckets are)."""
    rng = random.Random(seed)
    block_size = rng.choice([1, 4, 16])
    rows = [(1, c, t) for _, c, t in _random_step(rng, block_size)]
    md = build_metadata(rows, block_size)
    width = md.max_seq_len + extra
    want = [[_slot(t, p if p <= c else 0, block_size) for p in range(width)] for _, c, t in rows]
    assert padded_slots(md, width).tolist() == want
