"""Log-probabilities of sampled and prompt tokens (`SamplingParams(logprobs=k, prompt_logprobs=k)`).

vLLM's shape: one dict per position, token id -> log-probability, holding the `k` most likely tokens
plus the token actually there (so it has k or k + 1 entries). Values are the model's distribution,
`log_softmax(logits)` in float32, before temperature, top-k or top-p: what perplexity and lm-eval's
loglikelihood need. `prompt_logprobs` starts with None: nothing predicts the first prompt token.
"""

from __future__ import annotations

import torch

from kernelbay_engine.request import Request

PositionLogprobs = dict[int, float]


def position_logprobs(logits: torch.Tensor, k: int, chosen: list[int]) -> list[PositionLogprobs]:
    """logits [N, vocab]; chosen: the token at each row's next position -> N dicts (top-k plus chosen)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    k = min(k, logprobs.shape[-1])
    top_values, top_ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], logprobs[:, :0].long())
    picked = logprobs.gather(-1, torch.tensor(chosen, device=logprobs.device).unsqueeze(-1)).squeeze(-1)
    rows = []
    for ids, values, token, value in zip(top_ids.tolist(), top_values.tolist(), chosen, picked.tolist(), strict=True):
        entry = dict(zip(ids, values, strict=True))
        entry[token] = value
        rows.append(entry)
    return rows


def record_sampled(requests: list[Request], logits: torch.Tensor, tokens: list[int]) -> None:
    """Append each requesting row's entry for the token just sampled (logits [len(requests), vocab])."""
    for i, request in enumerate(requests):
        k, recorded = request.params.logprobs, request.logprobs
        if k is not None:
            assert recorded is not None  # a Request keeps a list whenever its params ask for logprobs
            (entry,) = position_logprobs(logits[i : i + 1], k, [tokens[i]])
            recorded.append(entry)


def wants_prompt_logits(request: Request) -> bool:
    """The request asked for prompt logprobs and some prompt token still lacks its entry."""
    scored = request.prompt_logprobs
    return scored is not None and len(scored) < len(request.prompt_token_ids)


def record_prompt(request: Request, start_pos: int, logits: torch.Tensor) -> None:
    """Entries for the prompt tokens that the chunk's rows predict (logits [chunk tokens, vocab]).

    The row at position p predicts the token at p + 1; rows already recorded (a chunk fed again after a
    preemption) and the row predicting the first generated token are skipped."""
    prompt, scored, k = request.prompt_token_ids, request.prompt_logprobs, request.params.prompt_logprobs
    assert scored is not None and k is not None  # called only where wants_prompt_logits(request)
    first = len(scored) - 1 - start_pos  # row predicting the first prompt token not yet scored
    last = min(len(prompt) - 1 - start_pos, logits.shape[0])  # rows past the prompt predict generated tokens
    if first >= last:
        return
    chosen = prompt[start_pos + first + 1 : start_pos + last + 1]
    scored.extend(position_logprobs(logits[first:last], k, chosen))
