"""The shared router's edge cases, end to end through SparseMoE on each MoE backend against the kit's reference."""

from __future__ import annotations

import pytest
import torch

from kernelbay.errors import ConfigError
from kernelbay.moe import MoEGeometry
from kernelbay.testing.moe import reference_moe
from kernelbay_engine.layers.moe import Router, Routing, SparseMoE
from kernelbay_engine.models.quant import UnquantizedLinearMethod
from kernelbay_torch.moe import TorchGroupedMoEBackend, TorchMoEBackend

HIDDEN, INTER = 16, 12
BACKENDS = (TorchMoEBackend, TorchGroupedMoEBackend)


def _router(routing: Routing, weight=None, bias=None, correction=None) -> Router:
    router = Router(HIDDEN, routing, bias=bias is not None, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=gen) if weight is None else weight)
        if bias is not None:
            router.bias.copy_(bias)
        if correction is not None:
            router.e_score_correction_bias.copy_(correction)
    return router


def _moe(routing: Routing, backend_cls, **router) -> SparseMoE:
    """A SparseMoE with random experts, its router replaced by `_router(routing, **router)`, bound to backend_cls."""
    geometry = MoEGeometry(routing.num_experts, routing.top_k, HIDDEN, INTER)
    moe = SparseMoE(geometry, routing)
    moe.gate = _router(routing, **router)
    gen = torch.Generator().manual_seed(1)
    for layer in (moe.experts.gate_up_proj, moe.experts.down_proj):
        layer.create_weights(UnquantizedLinearMethod(), torch.float32)
        with torch.no_grad():
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) * 0.3)
    backend = backend_cls(geometry)
    moe.bind(backend, backend.prepare_weights(moe.experts.expert_weights()))
    return moe


def _check_against_reference(moe: SparseMoE, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ids, weights = moe.gate(x)
    expected = reference_moe(moe.geometry, x, ids, weights, moe.experts.expert_weights())
    torch.testing.assert_close(moe(x), expected.to(x.dtype), atol=1e-5, rtol=1e-5)
    return ids, weights


@pytest.mark.parametrize("backend_cls", BACKENDS)
def test_ties_pick_distinct_experts_with_equal_weights(backend_cls):
    """A zero router scores every expert alike: k distinct experts each, weights 1/k after renormalising."""
    routing = Routing(6, 3, normalize=True)
    moe = _moe(routing, backend_cls, weight=torch.zeros(6, HIDDEN))
    ids, weights = _check_against_reference(moe, torch.randn(5, HIDDEN))
    assert all(len(set(row)) == 3 for row in ids.tolist())
    torch.testing.assert_close(weights, torch.full((5, 3), 1 / 3))


@pytest.mark.parametrize("backend_cls", BACKENDS)
def test_all_tokens_to_one_expert_and_idle_experts(backend_cls):
    """A router bias sends every token to experts 2 and 5 (top-2): the six others receive no token."""
    bias = torch.full((8,), -50.0)
    bias[[2, 5]] = torch.tensor([60.0, 50.0])
    moe = _moe(Routing(8, 2), backend_cls, weight=torch.zeros(8, HIDDEN), bias=bias)
    ids, _ = _check_against_reference(moe, torch.randn(9, HIDDEN))
    assert set(ids[:, 0].tolist()) == {2} and set(ids.flatten().tolist()) == {2, 5}


@pytest.mark.parametrize("backend_cls", BACKENDS)
def test_one_token(backend_cls):
    moe = _moe(Routing(8, 2, normalize=True, scaling=1.5), backend_cls)
    _, weights = _check_against_reference(moe, torch.randn(1, HIDDEN))
    torch.testing.assert_close(weights.sum(-1), torch.tensor([1.5]))


def test_unnormalised_weights_are_the_softmax_probabilities():
    router = _router(Routing(8, 2))
    x = torch.randn(4, HIDDEN)
    ids, weights = router(x)
    probs = (x @ router.weight.T).softmax(-1)
    torch.testing.assert_close(weights, probs.gather(1, ids))
    assert torch.equal(ids, probs.topk(2, dim=-1).indices)


def test_group_limited_greedy_keeps_to_the_best_groups():
    """4 groups of 2; a token may use the top_groups=1 group holding its best expert only."""
    routing = Routing(8, 2, method="group_limited_greedy", num_groups=4, top_groups=1)
    router = _router(routing)
    x = torch.randn(20, HIDDEN)
    ids, weights = router(x)
    probs = (x @ router.weight.T).softmax(-1)
    best_group = probs.argmax(-1) // 2
    assert torch.equal(ids // 2, best_group[:, None].expand(-1, 2))
    torch.testing.assert_close(weights, probs.gather(1, ids))


def test_noaux_tc_ranks_groups_and_experts_by_biased_score_and_weights_by_unbiased():
    """The correction bias alone decides the group (2) and experts (4, 5); their weights stay the sigmoid scores."""
    routing = Routing(8, 2, scoring="sigmoid", method="noaux_tc", num_groups=4, top_groups=1, normalize=False)
    correction = torch.zeros(8)
    correction[[4, 5]] = 10.0
    router = _router(routing, correction=correction)
    x = torch.randn(6, HIDDEN)
    ids, weights = router(x)
    assert sorted(set(ids.flatten().tolist())) == [4, 5]
    torch.testing.assert_close(weights, (x @ router.weight.T).sigmoid().gather(1, ids))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scoring": "sigmoid", "method": "greedy"}, "scoring_func='sigmoid' with topk_method='greedy'"),
        ({"top_k": 9}, r"num_experts_per_tok must be in 1\.\.8"),
        ({"method": "group_limited_greedy", "num_groups": 3}, "n_group=3 must divide the 8 experts"),
    ],
)
def test_bad_routing_is_a_config_error_naming_the_field(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Routing(**{"num_experts": 8, "top_k": 2, **kwargs})


def test_unbound_layer_says_how_to_bind():
    moe = SparseMoE(MoEGeometry(4, 2, HIDDEN, INTER), Routing(4, 2))
    moe.gate = _router(Routing(4, 2))
    with pytest.raises(RuntimeError, match="bind_moe_backends"):
        moe(torch.randn(2, HIDDEN))
