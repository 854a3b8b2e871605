"""The autotuned linear dispatch computes F.linear exactly up to rounding, and caches its choice per shape."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernelbay_engine.layers import matmul


def test_both_forms_match_f_linear_and_the_choice_is_cached(monkeypatch):
    """For a tunable shape the result equals F.linear (float32 rounding, 1e-4); one form is chosen per row bucket."""
    monkeypatch.setattr(matmul, "_choice", {})
    w, b = torch.randn(4096, 256), torch.randn(4096)
    with torch.inference_mode():
        for rows in (1, 3, 8):
            x = torch.randn(rows, 256)
            torch.testing.assert_close(matmul.linear(x, w, b), F.linear(x, w, b), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(matmul._weight_left(x, w, b), F.linear(x, w, b), rtol=1e-4, atol=1e-4)
    assert sorted(key[2] for key in matmul._choice) == [1, 4, 8]


def test_small_weights_training_and_opt_out_are_never_tuned(monkeypatch):
    """Tiny weights, autograd and KERNELBAY_MATMUL_AUTOTUNE=0 all take plain F.linear without timing."""
    monkeypatch.setattr(matmul, "_choice", {})
    x = torch.randn(4, 64)
    with torch.inference_mode():
        matmul.linear(x, torch.randn(128, 64))
    big = torch.randn(4096, 256)
    matmul.linear(torch.randn(4, 256), big)  # grad mode on
    monkeypatch.setenv("KERNELBAY_MATMUL_AUTOTUNE", "0")
    with torch.inference_mode():
        matmul.linear(torch.randn(4, 256), big)
    assert matmul._choice == {}
