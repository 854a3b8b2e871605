"""Continuous batching, block accounting and preemption, on a model-free runner (fast, exact)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelbay_engine.core import EngineCore
from kernelbay_engine.errors import RequestTooLarge
from kernelbay_engine.request import Request
from kernelbay_engine.sampling import SamplingParams
from kernelbay_engine.scheduler import Scheduler, SchedulerConfig

from .fakes import VOCAB, FakeRunner, reference_tokens

MAX_LEN = 512


def make_engine(
    num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64, chunked=True, prefix_caching=True
):
    runner = FakeRunner(num_blocks, block_size)
    config = SchedulerConfig(
        num_blocks, block_size, max_num_seqs, max_num_batched_tokens, chunked, enable_prefix_caching=prefix_caching
    )
    return EngineCore(runner, Scheduler(config), eos_token_ids=(), max_model_len=MAX_LEN), runner


def make_request(rid: int, prompt: list[int], max_tokens: int) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0), MAX_LEN)


def random_prompts(count: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))], rng.randint(1, 24)) for _ in range(count)]


def check_ledger(scheduler: Scheduler) -> None:
    """The one ledger after a step: each running request holds ceil(cached / block_size) blocks, waiting ones
    hold none, a block two requests hold is a full block of a shared prefix (the same place in both tables),
    and the reference counts agree with the tables."""
    blocks = scheduler.blocks
    tables = {r.request_id: blocks.block_table(r.request_id) for r in scheduler.running}
    for r in scheduler.running:
        assert len(tables[r.request_id]) == blocks.blocks_needed(r.num_cached), f"request {r.request_id}"
    where: dict[int, set[int]] = {}
    for r in scheduler.running:
        for index, block in enumerate(tables[r.request_id]):
            where.setdefault(block, set()).add(index)
            if (index + 1) * blocks.block_size > r.num_cached:  # its partial last block: its own
                assert block not in {b for rid, t in tables.items() if rid != r.request_id for b in t}
    assert all(len(places) == 1 for places in where.values()), "a shared block sits at two places"
    assert blocks.num_used_blocks == len(where) and set(blocks.request_ids()) == set(tables)
    assert not any(r.request_id in blocks for r in scheduler.waiting)
    assert blocks.audit() == []


def run_to_end(core: EngineCore, runner: FakeRunner) -> int:
    steps = 0
    while core.has_unfinished:
        core.step()
        steps += 1
        check_ledger(core.scheduler)
    return steps


def run_all_and_check(core: EngineCore, runner: FakeRunner, specs) -> list[Request]:
    """Add a request per (prompt, max_tokens), run to the end, assert each got its solo tokens."""
    requests = [make_request(i, p, n) for i, (p, n) in enumerate(specs)]
    for r in requests:
        core.add(r)
    run_to_end(core, runner)
    for r, (prompt, n) in zip(requests, specs, strict=True):
        assert r.output_token_ids == reference_tokens(prompt, n), f"request {r.request_id}"
    return requests


def test_batched_requests_match_running_alone():
    """Twelve requests through 4 slots (joining as others finish) get the tokens each gets alone."""
    core, runner = make_engine(max_num_seqs=4)
    for r in run_all_and_check(core, runner, random_prompts(12)):
        assert r.finish_reason.value == "length"


def test_request_joins_while_others_decode():
    """A request added mid-generation is prefilled in the same step as the others' decodes."""
    core, runner = make_engine()
    first = make_request(0, [1, 2, 3], 10)
    core.add(first)
    for _ in range(3):
        core.step()
    late = make_request(1, [4, 5, 6, 7], 5)
    core.add(late)
    core.step()
    assert runner.steps[-1] == [(0, 1), (1, 4)], "decode and prefill share the step"
    run_to_end(core, runner)
    assert first.output_token_ids == reference_tokens([1, 2, 3], 10)
    assert late.output_token_ids == reference_tokens([4, 5, 6, 7], 5)


def test_finished_request_frees_its_blocks_at_once():
    """After the last token every block is back in the scheduler's free list and no request holds a table."""
    core, runner = make_engine(num_blocks=16)
    core.add(make_request(0, list(range(9)), 3))
    run_to_end(core, runner)
    assert core.scheduler.blocks.num_free_blocks == 16 and not core.scheduler.blocks.request_ids()


@pytest.mark.parametrize("num_blocks", [8, 11, 16])
def test_preemption_under_tiny_cache_keeps_outputs(num_blocks):
    """With a cache far too small for the batch, requests are preempted and recomputed; tokens unchanged."""
    core, runner = make_engine(num_blocks=num_blocks, block_size=4, max_num_seqs=8)
    specs = [(p, n) for p, n in random_prompts(10, seed=num_blocks) if len(p) + n <= num_blocks * 4]
    run_all_and_check(core, runner, specs)
    assert max(runner.prefills.values()) > 1, "the cache was meant to be too small to avoid preemption"


def test_request_that_can_never_fit_is_refused():
    """prompt + max_tokens beyond the whole cache is a clear error when the request is added."""
    core, _ = make_engine(num_blocks=4, block_size=4)
    with pytest.raises(RequestTooLarge, match="whole cache has 4"):
        core.add(make_request(0, list(range(10)), 10))


def test_request_filling_the_whole_cache_runs():
    """A request needing exactly every block runs to the end (alone)."""
    core, runner = make_engine(num_blocks=4, block_size=4)
    core.add(make_request(0, [3] * 6, 10))
    run_to_end(core, runner)
    assert core.scheduler.blocks.num_free_blocks == 4


