"""The paged KV cache: spec sizes and the block manager's bookkeeping."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from kernelbay.attention import KVCacheSpec, KVLayout, build_metadata
from kernelbay_engine.kv_cache import KVCacheExhausted, KVCacheManager


def test_spec_bytes_standard_and_mla():
    """Standard layers cache 2 x kv_heads x head_dim per token; MLA caches the latent once."""
    assert KVCacheSpec(8, 128, "bfloat16").bytes_per_token == 2 * 8 * 128 * 2
    mla = KVCacheSpec(1, 512 + 64, "bfloat16", mla=True)
    assert mla.bytes_per_token == 576 * 2
    assert KVCacheSpec(8, 128, "fp8_e4m3").bytes_per_token == 2 * 8 * 128
    assert KVCacheSpec(8, 128, "float32", block_size=32).bytes_per_block == 32 * 2 * 8 * 128 * 4


@pytest.mark.parametrize(
    "spec",
    [
        KVCacheSpec(2, 8, "bfloat16", block_size=16),
        KVCacheSpec(1, 40, "float32", mla=True),
        KVCacheSpec(4, 8, "fp8_e4m3", layout="HND"),
    ],
)
def test_page_size_is_what_one_block_allocates(spec):
    """page_size_bytes is the bytes a block of the allocated cache tensor takes (planes included)."""
    cache = spec.allocate(3)
    assert spec.page_size_bytes == spec.bytes_per_block == cache.numel() * cache.element_size() // 3


def test_spec_shapes_per_layout():
    """NHD keeps [block, token, head, dim]; HND swaps token and head."""
    spec = KVCacheSpec(4, 64, "float16", block_size=16)
    assert spec.cache_shape(10) == (2, 10, 16, 4, 64)
    assert replace(spec, layout="HND").cache_shape(10) == (2, 10, 4, 16, 64)
    assert spec.allocate(3).dtype == torch.float16


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_kv_heads=0, head_dim=8, dtype="float32"), "num_kv_heads must be >= 1"),
        (dict(num_kv_heads=1, head_dim=8, dtype="auto"), "resolve 'auto' to the model dtype first"),
        (dict(num_kv_heads=2, head_dim=8, dtype="float32", mla=True), "num_kv_heads must be 1"),
        (dict(num_kv_heads=1, head_dim=8, dtype="int4"), "unknown KV-cache dtype 'int4'"),
    ],
)
def test_spec_rejects_bad_fields(kwargs, message):
    """Every bad spec field is a ValueError saying what to change."""
    with pytest.raises(ValueError, match=message):
        KVCacheSpec(**kwargs)


def test_allocate_append_free_and_slot_mapping():
    """Blocks grow one at a time as tokens are appended; slots follow the block table."""
    mgr = KVCacheManager(num_blocks=8, block_size=4)
    assert mgr.allocate("a", 5) == (0, 1)
    assert mgr.append("a", 3) == ()
    assert mgr.append("a", 1) == (2,)  # right after its last block: the request stays one run
    assert mgr.num_tokens("a") == 9 and mgr.num_free_blocks == 5
    assert mgr.slot_mapping("a", 2) == [7, 8]
    row = mgr.step_request("a", 1)
    assert (row.query_len, row.context_len, row.block_table) == (1, 8, (0, 1, 2))
    assert mgr.free("a") == 3 and mgr.num_free_blocks == 8


def test_exhaustion_names_needed_and_free_blocks_and_changes_nothing():
    """Running out is an error naming needed vs free blocks; the failed call allocates nothing."""
    mgr = KVCacheManager(num_blocks=4, block_size=16)
    mgr.allocate("a", 40)
    with pytest.raises(
        KVCacheExhausted,
        match=r"request 'b' needs 2 free block\(s\) for 20 tokens but only 1 of 4 "
        r"are free; free or preempt a request",
    ):
        mgr.allocate("b", 20)
    assert "b" not in mgr and mgr.num_free_blocks == 1
    assert not mgr.can_append("a", 30) and mgr.can_append("a", 24)
    with pytest.raises(KVCacheExhausted, match="needs 2 more block"):
        mgr.append("a", 30)
    assert mgr.num_tokens("a") == 40 and mgr.num_free_blocks == 1


def test_misuse_is_an_error():
    """Double allocation, unknown ids and double free are errors, not silent no-ops."""
    mgr = KVCacheManager(num_blocks=4, block_size=4)
    mgr.allocate("a", 1)
    with pytest.raises(ValueError, match="already holds blocks; use append"):
        mgr.allocate("a", 1)
    with pytest.raises(KeyError, match="holds no blocks; allocate"):
        mgr.append("zz")
    mgr.free("a")
    with pytest.raises(KeyError, match="never allocated or already freed"):
        mgr.free("a")
    with pytest.raises(ValueError, match="cannot map the last 3"):
        mgr.allocate("b", 2) and mgr.slot_mapping("b", 3)


def test_random_churn_never_shares_a_block():
    """Under random allocate/append/free (continuous batching with preemption) no block has two owners."""
    rng = random.Random(0)
    mgr = KVCacheManager(num_blocks=32, block_size=4)
    for step in range(2000):
        live = mgr.request_ids()
        action = rng.random()
        try:
            if action < 0.3:
                mgr.allocate(step, rng.randint(0, 20))
            elif action < 0.8 and live:
                mgr.append(rng.choice(live), rng.randint(1, 6))
            elif live:
                mgr.free(rng.choice(live))
        except KVCacheExhausted:
            mgr.free(rng.choice(live)) if live else None
        owned = [b for rid in mgr.request_ids() for b in mgr.block_table(rid)]
        assert len(owned) == len(set(owned)), f"step {step}: a block is shared"
        assert len(owned) + mgr.num_free_blocks == 32
        assert all(len(mgr.block_table(r)) == mgr.blocks_needed(mgr.num_tokens(r)) for r in mgr.request_ids())


def test_placement_keeps_requests_in_runs_while_it_can():
    """A new request lands mid-way in the largest free run, so its left neighbour can still grow in place."""
    mgr = KVCacheManager(num_blocks=16, block_size=1)
    assert mgr.allocate("a", 2) == (0, 1)
    assert mgr.allocate("b", 2) == (8, 9)
    assert mgr.append("a", 3) == (2, 3, 4)
    assert mgr.append("b", 1) == (10,)
    mgr.allocate("c", 5)
    assert mgr.block_table("c") == (11, 12, 13, 14, 15)
    assert mgr.append("c", 2) == (5, 6)  # no room after c: any free blocks, capacity is never lost


def test_grow_to_and_extra_blocks_count_tokens_in_all():
    """grow_to allocates a new request or extends a known one to a total; extra_blocks prices that total."""
    mgr = KVCacheManager(num_blocks=6, block_size=4)
    assert mgr.extra_blocks("a", 5) == 2
    assert mgr.grow_to("a", 5) == mgr.block_table("a") and mgr.num_tokens("a") == 5
    assert mgr.extra_blocks("a", 8) == 0 and mgr.extra_blocks("a", 9) == 1
    assert len(mgr.grow_to("a", 9)) == 3 and mgr.num_free_blocks == 3
    with pytest.raises(ValueError, match="cannot shrink"):
        mgr.grow_to("a", 4)
    with pytest.raises(KVCacheExhausted, match="needs 4 free block"):
        mgr.grow_to("b", 13)
    assert "b" not in mgr and mgr.num_free_blocks == 3


def test_reserve_step_is_all_or_nothing_and_checks_positions():
    """A step's growth is checked as a whole before any request grows; positions must continue the cache."""
    mgr = KVCacheManager(num_blocks=3, block_size=4)
    rows = mgr.reserve_step([("a", 0, 9)])
    assert [(r.query_len, r.context_len, r.block_table) for r in rows] == [(9, 0, mgr.block_table("a"))]
    with pytest.raises(KVCacheExhausted, match="this step needs 2 more KV-cache block"):
        mgr.reserve_step([("a", 9, 4), ("b", 0, 1)])
    assert mgr.num_tokens("a") == 9 and "b" not in mgr
    with pytest.raises(ValueError, match="start_pos 3 but 9 tokens are cached"):
        mgr.reserve_step([("a", 3, 1)])
    with pytest.raises(ValueError, match=r"is new .* start_pos is 5"):
        mgr.reserve_step([("c", 5, 1)])


