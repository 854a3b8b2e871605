"""Automatic prefix caching in the block ledger and the scheduler, on the model-free runner (fast, exact: a block
shared wrongly, or written while shared, changes the fake model's tokens)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelbay_engine.kv_cache import KVCacheExhausted, KVCacheManager
from kernelbay_engine.prefix_cache import extend_hashes, hash_block, root_hash

from .fakes import VOCAB, reference_tokens
from .test_scheduler import check_ledger, make_engine, make_request, run_to_end

ROOT = root_hash("float32")


def chain(tokens: list[int], block_size: int = 4, root: bytes = ROOT, extra: tuple = ()) -> list[bytes]:
    hashes: list[bytes] = []
    extend_hashes(hashes, root, tokens, block_size, extra)
    return hashes


def fed(runner, rid: int) -> list[int]:
    """How many tokens the request fed the model, step by step."""
    return [n for step in runner.steps for r, n in step if r == rid]


# -- the hash chain ------------------------------------------------------------------------------------
def test_a_block_hash_covers_every_earlier_token_and_what_changes_the_kv():
    """Equal blocks after different prefixes, equal tokens in caches of other dtypes, or with other extra keys
    (an adapter, an image) get different hashes; only full blocks are hashed."""
    a, b = chain([1, 2, 3, 4, 5, 6, 7, 8]), chain([9, 2, 3, 4, 5, 6, 7, 8])
    assert len(a) == 2 and a[1] != b[1]
    assert chain([1, 2, 3, 4, 5, 6, 7]) == a[:1]  # the partial second block is not hashed
    assert chain([1, 2, 3, 4], root=root_hash("fp8_e4m3")) != a[:1]
    assert chain([1, 2, 3, 4], extra=("adapter-7",)) != a[:1]
    assert a[0] == hash_block(ROOT, [1, 2, 3, 4])


# -- the ledger ----------------------------------------------------------------------------------------
def cached_request(manager: KVCacheManager, rid, tokens: list[int]) -> list[bytes]:
    """Allocate `tokens` for `rid` and register its full blocks as computed; returns their hashes."""
    manager.allocate(rid, len(tokens))
    hashes = chain(tokens, manager.block_size)
    manager.cache_blocks(rid, hashes)
    return hashes


def test_shared_blocks_are_counted_once_and_released_by_their_last_holder():
    """Two requests share a cached prefix by reference; it stays cached after both let go, and is found again."""
    blocks = KVCacheManager(8, 4, prefix_caching=True)
    hashes = cached_request(blocks, "a", list(range(10)))  # 3 blocks, 2 full
    prefix = blocks.match_prefix(hashes)
    assert prefix == list(blocks.block_table("a")[:2])
    blocks.allocate("b", 11, prefix)
    assert blocks.block_table("b")[:2] == blocks.block_table("a")[:2]
    assert blocks.num_used_blocks == 4 and blocks.audit() == []
    blocks.free("a")
    assert blocks.num_used_blocks == 3
    blocks.free("b")
    assert blocks.num_used_blocks == 0 and blocks.num_free_blocks == 8 and blocks.num_cached_blocks == 2
    assert blocks.match_prefix(hashes) == prefix and blocks.audit() == []


def test_a_free_cached_block_is_evicted_only_when_memory_is_needed_least_recently_used_first():
    """Empty blocks go first; then the cached blocks freed longest ago, a request's last block before its first."""
    blocks = KVCacheManager(6, 4, prefix_caching=True)
    old = cached_request(blocks, "old", list(range(8)))
    new = cached_request(blocks, "new", list(range(50, 58)))
    blocks.free("old")
    blocks.free("new")
    blocks.allocate("x", 8)  # the two empty blocks: nothing evicted
    assert blocks.num_cached_blocks == 4
    blocks.allocate("y", 4)  # one eviction: old's last block
    assert blocks.match_prefix(old) == blocks.match_prefix(old[:1]) and len(blocks.match_prefix(old)) == 1
    assert len(blocks.match_prefix(new)) == 2
    blocks.allocate("z", 8)  # old's first block, then new's last
    assert blocks.match_prefix(old) == [] and len(blocks.match_prefix(new)) == 1
    assert blocks.audit() == []


