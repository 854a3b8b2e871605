"""The OpenAI request bodies `kernelbay serve` accepts, as strict pydantic models.

Strict: a wrong type is a 400 naming the field, never coerced ("5" is not 5, true is not 1); an unknown field is a
400 too. Fields OpenAI defines that kernelbay does not implement are accepted only at their neutral value
(`UNSUPPORTED`), so a client that sends the default still works and one that relies on them is told."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernelbay_engine.sampling import MAX_LOGPROBS, SEED_LIMIT

MAX_N = 64
"""Most choices (`n`) one request may ask for."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Body):
    include_usage: bool = False
    """A last chunk (empty `choices`) carries the request's token usage."""


class _Sampling(_Body):
    """What completions and chat share: the model, sampling, stopping, streaming."""

    model: str | None = None
    """The served model name (`/v1/models`); None: the one being served."""
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    """OpenAI's range; 0 is greedy. Default 1."""
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    """0 (default) keeps every token (an extension, as in vLLM)."""
    seed: Annotated[int, Field(ge=0, lt=SEED_LIMIT)] | None = None
    """Choice j of n samples with seed + j, so each choice is reproducible on its own."""
    stop: str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=16)] | None = None
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token (an extension, as in vLLM: fixed-length benchmarks)."""
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    """An end-user id for the caller's own logs; not used."""
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]]
    """Text, texts, token ids, or lists of token ids: one choice group per prompt."""
    max_tokens: Annotated[int, Field(ge=0)] | None = 16
    """0 only with `echo` (score the prompt, generate nothing); None: up to the context."""
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: bool = False
    """Prefix each choice with its prompt (and, with `logprobs`, the prompt tokens' log-probabilities)."""
    suffix: str | None = None
    best_of: int | None = None


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    """None: up to the context."""
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    """OpenAI's newer name for max_tokens; give one of the two."""
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    """With `logprobs`: the most likely alternatives listed per token."""
    tools: list | None = None
    tool_choice: str | None = None
    response_format: dict | None = None


UNSUPPORTED: dict[str, tuple] = {
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "response_format": (None, {"type": "text"}),
}
"""Parameters kernelbay does not implement -> the values that ask for nothing (accepted)."""
