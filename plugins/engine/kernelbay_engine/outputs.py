"""What `LLM.generate` returns and what `LLM.stream` yields."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """One finished completion."""

    index: int
    """Position of the prompt in the list passed to generate()."""
    prompt: str | None
    """The prompt text (None when the prompt was given as token ids)."""
    prompt_token_ids: list[int]
    text: str
    """The generated text (special tokens skipped, cut before a stop string)."""
    token_ids: list[int]
    """Every generated token id, including an end-of-sequence token that ended it."""
    finish_reason: str
    """"stop" (end-of-sequence token or stop string, also one completed by the last allowed token) or
    "length" (max_tokens or the model's context reached without a stop)."""
    logprobs: list[dict[int, float]] | None = None
    """With SamplingParams(logprobs=k): per generated token, token id -> log-probability of the k most likely
    and the generated one (kernelbay_engine.logprobs)."""
    prompt_logprobs: list[dict[int, float] | None] | None = None
    """With SamplingParams(prompt_logprobs=k): the same per prompt token; None for the first (nothing predicts it)."""


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """One new token of one request, as soon as it is sampled."""

    index: int
    """Position of the prompt in the list passed to stream()."""
    token_id: int
    text: str
    """Text this token completes ("" while a multi-byte character or a possible stop string is pending)."""
    finish_reason: str | None
    """None while the request runs; "length" or "stop" on its last delta."""
    logprobs: dict[int, float] | None = None
    """With SamplingParams(logprobs=k): this token's entry, as one item of RequestOutput.logprobs."""
    prompt_logprobs: list[dict[int, float] | None] | None = None
    """With SamplingParams(prompt_logprobs=k), on the request's first delta only: RequestOutput.prompt_logprobs."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