def test_taking_a_cached_prefix_protects_it_from_eviction_and_fails_whole():
    """A hit held by a request is not evictable; an admission that does not fit changes nothing."""
    blocks = KVCacheManager(4, 4, prefix_caching=True)
    hashes = cached_request(blocks, "a", list(range(8)))
    blocks.free("a")
    prefix = blocks.match_prefix(hashes)
    with pytest.raises(KVCacheExhausted):
        blocks.allocate("big", 24, prefix)  # 2 shared + 4 new > 4
    assert blocks.num_used_blocks == 0 and blocks.num_cached_blocks == 2 and blocks.audit() == []
    blocks.allocate("b", 16, prefix)  # 2 shared + 2 empty: nothing left to evict
    with pytest.raises(KVCacheExhausted):
        blocks.allocate("c", 1)
    assert blocks.num_cached_blocks == 2 and blocks.audit() == []


def test_two_requests_computing_the_same_block_keep_one_cache_entry():
    """The first registration wins; the duplicate stays private to its request and is freed, not cached."""
    blocks = KVCacheManager(8, 4, prefix_caching=True)
    blocks.allocate("a", 8)
    blocks.allocate("b", 8)
    hashes = chain(list(range(8)))
    blocks.cache_blocks("a", hashes)
    blocks.cache_blocks("b", hashes)
    assert blocks.match_prefix(hashes) == list(blocks.block_table("a"))
    blocks.free("b")
    assert blocks.num_cached_blocks == 2 and blocks.num_free_blocks == 6 and blocks.audit() == []


def test_without_prefix_caching_nothing_is_found_or_kept():
    blocks = KVCacheManager(4, 4)
    hashes = cached_request(blocks, "a", list(range(8)))
    assert blocks.match_prefix(hashes) == [] and blocks.num_cached_blocks == 0


def test_a_prefix_must_come_from_the_cache():
    blocks = KVCacheManager(4, 4, prefix_caching=True)
    blocks.allocate("a", 4)
    with pytest.raises(ValueError, match="not all cached blocks"):
        blocks.allocate("b", 8, blocks.block_table("a"))
    with pytest.raises(ValueError, match="cannot register 2 full block"):
        blocks.cache_blocks("a", chain(list(range(8))))


# -- the scheduler -------------------------------------------------------------------------------------
def test_a_shared_prompt_prefix_is_prefilled_once():
    """The second request starts from the first one's cached full blocks and feeds only the rest."""
    core, runner = make_engine(block_size=4)
    system = list(range(10, 20))  # 10 tokens: two full blocks and a partial one
    first, second = make_request(0, [*system, 1, 2], 3), make_request(1, [*system, 3, 4, 5], 3)
    core.add(first)
    run_to_end(core, runner)
    core.add(second)
    run_to_end(core, runner)
    assert fed(runner, 1)[0] == 13 - 8
    assert second.output_token_ids == reference_tokens(second.prompt_token_ids, 3)
    stats = core.scheduler.prefix_cache_stats
    assert (stats.queries, stats.hits) == (12 + 13, 8)
    assert core.scheduler.blocks.num_used_blocks == 0


@pytest.mark.parametrize("length", [8, 9, 12])
def test_the_last_prompt_token_is_always_computed(length):
    """A prompt found whole in the cache still feeds its last token (which samples), so the block that token
    lies in is never a shared one: block-aligned (8, 12) or not (9)."""
    core, runner = make_engine(block_size=4)
    prompt = list(range(30, 30 + length))
    for rid in (0, 1):
        core.add(make_request(rid, prompt, 2))
        run_to_end(core, runner)
    found = (length - 1) // 4 * 4
    assert fed(runner, 1)[0] == length - found
    assert core.scheduler.prefix_cache_stats.hits == found


def test_a_running_request_shares_its_computed_blocks_with_a_newcomer():
    """Blocks are offered as soon as they are computed: a request admitted while the first still decodes shares
    its prompt blocks (held by both), and both get their solo tokens."""
    core, runner = make_engine(block_size=4)
    first = make_request(0, list(range(40, 53)), 8)
    core.add(first)
    core.step()
    core.step()
    second = make_request(1, [*range(40, 53), 7, 7], 4)
    core.add(second)
    core.step()
    shared = set(core.scheduler.blocks.block_table(0)) & set(core.scheduler.blocks.block_table(1))
    assert len(shared) == 3
    check_ledger(core.scheduler)
    run_to_end(core, runner)
    assert first.output_token_ids == reference_tokens(first.prompt_token_ids, 8)
    assert second.output_token_ids == reference_tokens(second.prompt_token_ids, 4)


