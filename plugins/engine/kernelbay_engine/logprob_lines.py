"""`kernelbay run --logprobs K`: one line per generated token with its log-probability and the K most likely
tokens at that step (what llama.cpp's n_probs and vLLM's logprobs give), written after the text."""

from __future__ import annotations

from collections.abc import Iterable


def logprob_lines(tokenizer, steps: Iterable[tuple[int, dict[int, float]]], k: int) -> list[str]:
    """`steps`: (generated token id, its StreamDelta.logprobs entry: id -> log-probability of the k most likely
    tokens and of the generated one). The generated token first, then the k most likely, best first."""
    lines = ["logprobs: each generated token's" + (f", then the {k} most likely at that step" if k else "")]
    for position, (token, entry) in enumerate(steps):
        line = f"{position:>4}  {_token(tokenizer, token):<20} {entry[token]:9.4f}"
        best = sorted(entry.items(), key=lambda item: -item[1])[:k]
        top = " | ".join(f"{_token(tokenizer, t)} {lp:.4f}" for t, lp in best)
        lines.append(f"{line}   top: {top}" if k else line)
    return lines


def _token(tokenizer, token_id: int) -> str:
    """A token as its text in quotes (repr: spaces and newlines visible), or its id where there is no tokenizer."""
    return repr(tokenizer.decode([token_id])) if tokenizer is not None else f"#{token_id}"
