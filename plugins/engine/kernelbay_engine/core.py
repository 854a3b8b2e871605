"""The step loop: schedule, run the model on the packed batch, sample, retire finished requests."""

from __future__ import annotations

from collections.abc import Iterable

from kernelbay_engine.logprobs import record_prompt, record_sampled, wants_prompt_logits
from kernelbay_engine.request import FinishReason, Request
from kernelbay_engine.runner import StepRequest
from kernelbay_engine.sampling import Sampler
from kernelbay_engine.scheduler import Scheduler, StepPlan


class EngineCore:
    """Drives a `ModelRunner` (anything with `step(list[StepRequest]) -> logits`).

    The scheduler allocates and frees the cache blocks; each StepRequest carries its block table, so the
    runner keeps no per-request state and is told nothing when a request is preempted or finishes.
    """

    def __init__(self, runner, scheduler: Scheduler, eos_token_ids: Iterable[int], max_model_len: int):
        self.runner = runner
        self.scheduler = scheduler
        self.sampler = Sampler()
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len

    def add(self, request: Request) -> None:
        self.scheduler.add(request)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self) -> list[Request]:
        """One model step; returns the requests that got a new token (finished ones already retired;
        a request whose prompt is still being prefilled in chunks gets none)."""
        plan = self.scheduler.schedule()
        if not plan.chunks:
            raise AssertionError(f"scheduler produced an empty step with work left: {self.scheduler.waiting}")
        tokens = iter(self._run(plan))
        sampled = []
        for chunk in plan.chunks:
            if chunk.samples:
                self._advance(chunk.request, chunk.end_pos, next(tokens))
                sampled.append(chunk.request)
            else:  # a prefill chunk: the rest of the prompt follows in later steps
                chunk.request.num_cached = chunk.end_pos
        return sampled

    def finish(self, request: Request, reason: FinishReason) -> None:
        """Retire a running request now (stop string, or a finish decided in `_advance`)."""
        if request.is_finished:
            return
        request.finish(reason)
        self.scheduler.finish(request)

    def stop(self, request: Request) -> None:
        """A stop string completed: the request ends with "stop", also when that token reached max_tokens."""
        if request.is_finished:
            request.finish_reason = FinishReason.STOP
        else:
            self.finish(request, FinishReason.STOP)

    def abort(self, request: Request) -> None:
        """Drop one unfinished request (its call ended); its blocks are freed, no other request is touched."""
        if request.is_finished:
            return
        self.scheduler.abort(request)
        request.finish(FinishReason.ABORT)

    def _run(self, plan: StepPlan) -> list[int]:
        """Run the step; sample one token for each chunk that completes its request's tokens."""
        steps = [StepRequest(c.request.request_id, tuple(c.token_ids), c.start_pos, c.block_table) for c in plan.chunks]
        logits = self._logits(plan, steps)
        rows = [i for i, c in enumerate(plan.chunks) if c.samples]
        if not rows:
            return []
        requests = [plan.chunks[i].request for i in rows]
        if len(rows) < len(plan.chunks):
            logits = logits[rows]
        tokens = self.sampler(logits, [r.params for r in requests], [r.generator for r in requests])
        record_sampled(requests, logits, tokens)
        return tokens

    def _logits(self, plan: StepPlan, steps: list[StepRequest]):
        """The step's last-token logits; chunks whose prompt tokens need log-probabilities get them recorded."""
        scored = [i for i, c in enumerate(plan.chunks) if wants_prompt_logits(c.request)]
        if not scored:
            return self.runner.step(steps)
        logits, every = self.runner.step_with_all_logits(steps, scored)
        for i, chunk_logits in every.items():
            record_prompt(plan.chunks[i].request, plan.chunks[i].start_pos, chunk_logits)
        return logits

    def _advance(self, request: Request, num_cached: int, token: int) -> None:
        request.num_cached = num_cached
        request.output_token_ids.append(token)
        reason = self._finish_reason(request, token)
        if reason is not None:
            self.finish(request, reason)

    def _finish_reason(self, request: Request, token: int) -> FinishReason | None:
        if token in self.eos_token_ids and not request.params.ignore_eos:
            return FinishReason.STOP
        if len(request.output_token_ids) >= request.params.max_tokens or request.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None
