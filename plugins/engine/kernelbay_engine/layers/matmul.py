"""`y = x W^T + b` dispatched, per weight shape and batch size, to the faster of two CPU forms.

For the small row counts of decoding, oneDNN/MKL on CPU is sensitive to operand order: with a large
weight (an LM head: [32000, 512]) and 2-16 rows, `(W @ x^T)^T` — the weight as the left, row-major
operand — ran 1.3-2x faster than `F.linear(x, W)` on the reference machine, while for medium weights
the order that wins flips with the thread count (see benchmarks/RESULTS-generate.md). Rather than
guess, the first call for each (weight shape, dtype, row bucket, threads) times both forms and
keeps the faster; results differ only by float rounding. `KERNELBAY_MATMUL_AUTOTUNE=0` pins
`F.linear`.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

# Below this many weight elements a matmul is too cheap for its form to matter.
MIN_TUNED_NUMEL = 1 << 20
MAX_TUNED_ROWS = 64
_TRIALS = 3
_choice: dict[tuple, bool] = {}  # key -> True when the weight-stationary form is faster


def _weight_left(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = torch.matmul(w, x.t()).t()
    return y + bias if bias is not None else y


def _time(fn, *args) -> float:
    best = float("inf")
    for _ in range(_TRIALS):
        start = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - start)
    return best


def _tunable(x: torch.Tensor, w: torch.Tensor) -> bool:
    return (
        x.dim() == 2
        and w.dim() == 2
        and x.device.type == "cpu"
        and x.shape[0] <= MAX_TUNED_ROWS
        and w.numel() >= MIN_TUNED_NUMEL
        and not torch.is_grad_enabled()
        and os.environ.get("KERNELBAY_MATMUL_AUTOTUNE", "1") != "0"
    )


def _weight_left_is_faster(x, w, bias) -> bool:
    rows = 1 << (x.shape[0] - 1).bit_length()  # buckets 1, 2, 4, ... 64
    key = (tuple(w.shape), w.dtype, rows, torch.get_num_threads())
    choice = _choice.get(key)
    if choice is None:
        F.linear(x, w, bias), _weight_left(x, w, bias)  # warm both
        choice = _time(_weight_left, x, w, bias) < _time(F.linear, x, w, bias)
        _choice[key] = choice
    return choice


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, w, bias)`, in the operand order measured fastest for this shape on this CPU."""
    if _tunable(x, w) and _weight_left_is_faster(x, w, bias):
        return _weight_left(x, w, bias)
    return F.linear(x, w, bias)
