"""Per-step attention inputs for a packed batch, built once per step and shared by every layer."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from itertools import accumulate
from typing import Any

import torch

from ._geometry import KVLayout


@dataclass(frozen=True, slots=True)
class StepRequest:
    """One request's share of a step: `query_len` new tokens after `context_len` cached ones."""

    query_len: int
    context_len: int
    block_table: tuple[int, ...]

    def __post_init__(self):
        if self.query_len < 1:
            raise ValueError(
                f"query_len must be >= 1 (a request with no new token has no place in the step), got {self.query_len}"
            )
        if self.context_len < 0:
            raise ValueError(f"context_len must be >= 0, got {self.context_len}")

    @property
    def seq_len(self) -> int:
        return self.context_len + self.query_len


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """What every layer needs to attend over the paged cache for one step of T packed tokens, B requests."""

    num_reqs: int
    """B, the number of requests in the step."""
    num_tokens: int
    """T, the number of packed new tokens (sum of query_lens)."""
    block_size: int
    """Tokens per cache block."""
    layout: KVLayout
    """NHD or HND: how the bound cache tensors store a block."""
    query_start_loc: torch.Tensor
    """(B + 1,) int32, where each request's tokens start in the packed batch; [-1] == T."""
    query_lens: torch.Tensor
    """(B,) int32, new tokens per request."""
    seq_lens: torch.Tensor
    """(B,) int32, context_lens + query_lens: tokens attended to after this step's write."""
    block_tables: torch.Tensor
    """(B, max_blocks_per_req) int32, physical block ids per request, padded with -1."""
    slot_mapping: torch.Tensor
    """(T,) int64, flat cache slot (block * block_size + offset) receiving each new token's k/v."""
    positions: torch.Tensor
    """(T,) int64, each new token's position in its sequence (context_len + offset in the query)."""
    kv_start_loc: torch.Tensor
    """(B + 1,) int64, where each request's keys start in `kv_gather_index`; [-1] == sum(seq_lens)."""
    kv_gather_index: torch.Tensor
    """(sum(seq_lens),) int64, flat slot of every key of every request, request after request."""
    query_lens_host: tuple[int, ...]
    """Host copy of query_lens, so backends can loop without a device sync."""
    seq_lens_host: tuple[int, ...]
    """Host copy of seq_lens."""
    max_seq_len: int
    run_start_slots: tuple[int | None, ...] = ()
    """Per request, its first slot when all its blocks are one run of consecutive block ids (the keys are
    then one contiguous stretch of an NHD cache and can be read without a copy), else None."""

    @property
    def is_decode_only(self) -> bool:
        """Every request adds exactly one token."""
        return max(self.query_lens_host) == 1

    @classmethod
    def build(
        cls,
        requests: Sequence,
        block_size: int,
        layout: KVLayout | str = KVLayout.NHD,
        device: str | torch.device = "cpu",
    ) -> AttentionMetadata:
        """Build from `[(query_len, context_len, block_table_row), ...]`; subclasses add `_extras`."""
        common = build_metadata(requests, block_size, layout, device)
        return cls(**{f.name: getattr(common, f.name) for f in fields(AttentionMetadata)}, **cls._extras(common))

    @classmethod
    def _extras(cls, common: AttentionMetadata) -> dict[str, Any]:
        """Backend-specific fields computed once per step from the common ones (override in subclasses)."""
        return {}


def _as_step_request(item) -> StepRequest:
    if isinstance(item, StepRequest):
        return item
    query_len, context_len, table = item
    return StepRequest(int(query_len), int(context_len), table if isinstance(table, tuple) else tuple(map(int, table)))


def _check_tables(reqs: Sequence[StepRequest], block_size: int) -> None:
    for i, r in enumerate(reqs):
        need = math.ceil(r.seq_len / block_size)
        if len(r.block_table) < need:
            raise ValueError(
                f"request #{i} needs {need} block(s) for {r.seq_len} tokens (block_size {block_size}) but its "
                f"block table has {len(r.block_table)}; grow it with KVCacheManager.append before building metadata"
            )
        if need and min(r.block_table[:need]) < 0:
            raise ValueError(f"request #{i} has a negative block id in its block table {r.block_table[:need]}")


def _padded_tables(reqs: Sequence[StepRequest], device) -> torch.Tensor:
    width = max(len(r.block_table) for r in reqs)
    rows = [list(r.block_table) + [-1] * (width - len(r.block_table)) for r in reqs]
    return torch.tensor(rows, dtype=torch.int32, device=device)


