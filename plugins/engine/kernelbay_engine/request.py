"""One generation request's state as it moves waiting -> running -> finished (and back on preemption)."""

from __future__ import annotations

import enum

import torch

from kernelbay_engine.sampling import SamplingParams, make_generator


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    LENGTH = "length"
    """max_tokens reached, or the model's context is full."""
    STOP = "stop"
    """end-of-sequence token or a stop string."""
    ABORT = "abort"
    """its call ended first (a stream closed early, an error in the call); no output is delivered."""


class Request:
    """Token ids so far and how many of them are in the KV cache; mutated by the scheduler and the engine."""

    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "output_token_ids",
        "params",
        "generator",
        "status",
        "finish_reason",
        "num_cached",
        "max_total_tokens",
        "logprobs",
        "prompt_logprobs",
        "cache_keys",
        "block_hashes",
        "spec_token_ids",
    )

    def __init__(
        self,
        request_id: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        max_model_len: int,
        cache_keys: tuple = (),
    ):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.params = params
        self.generator: torch.Generator | None = make_generator(params)
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.num_cached = 0
        """Leading tokens whose keys/values are in the cache (0 while waiting, also after preemption)."""
        self.max_total_tokens = min(len(self.prompt_token_ids) + params.max_tokens, max_model_len)
        """Prompt plus every token it may generate: the most cache it can ever hold."""
        self.logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        """One entry per generated token (see kernelbay_engine.logprobs), when asked for."""
        self.prompt_logprobs: list[dict[int, float] | None] | None = (
            [None] if params.prompt_logprobs is not None else None
        )
        """One entry per prompt token scored so far (None for the first), when asked for."""
        self.cache_keys = cache_keys
        """What besides its tokens changes this request's keys and values (an adapter, multimodal inputs): part of
        every block hash, so only requests with equal keys share blocks (see kernelbay_engine.prefix_cache)."""
        self.block_hashes: list[bytes] = []
        """Prefix-cache hashes of its leading full blocks, extended as they fill (the scheduler's)."""
        self.spec_token_ids: list[int] = []
        """Proposed tokens the next step verifies after its last token (speculative decoding; empty otherwise)."""

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def uncached_token_ids(self) -> list[int]:
        """The tokens the next step must feed the model (the whole sequence after a preemption)."""
        if self.num_cached == 0:
            return self.all_token_ids()
        tail = self.num_cached - len(self.prompt_token_ids)
        return self.output_token_ids[tail:] if tail >= 0 else self.all_token_ids()[self.num_cached :]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def finish(self, reason: FinishReason) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id}, {self.status.value}, prompt={len(self.prompt_token_ids)}, "
            f"output={len(self.output_token_ids)}, cached={self.num_cached})"
        )
