"""The asyncio side of the one thread-safe `LLM`: each request streams in a worker thread, its deltas handed to
the event loop, and a request whose client is gone is aborted (its KV blocks freed) by that thread.

There is no second scheduler: `LLM.stream` batches every caller's requests in its one engine loop (whichever
caller finds no step running runs the next step for all of them). The worker thread drives its own stream; a
cancelled consumer sets a flag the thread reads at its next delta, then closes its stream, which aborts only its
requests."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence

from kernelbay_engine.outputs import StreamDelta
from kernelbay_engine.sampling import SamplingParams
from kernelbay_engine.serve.errors import APIError

_END = object()
"""Put on a request's queue after its last delta."""


class EngineStream:
    """One request's deltas, read on the event loop (`async for`); `close()` (from the loop, any time) makes its
    worker abort the unfinished sequences at their next delta."""

    def __init__(self):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.closed = threading.Event()

    def __aiter__(self) -> EngineStream:
        return self

    async def __anext__(self) -> StreamDelta:
        item = await self.queue.get()
        if item is _END:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self.closed.set()


class AsyncEngine:
    """Admission control and the thread bridge in front of one `LLM`.

    capacity: the most sequences (prompts x n) admitted at once: the engine's batch plus the queue behind it;
    past it a request is refused with 503 and Retry-After."""

    def __init__(self, llm, capacity: int):
        self.llm = llm
        self.capacity = capacity
        self.in_flight = 0
        """Sequences admitted and not yet done (changed on the event loop only)."""
        self._workers: set[threading.Thread] = set()
        self._workers_lock = threading.Lock()
        self._accepting = True

    def admit(self, sequences: int) -> Callable[[], None]:
        """Hold `sequences` places while the request runs and return what gives them back (once); none free
        (or shutting down): 503."""
        if not self._accepting:
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
        if self.in_flight + sequences > self.capacity:
            raise APIError(
                503,
                f"the server is at capacity ({self.in_flight} of {self.capacity} sequences queued or running); "
                "retry shortly",
                type="server_error",
                code="queue_full",
                headers={"Retry-After": "1"},
            )
        self.in_flight += sequences
        held = [sequences]

        def release() -> None:
            self.in_flight -= held.pop() if held else 0

        return release

    def stream(self, prompts: Sequence[list[int]], params: Sequence[SamplingParams]) -> EngineStream:
        """`LLM.stream(prompts, params)`'s deltas as they are sampled, from a worker thread."""
        loop = asyncio.get_running_loop()
        stream = EngineStream()
        worker = threading.Thread(target=self._pump, args=(list(prompts), list(params), loop, stream), daemon=True)
        with self._workers_lock:
            self._workers.add(worker)
        worker.start()
        return stream

    def _pump(self, prompts, params, loop: asyncio.AbstractEventLoop, out: EngineStream) -> None:
        """Worker thread: drive one stream, hand each delta to the loop, stop at the next delta once closed."""

        def deliver(item) -> None:
            try:
                loop.call_soon_threadsafe(out.queue.put_nowait, item)
            except RuntimeError:  # the event loop is closed: nobody will read this request
                out.close()

        stream = self.llm.stream(prompts, params)
        try:
            for delta in stream:
                if out.closed.is_set():
                    return
                deliver(delta)
            deliver(_END)
        except Exception as err:  # noqa: BLE001 - the request's own error (a refused prompt, a failed step)
            deliver(err)
        finally:
            stream.close()  # aborts this call's unfinished requests only and frees their blocks
            with self._workers_lock:
                self._workers.discard(threading.current_thread())

    def stop_accepting(self) -> None:
        self._accepting = False

    def join_workers(self, timeout: float) -> None:
        """Wait up to `timeout` seconds in all for the worker threads (each ends at its stream's next delta once its
        consumer is gone)."""
        deadline = time.monotonic() + timeout
        with self._workers_lock:
            workers = list(self._workers)
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
