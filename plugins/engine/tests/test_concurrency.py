"""One LLM shared by threads, nested and interleaved calls: each call gets its own tokens, none aborts another's."""

from __future__ import annotations

import gc
import threading

import pytest

from kernelbay.errors import InputError
from kernelbay_engine.errors import PromptTooLong, RequestTooLarge
from kernelbay_engine.sampling import SamplingParams

PROMPTS = [
    "the",
    "the quick brown fox",
    "a fortune cookie says you will write many tests",
    "greedy decoding always picks",
    "continuous batching lets new requests join while others decode",
]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def _solo(llm, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    return [llm.generate(p, params)[0].token_ids for p in prompts]


def _in_threads(*calls, timeout=60.0) -> list:
    """Run each call in its own thread, started together; its result, or the exception it raised."""
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def run(i, call):
        barrier.wait()
        try:
            results[i] = call()
        except BaseException as err:  # noqa: BLE001 - returned to the test, which checks it
            results[i] = err

    threads = [threading.Thread(target=run, args=(i, c), daemon=True) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a call hung"
    return results


def _assert_idle(llm) -> None:
    """Nothing queued or running, every KV block free, nothing tracked."""
    scheduler = llm._core.scheduler
    assert not scheduler.waiting and not scheduler.running
    assert scheduler.blocks.num_free_blocks == scheduler.config.num_blocks
    assert not llm._tracked


def _streamed(llm, prompts, params=GREEDY) -> list[list[int]]:
    tokens: dict[int, list[int]] = {}
    for delta in llm.stream(prompts, params):
        tokens.setdefault(delta.index, []).append(delta.token_id)
    return [tokens[i] for i in range(len(prompts))]


@pytest.mark.parametrize("cache", ["default", "preempting"])
def test_threads_on_one_llm_each_get_their_solo_tokens(make_llm, cache):
    """4 threads x 5 prompts (generate and stream) on one LLM, also under preemption: each equals running alone."""
    if cache == "default":
        llm = make_llm()
    else:  # 24 blocks of 4 tokens for up to 20 requests: requests of different calls preempt each other
        llm = make_llm(kv_cache_memory=make_llm().config.kv_bytes_per_token() * 4 * 24, block_size=4)
    solo = _solo(llm)
    generate = lambda: [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]  # noqa: E731
    results = _in_threads(generate, generate, generate, lambda: _streamed(llm, PROMPTS))
    assert results == [solo] * 4
    _assert_idle(llm)


def test_a_suspended_stream_keeps_its_requests_while_other_calls_run(make_llm):
    """generate() while a stream is suspended, and inside its loop: the stream still gets every token."""
    llm = make_llm()
    solo = _solo(llm)
    stream = llm.stream(PROMPTS[1], GREEDY)
    first = next(stream).token_id
    assert llm.generate(PROMPTS[2], GREEDY)[0].token_ids == solo[2]
    rest = []
    for delta in stream:
        rest.append(delta.token_id)
        if len(rest) == 3:
            assert llm.generate(PROMPTS[3], GREEDY)[0].token_ids == solo[3]
    assert [first, *rest] == solo[1]
    _assert_idle(llm)


def test_two_streams_interleaved_token_by_token(make_llm):
    """Two streams advanced in lockstep (zip) each yield their own solo tokens and text."""
    llm = make_llm()
    solo = _solo(llm)
    a, b = llm.stream(PROMPTS[0], GREEDY), llm.stream(PROMPTS[4], GREEDY)
    pairs = list(zip(a, b, strict=True))
    assert [d.token_id for d, _ in pairs] == solo[0]
    assert [d.token_id for _, d in pairs] == solo[4]
    assert "".join(d.text for _, d in pairs) == llm.generate(PROMPTS[4], GREEDY)[0].text
    _assert_idle(llm)


@pytest.mark.parametrize("how", ["close", "garbage-collected"])
def test_a_stream_ended_early_aborts_only_its_own_requests(make_llm, how):
    """Closing or dropping a half-read stream frees its requests at once; another stream keeps running."""
    llm = make_llm()
    solo = _solo(llm)
    doomed, kept = llm.stream(PROMPTS[:2], GREEDY), llm.stream(PROMPTS[3], GREEDY)
    next(doomed)
    got = [next(kept).token_id]
    if how == "close":
        doomed.close()
    else:
        del doomed
        gc.collect()
    assert len(llm._core.scheduler.running) == 1, "only the kept stream's request is left"
    got += [d.token_id for d in kept]
    assert got == solo[3]
    _assert_idle(llm)


def test_a_stream_closed_while_another_thread_steps(make_llm, monkeypatch):
    """A stream closed mid-step of another thread's generate(): dropped when that step ends; the call is exact."""
    llm = make_llm()
    solo = _solo(llm)
    stream = llm.stream(PROMPTS[:3], GREEDY)
    next(stream)
    in_step, closed, real_step = threading.Event(), threading.Event(), llm.runner.step

    def held_step(steps):
        if not in_step.is_set():
            in_step.set()
            closed.wait(10)  # the first step of the worker's call waits until the stream is closed
        return real_step(steps)

    monkeypatch.setattr(llm.runner, "step", held_step)
    results = []
    worker = threading.Thread(target=lambda: results.append([o.token_ids for o in llm.generate(PROMPTS, GREEDY)]))
    worker.start()
    assert in_step.wait(10)
    stream.close()  # returns at once: the step in flight is not waited for
    assert len(llm._pending_aborts) == 1
    closed.set()
    worker.join(30)
    assert results == [solo]
    _assert_idle(llm)


def test_a_bad_call_does_not_disturb_another_calls(make_llm):
    """Bad prompts and oversized requests raise their own clear errors; a suspended stream and threads are exact."""
    llm = make_llm(kv_cache_memory=make_llm().config.kv_bytes_per_token() * 16 * 3)
    small = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompts = [[6] * 4, [7] * 9]
    solo = _solo(llm, prompts, small)
    bad = [
        (lambda: llm.generate([[6] * 4, [10**6]], small), InputError),
        (lambda: llm.generate([[6] * 4, ""], small), InputError),
        (lambda: llm.generate([[6] * 4, [5] * 200], small), PromptTooLong),
        (lambda: llm.generate([[6] * 4, [5] * 20], [small, SamplingParams(max_tokens=60)]), RequestTooLarge),
    ]
    stream = llm.stream(prompts[1], small)
    first = next(stream).token_id
    for call, error in bad:
        with pytest.raises(error):
            call()
    good = lambda: [[o.token_ids for o in llm.generate(prompts, small)] for _ in range(3)]  # noqa: E731
    results = _in_threads(good, *(call for call, _ in bad))
    assert results[0] == [solo] * 3
    assert [type(r) for r in results[1:]] == [error for _, error in bad]
    assert [first, *(d.token_id for d in stream)] == solo[1]
    _assert_idle(llm)


def test_a_failed_step_fails_only_the_call_that_ran_it(make_llm, monkeypatch):
    """The runner raising in generate()'s step fails that call; a suspended stream then finishes exactly."""
    llm = make_llm()
    solo = _solo(llm)
    stream = llm.stream(PROMPTS[1], GREEDY)
    first = next(stream).token_id
    real_step, calls = llm.runner.step, []

    def failing_once(steps):
        calls.append(len(steps))
        if len(calls) == 1:
            raise RuntimeError("device lost")
        return real_step(steps)

    monkeypatch.setattr(llm.runner, "step", failing_once)
    with pytest.raises(RuntimeError, match="device lost"):
        llm.generate(PROMPTS[2], GREEDY)
    assert [first, *(d.token_id for d in stream)] == solo[1]
    _assert_idle(llm)
