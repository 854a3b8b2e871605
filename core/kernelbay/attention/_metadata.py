"""Per-step attention inputs for a packed batch, built once per step and shared by every layer."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
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


def _padded_tables(reqs: Sequence[StepRequest]) -> torch.Tensor:
    width = max(len(r.block_table) for r in reqs)
    rows = [list(r.block_table) + [-1] * (width - len(r.block_table)) for r in reqs]
    return torch.tensor(rows, dtype=torch.int32)


def _slots(req_ids: torch.Tensor, pos: torch.Tensor, tables: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat slot of token `pos` of request `req_ids` (vectorised)."""
    blocks = tables[req_ids, torch.div(pos, block_size, rounding_mode="floor")].to(torch.int64)
    return blocks * block_size + pos % block_size


def _offsets(lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For per-request `lengths`: (B + 1,) start offsets, each item's request, each item's index in it."""
    owner = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    start = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    return start, owner, torch.arange(owner.numel()) - start[owner]


def build_metadata(
    requests: Sequence, block_size: int, layout: KVLayout | str = KVLayout.NHD, device: str | torch.device = "cpu"
) -> AttentionMetadata:
    """Common per-step metadata; `requests` is `[(query_len, context_len, block_table_row), ...]`."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    reqs = [_as_step_request(r) for r in requests]
    if not reqs:
        raise ValueError("a step needs at least one request")
    _check_tables(reqs, block_size)
    q_host, s_host = tuple(r.query_len for r in reqs), tuple(r.seq_len for r in reqs)
    q_lens, s_lens = torch.tensor(q_host), torch.tensor(s_host)
    tables, ctx = _padded_tables(reqs), s_lens - q_lens
    q_start, q_req, q_offset = _offsets(q_lens)
    positions = q_offset + ctx[q_req]
    kv_start, kv_req, kv_pos = _offsets(s_lens)

    def i32(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=torch.int32)

    return AttentionMetadata(
        num_reqs=len(reqs),
        num_tokens=sum(q_host),
        block_size=block_size,
        layout=KVLayout.parse(layout),
        query_start_loc=i32(q_start),
        query_lens=i32(q_lens),
        seq_lens=i32(s_lens),
        block_tables=tables.to(device),
        slot_mapping=_slots(q_req, positions, tables, block_size).to(device),
        positions=positions.to(device),
        kv_start_loc=kv_start.to(device),
        kv_gather_index=_slots(kv_req, kv_pos, tables, block_size).to(device),
        query_lens_host=q_host,
        seq_lens_host=s_host,
        max_seq_len=max(s_host),
        run_start_slots=_run_start_slots(tables, s_lens, block_size),
    )


def _run_start_slots(tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> tuple[int | None, ...]:
    """First slot of each request whose needed blocks have consecutive ids, else None (vectorised)."""
    needed = (seq_lens + block_size - 1) // block_size
    steps = tables[:, 1:].to(torch.int64) - tables[:, :-1].to(torch.int64)
    inside = torch.arange(1, tables.shape[1]).unsqueeze(0) < needed.unsqueeze(1)
    is_run = ((steps == 1) | ~inside).all(dim=1)
    starts = (tables[:, 0].to(torch.int64) * block_size).tolist()
    return tuple(start if run else None for start, run in zip(starts, is_run.tolist(), strict=True))