def _new_token_slots(reqs: Sequence[StepRequest], block_size: int) -> list[int]:
    """Flat slot of each new token, request after request: one range per block touched (host ints, no ops)."""
    slots: list[int] = []
    for r in reqs:
        for block in range(r.context_len // block_size, (r.seq_len - 1) // block_size + 1):
            lo, base = block * block_size, r.block_table[block] * block_size
            slots.extend(range(base + max(r.context_len, lo) - lo, base + min(r.seq_len, lo + block_size) - lo))
    return slots


def _run_start(r: StepRequest, block_size: int) -> int | None:
    """The request's first slot when the blocks holding its keys have consecutive ids, else None."""
    need = -(-r.seq_len // block_size)
    first = r.block_table[0]
    return first * block_size if tuple(r.block_table[:need]) == tuple(range(first, first + need)) else None


def table_slots(block_tables: torch.Tensor, block_size: int, width: int) -> torch.Tensor:
    """(B, width) int64: the flat slot of each request's keys 0 .. width - 1, read off its block table (past the
    table's blocks, or in its -1 padding, the values are meaningless: mask them)."""
    blocks = -(-width // block_size)
    if blocks > block_tables.shape[1]:
        block_tables = torch.nn.functional.pad(block_tables, (0, blocks - block_tables.shape[1]), value=-1)
    base = block_tables[:, :blocks].to(torch.int64).mul_(block_size).unsqueeze(2)
    offsets = torch.arange(block_size, device=block_tables.device)
    return (base + offsets).view(block_tables.shape[0], -1)[:, :width]


def padded_slots(md: AttentionMetadata, width: int) -> torch.Tensor:
    """(B, width) int64 flat slots of each request's keys for a decode gather; past its seq_len, its slot 0 (a
    real key, for the kernel to mask)."""
    if all(s == width for s in md.seq_lens_host):
        return md.kv_gather_index.view(md.num_reqs, width)
    slots = table_slots(md.block_tables, md.block_size, width)
    valid = torch.arange(width, device=slots.device) < md.seq_lens.unsqueeze(1)
    return torch.where(valid, slots, slots[:, :1])


def _gather_index(reqs: Sequence[StepRequest], tables: torch.Tensor, block_size: int, runs) -> torch.Tensor:
    """`kv_gather_index`: one arange for a single request that is one run, else sliced off its table's slots."""
    if len(reqs) == 1 and runs[0] is not None:
        return torch.arange(runs[0], runs[0] + reqs[0].seq_len, device=tables.device)
    widest = max(r.seq_len for r in reqs)
    slots = table_slots(tables, block_size, widest)
    if len(reqs) == 1:
        return slots[0]
    lens = torch.tensor([r.seq_len for r in reqs], device=tables.device)
    # masked_select, not slots[mask]: CPU boolean indexing costs ~10 ms here (B 8, 2k keys), this ~30 us
    return torch.masked_select(slots, torch.arange(widest, device=tables.device) < lens.unsqueeze(1))


def build_metadata(
    requests: Sequence, block_size: int, layout: KVLayout | str = KVLayout.NHD, device: str | torch.device = "cpu"
) -> AttentionMetadata:
    """Common per-step metadata; `requests` is `[(query_len, context_len, block_table_row), ...]`.

    Built from host ints (one tensor per field) rather than vectorised ops: a step's metadata is ~15 aten calls,
    not ~70; only the gather index, whose size is every request's keys, is computed on tensors."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    reqs = [_as_step_request(r) for r in requests]
    if not reqs:
        raise ValueError("a step needs at least one request")
    _check_tables(reqs, block_size)
    q_host, s_host = tuple(r.query_len for r in reqs), tuple(r.seq_len for r in reqs)
    positions = [p for r in reqs for p in range(r.context_len, r.seq_len)]
    tables, runs = _padded_tables(reqs, device), tuple(_run_start(r, block_size) for r in reqs)

    def tensor(values, dtype=torch.int64) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    return AttentionMetadata(
        num_reqs=len(reqs),
        num_tokens=len(positions),
        block_size=block_size,
        layout=KVLayout.parse(layout),
        query_start_loc=tensor([0, *accumulate(q_host)], torch.int32),
        query_lens=tensor(q_host, torch.int32),
        seq_lens=tensor(s_host, torch.int32),
        block_tables=tables,
        slot_mapping=tensor(_new_token_slots(reqs, block_size)),
        positions=tensor(positions),
        kv_start_loc=tensor([0, *accumulate(s_host)]),
        kv_gather_index=_gather_index(reqs, tables, block_size, runs),
        query_lens_host=q_host,
        seq_lens_host=s_host,
        max_seq_len=max(s_host),
        run_start_slots=runs,
    )
