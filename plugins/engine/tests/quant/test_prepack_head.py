"""Prepacking of the tied LM head (a packed copy in either form; the embedding keeps the table) and of bf16 weights
(oneDNN's form only)."""

from __future__ import annotations

import pytest
import torch

from kernelbay_engine.layers import prepack
from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.models.quant import UnquantizedLinearMethod
from kernelbay_engine.quant.kernels import BF16_FEATURES, cpu_flags


class _Tied(torch.nn.Module):
    def __init__(self, vocab: int, hidden: int, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden, dtype=dtype)
        self.lm_head = Linear(hidden, vocab)
        self.lm_head.create_weights(UnquantizedLinearMethod(), dtype)
        self.lm_head.weight = self.embed.weight


@pytest.mark.parametrize("form", prepack.FORMS)
def test_the_tied_lm_head_is_packed_and_the_embedding_keeps_its_table(form):
    """policy 'always': lm_head packed (same logits), the embedding's weight still the dense table."""
    if not prepack.form_available(form)[0]:
        pytest.skip(prepack.form_available(form)[1])
    model = _Tied(96, 32)
    table = model.embed.weight.detach().clone()
    report = prepack.prepack_linear_weights(model, policy="always", forms=(form,))
    assert report.packed == ["lm_head"] and report.forms == {"lm_head": form}
    assert torch.equal(model.embed.weight, table)
    x = torch.randn(3, 32)
    with torch.inference_mode():
        torch.testing.assert_close(model.lm_head(x), x @ table.t(), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not cpu_flags() & set(BF16_FEATURES), reason="the CPU has no native bf16 (avx512_bf16 / amx_bf16)")
def test_bf16_weights_are_packed_where_the_cpu_has_bf16():
    """A bf16 layer packs and computes what F.linear computes in bf16 (to bf16 rounding)."""
    layer = Linear(64, 48)
    layer.create_weights(UnquantizedLinearMethod(), torch.bfloat16)
    torch.nn.init.normal_(layer.weight)
    dense = layer.weight.detach().clone()
    model = torch.nn.Module()
    model.proj = layer
    report = prepack.prepack_linear_weights(model, policy="always")
    assert report.forms == {"proj": "onednn"}  # fdot packs float32 only
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x).float(), (x @ dense.t()).float(), rtol=2e-2, atol=5e-2)
