"""kernelbay block tables -> FlashInfer's CSR page table.

FlashInfer describes a batch's paged KV cache with three arrays: request b's pages are
`paged_kv_indices[paged_kv_indptr[b]:paged_kv_indptr[b + 1]]`, and only the first
`paged_kv_last_page_len[b]` (1..page_size) tokens of its last page are valid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class FlashInferPageTable:
    page_size: int
    qo_indptr: torch.Tensor
    """(B + 1,) int32, where each request's queries start in the packed batch; [-1] == T."""
    paged_kv_indptr: torch.Tensor
    """(B + 1,) int32, where each request's pages start in `paged_kv_indices`."""
    paged_kv_indices: torch.Tensor
    """(paged_kv_indptr[-1],) int32, physical page (block) ids, request after request."""
    paged_kv_last_page_len: torch.Tensor
    """(B,) int32, valid tokens in each request's last page, in 1..page_size."""
    kv_lens: torch.Tensor
    """(B,) int32, tokens each request attends to (what the MLA wrapper calls kv_len_arr)."""

    def __post_init__(self):
        batch = self.kv_lens.shape[0]
        expected = {"qo_indptr": (batch + 1,), "paged_kv_indptr": (batch + 1,), "paged_kv_last_page_len": (batch,)}
        for name, shape in expected.items():
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(
                    f"FlashInferPageTable.{name} must have shape {shape}, got {tuple(getattr(self, name).shape)}"
                )
        for name in ("qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "kv_lens"):
            if getattr(self, name).dtype != torch.int32:
                raise ValueError(
                    f"FlashInferPageTable.{name} must be int32 (FlashInfer's index type), "
                    f"got {getattr(self, name).dtype}"
                )

    @property
    def batch_size(self) -> int:
        return self.kv_lens.shape[0]

    def to(self, device) -> FlashInferPageTable:
        return FlashInferPageTable(self.page_size, *(getattr(self, n).to(device) for n in _TENSORS))


_TENSORS = ("qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "kv_lens")


def _indptr(counts: torch.Tensor) -> torch.Tensor:
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)


def _check_rows(pages: torch.Tensor, block_tables: torch.Tensor) -> None:
    width = block_tables.shape[1]
    short = (pages > width).nonzero().flatten().tolist()
    if short:
        b = short[0]
        raise ValueError(
            f"request #{b} needs {int(pages[b])} pages but its block table row has {width}; "
            f"grow it with KVCacheManager.append before building metadata"
        )
    used = torch.arange(width)[None, :] < pages[:, None]
    if (block_tables[used] < 0).any():
        bad = int((used & (block_tables < 0)).any(dim=1).nonzero()[0])
        raise ValueError(
            f"request #{bad} has a padding (-1) block among the pages it needs: "
            f"{block_tables[bad, : int(pages[bad])].tolist()}"
        )


def page_table_from_block_tables(
    query_lens: Sequence[int], seq_lens: Sequence[int], block_tables: torch.Tensor, page_size: int
) -> FlashInferPageTable:
    """The page table of one step: `block_tables` is (B, max_blocks) with -1 padding, on any device.

    Built on the host (FlashInfer's `plan` reads the index pointers on the host anyway).
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if not (len(query_lens) == len(seq_lens) == block_tables.shape[0]):
        raise ValueError(
            f"one query_len, seq_len and block-table row per request: got {len(query_lens)}, "
            f"{len(seq_lens)} and {block_tables.shape[0]}"
        )
    if any(s < q or q < 1 for q, s in zip(query_lens, seq_lens, strict=True)):
        pairs = list(zip(query_lens, seq_lens, strict=True))
        raise ValueError(f"each request needs 1 <= query_len <= seq_len, got {pairs}")
    tables = block_tables.detach().to("cpu", torch.int64)
    seq = torch.tensor(list(seq_lens), dtype=torch.int64)
    pages = (seq + page_size - 1) // page_size
    _check_rows(pages, tables)
    used = torch.arange(tables.shape[1])[None, :] < pages[:, None]
    return FlashInferPageTable(
        page_size=page_size,
        qo_indptr=_indptr(torch.tensor(list(query_lens), dtype=torch.int64)),
        paged_kv_indptr=_indptr(pages),
        paged_kv_indices=tables[used].to(torch.int32),  # row-major: request after request, pages in order
        paged_kv_last_page_len=(seq - (pages - 1) * page_size).to(torch.int32),
        kv_lens=seq.to(torch.int32),
    )