def test_context_limit_ends_generation():
    """A request stops with "length" when the sequence reaches max_model_len."""
    runner = FakeRunner(64, 4)
    core = EngineCore(runner, Scheduler(SchedulerConfig(64, 4)), eos_token_ids=(), max_model_len=12)
    request = Request(0, [1] * 10, SamplingParams(max_tokens=50, temperature=0), 12)
    core.add(request)
    run_to_end(core, runner)
    assert len(request.output_token_ids) == 2 and request.finish_reason.value == "length"


def test_eos_stops_unless_ignored():
    """The end-of-sequence token finishes a request ("stop") unless ignore_eos is set."""
    prompt = [5, 6, 7]
    eos = reference_tokens(prompt, 3)[2]
    results = {}
    for ignore in (False, True):
        runner = FakeRunner(64, 4)
        core = EngineCore(runner, Scheduler(SchedulerConfig(64, 4)), eos_token_ids={eos}, max_model_len=MAX_LEN)
        params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=ignore)
        request = Request(0, prompt, params, MAX_LEN)
        core.add(request)
        run_to_end(core, runner)
        results[ignore] = request
    assert len(results[False].output_token_ids) == 3 and results[False].finish_reason.value == "stop"
    assert len(results[True].output_token_ids) == 6


def test_without_chunking_whole_prompts_wait_for_budget_and_a_long_one_runs_alone():
    """enable_chunked_prefill=False: prefills beyond max_num_batched_tokens wait for a later step, and a
    prompt longer than the budget runs whole."""
    core, runner = make_engine(max_num_batched_tokens=10, chunked=False)
    for i in range(3):
        core.add(make_request(i, [i] * 6, 2))
    core.step()
    assert runner.steps[0] == [(0, 6)]
    core.add(make_request(9, [5] * 30, 1))  # shares no block with the others
    run_to_end(core, runner)
    assert (9, 30) in [entry for step in runner.steps for entry in step]


def test_long_prompt_is_prefilled_in_chunks_while_others_decode():
    """A 30-token prompt under a 10-token budget: chunks of 9 beside the running decode, no token sampled
    until its last chunk, and both requests end with their solo tokens."""
    core, runner = make_engine(max_num_batched_tokens=10)
    first = make_request(0, [1, 2, 3], 12)
    core.add(first)
    core.step()
    long = make_request(1, list(range(30)), 4)
    core.add(long)
    sampled = [core.step() for _ in range(4)]
    assert runner.steps[1:5] == [[(0, 1), (1, 9)], [(0, 1), (1, 9)], [(0, 1), (1, 9)], [(0, 1), (1, 3)]]
    assert [[r.request_id for r in step] for step in sampled] == [[0], [0], [0], [0, 1]]
    assert long.num_cached == 30 and len(long.output_token_ids) == 1
    run_to_end(core, runner)
    assert first.output_token_ids == reference_tokens([1, 2, 3], 12)
    assert long.output_token_ids == reference_tokens(list(range(30)), 4)
    assert runner.prefills[1] == 1, "a chunked prompt is fed once, not recomputed"


def test_chunked_prompt_preempted_midway_is_recomputed_from_the_start():
    """A cache too small for two requests: the newer one, preempted in the middle of its chunked
    prefill, starts over later (no prefix cache to resume from) and still gets its solo tokens."""
    core, runner = make_engine(num_blocks=6, block_size=4, max_num_batched_tokens=5, prefix_caching=False)
    old = make_request(0, [7] * 7, 14)  # grows to all 6 blocks
    new = make_request(1, list(range(16)), 2)  # fed 4 tokens a step; preempted at 12 of 16
    core.add(old)
    core.step()
    core.add(new)
    run_to_end(core, runner)
    assert old.output_token_ids == reference_tokens([7] * 7, 14)
    assert new.output_token_ids == reference_tokens(list(range(16)), 2)
    assert runner.prefills[1] > 1, "the cache was meant to force a preemption mid-prefill"


workloads = st.lists(
    st.tuples(
        st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),  # prompt
        st.integers(1, 12),  # max_tokens
        st.integers(0, 6),
    ),  # step at which it arrives
    min_size=1,
    max_size=8,
)


@settings(max_examples=80, deadline=None)
@given(workloads, st.integers(7, 24), st.integers(1, 4), st.integers(4, 32), st.booleans())
def test_any_workload_gets_its_solo_tokens(workload, num_blocks, max_num_seqs, token_budget, chunked):
    """Random arrivals, cache sizes, slots, budgets, with and without chunked prefill: every request ends
    with exactly its solo tokens, the scheduler's one block ledger stays consistent with the requests it
    runs, and a chunked step never exceeds the token budget."""
    core, runner = make_engine(
        num_blocks=num_blocks,
        block_size=4,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=token_budget,
        chunked=chunked,
    )
    requests = [make_request(i, p, n) for i, (p, n, _) in enumerate(workload)]
    arrivals = sorted(range(len(workload)), key=lambda i: workload[i][2])
    step = 0
    while arrivals or core.has_unfinished:
        while arrivals and workload[arrivals[0]][2] <= step:
            core.add(requests[arrivals.pop(0)])
        if core.has_unfinished:
            core.step()
            check_ledger(core.scheduler)
            assert not chunked or sum(n for _, n in runner.steps[-1]) <= token_budget
        step += 1
    for r, (prompt, n, _) in zip(requests, workload, strict=True):
        assert r.output_token_ids == reference_tokens(prompt, n)