def test_freed_blocks_are_reused():
    """The free list hands freed blocks out again."""
    mgr = KVCacheManager(num_blocks=2, block_size=4)
    mgr.allocate("a", 8)
    mgr.free("a")
    assert sorted(mgr.allocate("b", 8)) == [0, 1]


@pytest.mark.parametrize("layout", list(KVLayout))
def test_slots_written_land_in_their_block_for_both_layouts(layout):
    """A token written at its slot is found at (block, offset) in the layout's cache shape."""
    from kernelbay.attention.cache_ops import read_plane, write_plane

    mgr = KVCacheManager(num_blocks=6, block_size=4, layout=layout)
    mgr.allocate("x", 1)
    mgr.allocate("a", 6)
    spec = KVCacheSpec(2, 3, "float32", block_size=4, layout=layout)
    cache = spec.allocate(6)
    values = torch.arange(6 * 2 * 3, dtype=torch.float32).view(6, 2, 3)
    slots = torch.tensor(mgr.slot_mapping("a", 6))
    write_plane(cache[0], values, slots, layout)
    block, offset = mgr.block_table("a")[1], 1  # token 5 of request a
    stored = cache[0, block, offset] if layout is KVLayout.NHD else cache[0, block, :, offset]
    assert torch.equal(stored, values[5])
    assert torch.equal(read_plane(cache[0], slots, layout, torch.float32), values)