def test_preempting_a_request_that_shares_blocks_leaves_the_others_unchanged():
    """A tiny cache forces the newest request, which holds blocks shared with an older one, out and back in:
    every request still gets its solo tokens, and the shared blocks stay with the one still running."""
    core, runner = make_engine(num_blocks=9, block_size=4, max_num_batched_tokens=64)
    system = list(range(60, 68))
    requests = [make_request(i, [*system, i], 14) for i in range(3)]
    core.add(requests[0])
    core.step()
    for request in requests[1:]:
        core.add(request)
    preempted = set()
    while core.has_unfinished:
        core.step()
        check_ledger(core.scheduler)
        preempted |= {r.request_id for r in core.scheduler.waiting if fed(runner, r.request_id)}
    assert preempted, "the cache was meant to force a preemption"
    for request in requests:
        assert request.output_token_ids == reference_tokens(request.prompt_token_ids, 14), request
    assert core.scheduler.blocks.num_used_blocks == 0


def test_a_preempted_request_resumes_from_its_own_cached_blocks():
    """Preemption frees a request's blocks into the cache; readmitted before they are evicted, it continues
    from them instead of recomputing its whole sequence."""
    core, runner = make_engine(num_blocks=7, block_size=4, max_num_batched_tokens=5)
    old = make_request(0, [7] * 7, 10)
    new = make_request(1, list(range(16)), 2)
    core.add(old)
    core.step()
    core.add(new)
    run_to_end(core, runner)
    assert old.output_token_ids == reference_tokens([7] * 7, 10)
    assert new.output_token_ids == reference_tokens(list(range(16)), 2)
    stats = core.scheduler.prefix_cache_stats
    assert stats.queries > 7 + 16, "the cache was meant to force a preemption (a second admission)"
    assert runner.prefills[1] == 1 and stats.hits == 12, "it resumes from its three cached blocks"


def test_a_cache_filled_past_capacity_evicts_and_keeps_outputs():
    """Many distinct prefixes through a small cache: old blocks are evicted, repeated prompts still hit when
    their blocks survive, and every output equals the solo one."""
    core, runner = make_engine(num_blocks=12, block_size=4)
    prompts = [[p] * 9 + [q] for p in range(5) for q in range(3)]
    for rid, prompt in enumerate(prompts):
        core.add(make_request(rid, prompt, 3))
        run_to_end(core, runner)
    stats = core.scheduler.prefix_cache_stats
    assert stats.hits == 8 * 2 * 5  # each prefix's second and third prompts reuse its two full blocks
    assert core.scheduler.blocks.num_cached_blocks <= 12
    ids = iter(range(100, 200))
    for prompt in prompts:
        request = make_request(next(ids), prompt, 3)
        core.add(request)
        run_to_end(core, runner)
        assert request.output_token_ids == reference_tokens(prompt, 3)
    assert core.scheduler.blocks.num_used_blocks == 0 and core.scheduler.blocks.audit() == []


PREFIXES = [list(range(1, 1 + n)) for n in (3, 4, 7, 8, 13)]
shared_workloads = st.lists(
    st.tuples(
        st.sampled_from(range(len(PREFIXES))),
        st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=6),  # suffix after the shared prefix
        st.integers(1, 10),  # max_tokens
        st.integers(0, 6),  # step at which it arrives
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(shared_workloads, st.integers(8, 24), st.integers(1, 4), st.integers(4, 32), st.booleans())
def test_any_workload_sharing_prefixes_gets_its_solo_tokens(workload, num_blocks, max_num_seqs, budget, chunked):
    """Random arrivals of prompts sharing prefixes of several lengths (block-aligned and not), under preemption
    and eviction: every request gets its solo tokens, the ledger stays consistent, and no block stays held."""
    core, _ = make_engine(
        num_blocks=num_blocks, block_size=4, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, chunked=chunked
    )
    requests = [make_request(i, PREFIXES[p] + suffix, n) for i, (p, suffix, n, _) in enumerate(workload)]
    arrivals = sorted(range(len(workload)), key=lambda i: workload[i][3])
    step = 0
    while arrivals or core.has_unfinished:
        while arrivals and workload[arrivals[0]][3] <= step:
            core.add(requests[arrivals.pop(0)])
        if core.has_unfinished:
            core.step()
            check_ledger(core.scheduler)
        step += 1
    for request in requests:
        assert request.output_token_ids == reference_tokens(request.prompt_token_ids, request.params.max_tokens)
    assert core.scheduler.blocks.num_used_blocks == 0
