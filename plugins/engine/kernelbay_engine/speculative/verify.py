"""Verification of proposed tokens against the target's logits: the accepted prefix plus one target token.

Greedy requests accept a proposal while it equals the target's argmax, then take the argmax: exactly the
tokens plain decoding picks. Sampling requests use rejection sampling for a deterministic proposal (the
proposal distribution is one-hot): a proposed token d is accepted with probability p(d), and on rejection
the token is drawn from the residual p with d removed, renormalised; when every proposal is accepted a last
token is drawn from the target's next distribution. Each emitted token is then distributed exactly as the
target's p (Leviathan et al. 2023, with q = one-hot): P(d) = p(d), and P(x != d) = (1 - p(d)) p(x) / (1 - p(d)).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernelbay_engine.sampling import SamplingParams, target_probabilities


def accept_drafts(
    logits: torch.Tensor, drafts: Sequence[int], params: SamplingParams, generator: torch.Generator | None
) -> list[int]:
    """logits [len(drafts) + 1, vocab]: row j scores the token after the j-th proposal's prefix -> the tokens to
    emit: the accepted proposals and one token from the target (1 to len(drafts) + 1 tokens)."""
    if params.greedy:
        return _accept_greedy(logits.argmax(dim=-1).tolist(), drafts)
    probs = target_probabilities(logits, params)
    emitted: list[int] = []
    for row, draft in enumerate(drafts):
        p = probs[row]
        if float(torch.rand((), generator=generator)) < float(p[draft]):
            emitted.append(int(draft))
            continue
        residual = p.clone()
        residual[draft] = 0.0
        emitted.append(int(torch.multinomial(residual, 1, generator=generator)))
        return emitted
    emitted.append(int(torch.multinomial(probs[len(drafts)], 1, generator=generator)))
    return emitted


def _accept_greedy(targets: list[int], drafts: Sequence[int]) -> list[int]:
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
        accepted += 1
    return [*drafts[:accepted], targets[accepted]]