HEADS_FIRST = {KVLayout.NHD: (0, 3, 1, 2, 4), KVLayout.HND: (0, 2, 1, 3, 4)}


@pytest.mark.parametrize("layout", list(KVLayout))
@pytest.mark.parametrize("dtype", ["float32", "fp8_e4m3"])
def test_a_stride_order_changes_memory_not_what_slots_hold(layout, dtype):
    """A heads-first cache has the logical shape, heads outermost in memory, and the same slot contents:
    writes then gathers (with and without a reused buffer) match a default-order cache exactly."""
    from kernelbay.attention.cache_ops import read_plane, write_plane

    spec = KVCacheSpec(3, 4, dtype, block_size=4, layout=layout)
    heads_first = replace(spec, stride_order=HEADS_FIRST[layout]).allocate(5)
    plain = spec.allocate(5)
    assert heads_first.shape == plain.shape == spec.cache_shape(5)
    assert heads_first.permute(*HEADS_FIRST[layout]).is_contiguous() and not heads_first.is_contiguous()
    values = torch.randn(9, 3, 4)
    slots = torch.tensor([17, 3, 4, 5, 6, 0, 19, 8, 12])
    for cache in (heads_first, plain):
        write_plane(cache[0], values, slots, layout)
    assert torch.equal(heads_first, plain)
    expected = read_plane(plain[0], slots, layout, torch.float32)
    assert torch.equal(read_plane(heads_first[0], slots, layout, torch.float32), expected)
    buffer = torch.empty(9, 3, 4)
    if dtype == "float32":
        assert torch.equal(read_plane(heads_first[0], slots, layout, torch.float32, out=buffer), expected)


def test_stride_order_must_order_the_five_dims():
    with pytest.raises(ValueError, match=r"stride_order must order the 5 cache dims .* got \(0, 1, 1, 3, 4\)"):
        KVCacheSpec(2, 8, "float32", stride_order=(0, 1, 1, 3, 4))


def test_sdpa_stores_heads_first_so_a_run_is_contiguous_per_head():
    """SDPA's cache spec puts KV heads outermost: a request's run of blocks is, per head, one
    contiguous [tokens, head_dim] matrix (what its decode hands to scaled_dot_product_attention)."""
    from kernelbay.attention import create_attention
    from kernelbay.attention.cache_ops import cache_views

    layer = create_attention(0, num_heads=4, head_dim=8, num_kv_heads=2, backend="SDPA")
    spec = layer.kv_cache_spec("float32", 4)
    assert spec.stride_order == HEADS_FIRST[KVLayout.NHD]
    views = cache_views(spec.allocate(6), KVLayout.NHD)
    run = views.by_head[0].narrow(2, 8, 10)  # blocks 2..4
    assert run.shape == (1, 2, 10, 8) and all(run[0, h].is_contiguous() for h in range(2))
    assert views.heads_flat is not None and views.heads_flat.shape == (2 * 2, 6 * 4, 8)


def test_metadata_fields_for_a_mixed_step():
    """build_metadata derives offsets, positions, slots and the gather index from the block tables."""
    md = build_metadata([(2, 3, (5, 1)), (1, 0, (2,))], block_size=4)
    assert md.query_start_loc.tolist() == [0, 2, 3]
    assert md.seq_lens.tolist() == [5, 1] and md.query_lens.tolist() == [2, 1]
    assert md.positions.tolist() == [3, 4, 0]
    assert md.slot_mapping.tolist() == [23, 4, 8]
    assert md.kv_gather_index.tolist() == [20, 21, 22, 23, 4, 8]
    assert md.block_tables.tolist() == [[5, 1], [2, -1]]
    assert md.run_start_slots == (None, 8)
    assert build_metadata([(1, 7, (3, 4, 9))], block_size=4).run_start_slots == (12,)  # block 9 is not needed
    assert not md.is_decode_only and md.max_seq_len == 5


@pytest.mark.parametrize(
    "requests, message",
    [
        ([(3, 20, (0,))], r"request #0 needs 2 block\(s\) for 23 tokens .* block table has 1"),
        ([(0, 2, (0,))], "query_len must be >= 1"),
        ([], "at least one request"),
    ],
)
def test_metadata_rejects_inconsistent_requests(requests, message):
    """A block table too short for its tokens (or an empty step) is refused with the fix."""
    with pytest.raises(ValueError, match=message):
        build_metadata(requests, block_size=16)


def test_the_old_cache_ops_module_still_works_with_a_deprecation_warning():
    """`kernelbay.attention._cache_ops` (the guides' spelling before cache_ops was public) keeps working, warning."""
    import importlib
    import sys

    from kernelbay.attention import cache_ops

    sys.modules.pop("kernelbay.attention._cache_ops", None)
    with pytest.warns(DeprecationWarning, match="import kernelbay.attention.cache_ops"):
        old = importlib.import_module("kernelbay.attention._cache_ops")
    assert old.write_planes is cache_ops.write_planes and old.read_plane is cache_ops.read_plane
