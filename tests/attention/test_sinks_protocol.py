"""Attention sinks in the protocol: a geometry flag and requirement, the values through AttentionForwardArgs.sinks,
refused by name where a backend does not declare them."""

from __future__ import annotations

import pytest
import torch

from kernelbay.attention import (
    AttentionForwardArgs,
    AttentionGeometry,
    AttentionRequirements,
    BackendNotCapable,
    create_attention,
    select_attention_backend,
)
from kernelbay.testing import SPECS, make_data, reference_output, run_backend


def _decode_layer(backend: str = "VANILLA", sinks: bool = True):
    layer = create_attention(0, 2, 8, 1, backend=backend, sinks=sinks)
    layer.attach_kv_cache(layer.kv_cache_spec("float32", block_size=4).allocate(3))
    md = type(layer).prepare([(1, 0, (1,))], 4)
    q, kv = torch.randn(1, 2, 8), torch.randn(1, 1, 8)
    return layer, md, q, kv


def test_a_sinks_layer_requires_the_sinks_capability():
    """The geometry's flag becomes the requirement; VANILLA and SDPA declare it, FLEX does not."""
    geometry = AttentionGeometry(0, 4, 16, 2, 0.25, sinks=True)
    req = AttentionRequirements.from_geometry(geometry, dtype="float32")
    assert req.sinks and not AttentionRequirements.from_geometry(AttentionGeometry(0, 4, 16, 2, 0.25)).sinks
    assert select_attention_backend(req, requested="SDPA").backend_name == "SDPA"
    with pytest.raises(BackendNotCapable, match="sinks: attention sinks is not supported"):
        select_attention_backend(req, requested="FLEX")


def test_a_backend_without_sinks_refuses_to_build_the_layer():
    """FLEX cannot attend with sinks: building the layer on it is an error naming the capability."""
    with pytest.raises(ValueError, match="attention backend FLEX cannot build layer 0: sinks: attention sinks"):
        create_attention(0, 4, 16, 2, backend="FLEX", sinks=True)


@pytest.mark.parametrize(
    ("sinks", "message"),
    [
        (None, r"has attention sinks: pass AttentionForwardArgs\(sinks=...\).*got None"),
        (torch.zeros(3), r"\[num_heads\] = \[2\] of per-head sink logits, got torch.float32 \(3,\)"),
        (torch.zeros(2, dtype=torch.int64), "got torch.int64"),
    ],
)
def test_a_sinks_layer_needs_one_float_logit_per_head(sinks, message):
    """Missing, mis-shaped or integer sinks are an error, never attention without them."""
    layer, md, q, kv = _decode_layer()
    with pytest.raises(ValueError, match=message):
        layer.forward(q, kv, kv, md, AttentionForwardArgs(sinks=sinks))


def test_sinks_given_to_a_layer_without_them_are_refused():
    layer, md, q, kv = _decode_layer(sinks=False)
    with pytest.raises(ValueError, match="sinks given to a layer built without them"):
        layer.forward(q, kv, kv, md, AttentionForwardArgs(sinks=torch.zeros(2)))


def test_the_sink_takes_its_share_of_the_softmax():
    """One key, value v: without a sink the output is v; with sink logit s it is v * e^x / (e^x + e^s)."""
    for backend in ("VANILLA", "SDPA"):
        layer, md, q, kv = _decode_layer(backend)
        sinks = torch.tensor([0.0, 2.0])
        out = layer.forward(q, kv, kv, md, AttentionForwardArgs(sinks=sinks))
        score = (q[0] * kv[0]).sum(-1) * 8**-0.5  # [heads]
        share = score.exp() / (score.exp() + sinks.exp())
        torch.testing.assert_close(out[0], share.unsqueeze(-1) * kv[0], msg=f"[{backend}]")


@pytest.mark.parametrize("name", ["sinks", "sinks_decode", "sinks_sliding"])
def test_the_kit_specs_exercise_the_sinks(name):
    """Each sinks spec's reference differs from the same step without sinks, and VANILLA and SDPA match it."""
    spec = SPECS[name]
    data = make_data(spec)
    want = reference_output(spec, data)
    plain = spec.but(sinks=False)
    without = reference_output(plain, make_data(plain))
    assert (want - without).abs().max() > 1e-2
    for backend in ("VANILLA", "SDPA"):
        torch.testing.assert_close(run_backend(backend, spec, data=data).double(), want, atol=1e-5, rtol=0)
