"""`SamplingParams` (what the user asks for) and `Sampler` (logits -> next token ids, batched).

torch is imported inside the functions that sample, so building and validating `SamplingParams`
(the CLI does it before loading anything) stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kernelbay_engine.errors import SamplingParamsError

if TYPE_CHECKING:
    import torch


MIN_TEMPERATURE = 1e-4
"""Below this (but above 0) logits / temperature overflows float32 and sampling would fail: use 0 (greedy)."""
SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes a 64-bit seed


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _stop_strings(stop) -> tuple | None:
    """`stop` as a tuple: one string, an iterable of them, or None (no stop strings); None if it is none of those."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, (bytes, bytearray)) or not hasattr(stop, "__iter__"):
        return None
    return tuple(stop)


MAX_LOGPROBS = 20
"""The most alternatives `logprobs` / `prompt_logprobs` may ask for per position (vLLM's default limit)."""


def _logprobs_problem(name: str, value) -> str | None:
    if value is None or (_is_int(value) and 0 <= value <= MAX_LOGPROBS):
        return None
    return (
        f"{name} must be None or an integer from 0 to {MAX_LOGPROBS} (how many most likely tokens to report "
        f"besides the actual one), got {value!r}"
    )


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each new token and when to stop.

    temperature 0 is greedy (deterministic); otherwise tokens are drawn from the softmax of
    `logits / temperature`, restricted to the `top_k` most likely (0: no limit) and to the smallest
    set whose probability reaches `top_p`. A `seed` makes one request's draws reproducible whatever
    else runs in the batch. Generation stops after `max_tokens`, at the end-of-sequence token
    (unless `ignore_eos`), or when the text contains one of the `stop` strings (cut from the text).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    """Per generated token, the log-probabilities of the `logprobs` most likely tokens and of the one sampled."""
    prompt_logprobs: int | None = None
    """The same for every prompt token after the first (see kernelbay_engine.logprobs)."""

    def __post_init__(self):
        stop = _stop_strings(self.stop)
        if stop is None:
            raise SamplingParamsError(
                f"invalid SamplingParams: stop must be a string, a list of strings or None, got {self.stop!r}"
            )
        object.__setattr__(self, "stop", stop)
        problems = [p for p in self._problems() if p]
        if problems:
            raise SamplingParamsError("invalid SamplingParams: " + "; ".join(problems))

    def _problems(self) -> list[str | None]:
        return [
            None
            if _is_int(self.max_tokens) and self.max_tokens >= 1
            else f"max_tokens must be a positive integer (the number of tokens to generate), got {self.max_tokens!r}",
            None
            if _is_number(self.temperature) and (self.temperature == 0 or self.temperature >= MIN_TEMPERATURE)
            else f"temperature must be a finite number >= 0: 0 (greedy) or at least {MIN_TEMPERATURE}, "
            f"got {self.temperature!r}",
            None
            if _is_number(self.top_p) and 0 < self.top_p <= 1
            else f"top_p must be in (0, 1] (1 disables nucleus sampling), got {self.top_p!r}",
            None
            if _is_int(self.top_k) and self.top_k >= 0
            else f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}",
            None
            if self.seed is None or (_is_int(self.seed) and 0 <= self.seed < SEED_LIMIT)
            else f"seed must be an integer from 0 to 2**64 - 1, or None, got {self.seed!r}",
            None if isinstance(self.ignore_eos, bool) else f"ignore_eos must be True or False, got {self.ignore_eos!r}",
            None
            if all(isinstance(s, str) and s for s in self.stop)
            else f"stop must be non-empty strings, got {self.stop!r}",
            _logprobs_problem("logprobs", self.logprobs),
            _logprobs_problem("prompt_logprobs", self.prompt_logprobs),
        ]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """A private random stream for one request: seeded when asked, else drawn from torch's global RNG."""
    import torch

    if params.greedy:
        return None
    seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, ()).item())
    return torch.Generator().manual_seed(seed)


class Sampler:
    """Picks one token per row of a logits batch; greedy rows share one argmax."""

    def __call__(
        self, logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None]
    ) -> list[int]:
        """logits: [N, vocab]; params, generators: one per row -> N token ids."""
        tokens = logits.argmax(dim=-1).tolist()
        for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
            if not p.greedy:
                tokens[row] = sample_row(logits[row], p, gen)
        return tokens


def sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One draw from `logits` [vocab] under temperature, top-k and top-p (computed on the kept set only);
    `generator` None draws from torch's global RNG."""
    import torch

    logits = logits.float() / params.temperature
    k = params.top_k if 0 < params.top_k < logits.numel() else logits.numel()
    values, ids = torch.topk(logits, k) if k < logits.numel() or params.top_p < 1 else (logits, None)
    probs = torch.softmax(values, dim=-1)
    if params.top_p < 1:
        probs = _nucleus(probs, params.top_p)
    choice = int(torch.multinomial(probs, 1, generator=generator))
    return int(ids[choice]) if ids is not None else choice


def target_probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [N, vocab] -> [N, vocab] float32: the distribution `sample_row` draws each row from (temperature,
    top-k, top-p), dense over the vocabulary (what speculative verification compares proposals against)."""
    import torch

    logits = logits.float() / params.temperature
    vocab = logits.shape[-1]
    k = params.top_k if 0 < params.top_k < vocab else vocab
    values, ids = torch.topk(logits, k, dim=-1)
    probs = torch.softmax(values, dim=-1)
    if params.top_p < 1:
        probs = _nucleus(probs, params.top_p)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(logits).scatter_(-1, ids, probs)


def _nucleus(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the most likely tokens (probs sorted descending) until their mass reaches top_p; at least one."""
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    return sorted_probs.masked_fill(mass_before >= top_p, 0.0)
