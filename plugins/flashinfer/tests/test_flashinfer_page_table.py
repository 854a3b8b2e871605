"""kernelbay block tables -> FlashInfer's CSR page table (indptr, indices, last_page_len), checked without it."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelbay.attention import build_metadata


@pytest.fixture(scope="module")
def translate(sites):
    from kernelbay_flashinfer.page_table import page_table_from_block_tables

    return page_table_from_block_tables


def reference_page_table(requests, page_size):
    """The layout FlashInfer documents, written as the plainest loop."""
    indptr, indices, last = [0], [], []
    for query_len, context_len, table in requests:
        seq_len = query_len + context_len
        pages = math.ceil(seq_len / page_size)
        indices += list(table[:pages])
        indptr.append(indptr[-1] + pages)
        last.append(seq_len - (pages - 1) * page_size)
    return indptr, indices, last


def expand(table, page_size):
    """Flat cache slot of every key of every request, read back through the page table."""
    slots = []
    for b in range(table.batch_size):
        pages = table.paged_kv_indices[table.paged_kv_indptr[b] : table.paged_kv_indptr[b + 1]].tolist()
        for i, page in enumerate(pages):
            valid = int(table.paged_kv_last_page_len[b]) if i == len(pages) - 1 else page_size
            slots += [page * page_size + offset for offset in range(valid)]
    return slots


def _table_for(requests, page_size, translate):
    md = build_metadata(requests, page_size)
    return md, translate(md.query_lens_host, md.seq_lens_host, md.block_tables, page_size)


@st.composite
def steps(draw):
    page_size = draw(st.sampled_from([1, 2, 16, 32]))
    free = list(range(64))
    draw(st.randoms()).shuffle(free)
    requests = []
    for _ in range(draw(st.integers(1, 5))):
        context = draw(st.integers(0, 40))
        query = draw(st.integers(1, 12))
        pages = math.ceil((context + query) / page_size)
        spare = draw(st.integers(0, 2))  # block tables may hold more blocks than the step needs
        if pages + spare > len(free):
            break
        table, free = free[: pages + spare], free[pages + spare :]
        requests.append((query, context, table))
    return page_size, requests or [(1, 0, [0])]


@settings(max_examples=60, deadline=None)
@given(steps())
def test_page_table_matches_reference(translate, step):
    """indptr, indices and last_page_len equal the documented layout, for any lengths and fragmented tables."""
    page_size, requests = step
    md, table = _table_for(requests, page_size, translate)
    indptr, indices, last = reference_page_table(requests, page_size)
    assert table.paged_kv_indptr.tolist() == indptr
    assert table.paged_kv_indices.tolist() == indices
    assert table.paged_kv_last_page_len.tolist() == last
    assert all(1 <= n <= page_size for n in last)
    assert table.qo_indptr.tolist() == md.query_start_loc.tolist()
    assert table.kv_lens.tolist() == list(md.seq_lens_host)


@settings(max_examples=60, deadline=None)
@given(steps())
def test_page_table_addresses_the_same_slots_as_the_core(translate, step):
    """Reading keys through the page table visits exactly the core metadata's kv_gather_index slots."""
    page_size, requests = step
    md, table = _table_for(requests, page_size, translate)
    assert expand(table, page_size) == md.kv_gather_index.tolist()


def test_page_table_is_int32(translate):
    """Every index array has FlashInfer's index type, int32."""
    _, table = _table_for([(3, 17, [5, 9]), (1, 0, [2])], 16, translate)
    assert {
        t.dtype
        for t in (
            table.qo_indptr,
            table.paged_kv_indptr,
            table.paged_kv_indices,
            table.paged_kv_last_page_len,
            table.kv_lens,
        )
    } == {torch.int32}


def test_exactly_full_last_page(translate):
    """A sequence filling its last page exactly has last_page_len == page_size, not 0."""
    _, table = _table_for([(16, 16, [7, 3])], 16, translate)
    assert table.paged_kv_last_page_len.tolist() == [16]
    assert table.paged_kv_indices.tolist() == [7, 3]


def test_short_block_table_is_an_error(translate):
    """A block table without enough blocks is refused, naming the request and the fix."""
    with pytest.raises(ValueError, match=r"request #1 needs 2 pages but its block table row has 1"):
        translate([1, 5], [4, 20], torch.tensor([[0], [3]]), 16)


def test_padding_block_in_use_is_an_error(translate):
    """A -1 padding entry among the pages a request needs is refused."""
    with pytest.raises(ValueError, match=r"request #0 has a padding \(-1\) block"):
        translate([1], [20], torch.tensor([[4, -1, 6]]), 16)


def test_query_longer_than_sequence_is_an_error(translate):
    """query_len must not exceed seq_len."""
    with pytest.raises(ValueError, match="1 <= query_len <= seq_len"):
        translate([5], [3], torch.tensor([[0]]), 16)


def test_metadata_carries_the_page_table(sites):
    """FLASHINFER's prepare() builds the page table once per step, with a fresh step id each time."""
    from kernelbay_flashinfer.metadata import FlashInferMetadata

    rows = [(2, 30, [4, 1]), (1, 0, [9])]
    first, second = FlashInferMetadata.build(rows, 16), FlashInferMetadata.build(rows, 16)
    assert first.page_table.paged_kv_indptr.tolist() == [0, 2, 3]
    assert first.page_table.paged_kv_last_page_len.tolist() == [16, 1]
    assert first.step_id != second.step_id
