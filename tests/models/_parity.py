"""Run a kernelbay model through `ModelRunner` and transformers side by side, token for token."""

from __future__ import annotations

import pytest
import torch

from kernelbay.attention import BackendNotCapable
from kernelbay_engine.runner import ModelRunner, StepRequest

# FLEX compiles flex_attention for every new step shape (~15 s each on the CI CPUs), so the families' full matrices
# run on VANILLA and SDPA; FLEX gets one short run in plugins/llama/tests/test_parity.py, and plugins/torch/tests
# checks it against VANILLA.
BACKENDS = ("VANILLA", "SDPA")
# Different lengths: longer than the tiny sliding windows (5-7) and than a cache block (4 tokens).
PROMPTS = ([1, 5, 9, 22, 7, 3, 8, 90, 4, 17, 33], [2, 30], [11, 12, 13, 14, 15, 16], [40])
DECODE_STEPS = 8
TOLERANCE = 1e-4


@torch.no_grad()
def reference_logits(hf_model, sequences: list[list[int]]) -> torch.Tensor:
    """transformers' last-token logits of each full sequence, no cache: [len(sequences), vocab]."""
    return torch.stack([hf_model(torch.tensor([seq])).logits[0, -1] for seq in sequences])


def compare_generation(hf_model, runner: ModelRunner, tag: str, prompts=PROMPTS, steps: int = DECODE_STEPS) -> float:
    """Prefill all prompts in one step, then decode greedily; returns the worst logit difference seen.

    Asserts, at every step, logits within TOLERANCE and identical greedy tokens; messages carry `tag`.
    """
    sequences = [list(p) for p in prompts]
    logits = runner.step([StepRequest(i, p, 0) for i, p in enumerate(prompts)])
    worst = 0.0
    for step in range(steps + 1):
        expected = reference_logits(hf_model, sequences)
        diff = (logits - expected).abs().max().item()
        worst = max(worst, diff)
        assert diff <= TOLERANCE, f"[{tag}] step {step}: max |logit diff| {diff:.3g} > {TOLERANCE}"
        tokens = logits.argmax(-1).tolist()
        assert tokens == expected.argmax(-1).tolist(), f"[{tag}] step {step}: greedy tokens differ"
        if step == steps:
            break
        requests = [StepRequest(i, [t], len(sequences[i])) for i, t in enumerate(tokens)]
        for seq, t in zip(sequences, tokens, strict=True):
            seq.append(t)
        logits = runner.step(requests)
    for i in range(len(prompts)):
        runner.free(i)
    return worst


def runner(model, backend: str) -> ModelRunner:
    """A runner of `model` on `backend`; the test is skipped when the backend is not capable of the model."""
    try:
        return ModelRunner(model, num_blocks=64, block_size=4, attention_backend=backend)
    except BackendNotCapable as err:
        pytest.skip(f"{backend} is not capable of this model: {err}")
