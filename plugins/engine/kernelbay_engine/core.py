"""The step loop: schedule, run the model on the packed batch, sample, retire finished requests."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from kernelbay_engine.logprobs import position_logprobs, record_prompt, record_sampled, wants_prompt_logits
from kernelbay_engine.request import FinishReason, Request
from kernelbay_engine.runner import StepRequest
from kernelbay_engine.sampling import Sampler
from kernelbay_engine.scheduler import ScheduledChunk, Scheduler, StepPlan
from kernelbay_engine.speculative import Proposer, SpeculationStats
from kernelbay_engine.speculative.verify import accept_drafts


class EngineCore:
    """Drives a `ModelRunner` (anything with `step(list[StepRequest]) -> logits`).

    The scheduler allocates and frees the cache blocks; each StepRequest carries its block table, so the
    runner keeps no per-request state and is told nothing when a request is preempted or finishes.
    With a `proposer` (speculative decoding), each decoding request's step also verifies the tokens it
    proposes, and may give the request several tokens (kernelbay_engine.speculative).
    """

    def __init__(
        self,
        runner,
        scheduler: Scheduler,
        eos_token_ids: Iterable[int],
        max_model_len: int,
        proposer: Proposer | None = None,
    ):
        self.runner = runner
        self.scheduler = scheduler
        self.sampler = Sampler()
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.proposer = proposer
        self.speculation_stats = SpeculationStats()

    def add(self, request: Request) -> None:
        self.scheduler.add(request)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self) -> list[Request]:
        """One model step; returns the requests that got new tokens (one, or several when proposals were
        accepted; finished ones already retired; a request whose prompt is still being prefilled in chunks
        gets none)."""
        self._propose()
        plan = self.scheduler.schedule()
        for request in plan.preempted:  # recomputed from its tokens later: so is any proposer state
            self._release_proposer_state(request)
        if not plan.chunks:
            raise AssertionError(f"scheduler produced an empty step with work left: {self.scheduler.waiting}")
        emitted = self._run(plan)
        if self.proposer is not None:
            self.proposer.observe(plan.chunks)  # a draft keeps the target's hidden states of the rows it ran
        sampled = []
        for index, chunk in enumerate(plan.chunks):
            if chunk.samples:
                self._advance(chunk, *emitted[index])
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
        self._release_proposer_state(request)

    def stop(self, request: Request, num_output_tokens: int | None = None) -> None:
        """A stop string completed: the request ends with "stop", also when that token reached max_tokens.

        `num_output_tokens`: the stop string ended at that generated token, and tokens accepted after it in the
        same step are dropped (speculative decoding), as if they had never been sampled."""
        if num_output_tokens is not None:
            _cut_output(request, num_output_tokens)
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
        self._release_proposer_state(request)

    def _release_proposer_state(self, request: Request) -> None:
        if self.proposer is not None:
            self.proposer.release(request)

    def _propose(self) -> None:
        """Each decoding request's proposed next tokens, as many as it may still emit in this step."""
        if self.proposer is None:
            return
        running = self.scheduler.running
        limits = [self._proposal_limit(request) for request in running]
        for request, proposal in zip(running, self.proposer.propose_requests(running, limits), strict=True):
            request.spec_token_ids = proposal

    def _proposal_limit(self, request: Request) -> int:
        """How many tokens `request` may be proposed: 0 unless it decodes (one uncached token), else as many as it may
        still emit in a step beyond the target's own."""
        if not (request.num_cached > 0 and request.num_tokens - request.num_cached == 1):
            return 0
        return min(
            request.params.max_tokens - len(request.output_token_ids) - 1,
            self.max_model_len - request.num_tokens - 1,
        )

    def _run(self, plan: StepPlan) -> dict[int, tuple[list[int], torch.Tensor | None]]:
        """Run the step -> for each chunk that completes its request's tokens (by index): the tokens it emits,
        and the logits rows they were drawn from when they came from verifying proposals."""
        steps = [StepRequest(c.request.request_id, tuple(c.token_ids), c.start_pos, c.block_table) for c in plan.chunks]
        logits, every = self._logits(plan, steps)
        emitted: dict[int, tuple[list[int], torch.Tensor | None]] = {}
        rows = [i for i, c in enumerate(plan.chunks) if c.samples and not c.num_draft]
        if rows:
            requests = [plan.chunks[i].request for i in rows]
            row_logits = logits if len(rows) == len(plan.chunks) else logits[rows]
            tokens = self.sampler(row_logits, [r.params for r in requests], [r.generator for r in requests])
            record_sampled(requests, row_logits, tokens)
            emitted.update((i, ([token], None)) for i, token in zip(rows, tokens, strict=True))
        for i, chunk in enumerate(plan.chunks):
            if chunk.num_draft:
                emitted[i] = self._verify(chunk, every[i])
        return emitted

    def _verify(self, chunk: ScheduledChunk, logits: torch.Tensor) -> tuple[list[int], torch.Tensor]:
        """The tokens a chunk of proposals emits (logits [1 + num_draft, vocab]: one row per fed token)."""
        request, drafts = chunk.request, chunk.token_ids[-chunk.num_draft :]
        tokens = accept_drafts(logits, drafts, request.params, request.generator)
        self.speculation_stats.record(len(drafts), len(tokens) - 1)
        return tokens, logits

    def _logits(self, plan: StepPlan, steps: list[StepRequest]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """The step's last-token logits, and every position's for chunks that verify proposals; chunks whose prompt
        tokens need log-probabilities get them recorded."""
        scored = [i for i, c in enumerate(plan.chunks) if wants_prompt_logits(c.request)]
        verified = [i for i, c in enumerate(plan.chunks) if c.num_draft]
        if not scored and not verified:
            return self.runner.step(steps), {}
        logits, every = self.runner.step_with_all_logits(steps, scored + verified)
        for i in scored:
            record_prompt(plan.chunks[i].request, plan.chunks[i].start_pos, every[i])
        return logits, every

    def _advance(self, chunk: ScheduledChunk, tokens: list[int], logits: torch.Tensor | None) -> None:
        """Append the emitted tokens up to the first that finishes the request; the cache keeps the fed tokens that
        were accepted (a verification step's rejected ones are rolled back)."""
        request = chunk.request
        computed = chunk.end_pos - chunk.num_draft + len(tokens) - 1  # the fed tokens that were accepted
        reason = None
        for count, token in enumerate(tokens, 1):
            request.output_token_ids.append(token)
            reason = self._finish_reason(request, token)
            if reason is not None:
                tokens = tokens[:count]
                break
        request.num_cached = min(computed, request.num_tokens)
        if logits is not None and request.params.logprobs is not None:
            assert request.logprobs is not None  # kept whenever its params ask for logprobs
            request.logprobs.extend(position_logprobs(logits[: len(tokens)], request.params.logprobs, tokens))
        if reason is not None:
            self.finish(request, reason)
        elif chunk.num_draft:
            self.scheduler.roll_back(request)

    def _finish_reason(self, request: Request, token: int) -> FinishReason | None:
        if token in self.eos_token_ids and not request.params.ignore_eos:
            return FinishReason.STOP
        if len(request.output_token_ids) >= request.params.max_tokens or request.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None


def _cut_output(request: Request, num_output_tokens: int) -> None:
    """Drop the generated tokens after the first `num_output_tokens` (and their log-probabilities)."""
    del request.output_token_ids[num_output_tokens:]
    if request.logprobs is not None:
        del request.logprobs[num_output_tokens:]
    request.num_cached = min(request.num_cached, request.num_tokens)
