"""Calls that arrive while a step runs are queued before the next step starts: concurrent requests batch at once
(a server's time to first token does not grow with the number of clients)."""

from __future__ import annotations

import threading
import time

from kernelbay_engine.sampling import SamplingParams

PARAMS = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def test_calls_waiting_to_queue_join_the_next_step(make_llm, monkeypatch):
    """While one call's step runs, five more calls wait to queue; the next step holds all six requests."""
    llm = make_llm()
    core = llm._core
    original_step = core.step
    in_first_step = threading.Event()
    requests_per_step: list[int] = []

    def step():
        if not requests_per_step:
            in_first_step.set()
            deadline = time.monotonic() + 30
            while llm._submitters < 5 and time.monotonic() < deadline:  # the others are waiting to queue
                time.sleep(0.001)
        requests_per_step.append(len(core.scheduler.running) + len(core.scheduler.waiting))
        return original_step()

    monkeypatch.setattr(core, "step", step)
    results: dict[int, list] = {}

    def call(i: int) -> None:
        results[i] = [d.token_id for d in llm.stream(f"the quick brown fox {i}", PARAMS)]

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert in_first_step.wait(30)
    others = [threading.Thread(target=call, args=(i,)) for i in range(1, 6)]
    for thread in others:
        thread.start()
    for thread in [first, *others]:
        thread.join(60)
    assert requests_per_step[:2] == [1, 6]
    assert all(len(tokens) == 4 for tokens in results.values()) and len(results) == 6
