"""The MoEBackend contract: conservative declarations, construction refuses what it does not declare, and the
forward boundary checks inputs and outputs."""

from __future__ import annotations

import pytest
import torch

from kernelbay.moe import ExpertWeights, MoEBackend, MoEContractError, MoEGeometry, MoERequirements
from kernelbay.testing.moe import MOE_SPECS, make_moe_data

from . import _fakes

SPEC = MOE_SPECS[1]  # moe_small_batch


def test_a_backend_that_declares_nothing_is_capable_of_nothing():
    """No dtype, activation, routing or platform is granted by default."""
    failures = _fakes.DeclaresNothing.capability_failures(MoERequirements(dtype="float32", platform="cpu"))
    fields = [line.split(":")[0] for line in failures]
    assert fields == ["activation", "routing", "dtype", "platform"], failures


def test_declarations_with_unknown_names_are_refused_at_class_creation():
    """A misspelt activation in a declaration is a TypeError naming the attribute, not a silent miss."""
    with pytest.raises(TypeError, match=r"activations: unknown name.*swish"):
        type("Bad", (MoEBackend,), {"activations": frozenset({"swish"})})
    with pytest.raises(TypeError, match="dtypes must be a set of values or ANY"):
        type("Bad", (MoEBackend,), {"dtypes": "float32"})


def test_construction_refuses_a_geometry_it_does_not_declare():
    """A bias-less kernel cannot be built for biased experts: ValueError naming the capability."""
    cls = type("NoBias", (_fakes.TorchMoEBackend,), {"name": "NO_BIAS", "bias": False})
    with pytest.raises(ValueError, match="cannot build these MoE layers: bias: an expert bias is not supported"):
        cls(MoEGeometry(8, 2, 32, 24, gate_up_bias=True, down_bias=True))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"top_k": 9}, "top_k 9 exceeds num_experts 8"),
        ({"activation": "relu"}, "unknown MoE activation 'relu'"),
        ({"activation": "swigluoai"}, "swigluoai activation needs alpha and limit"),
        ({"expert_format": "fp8_block"}, "block_size is given exactly when"),
        ({"hidden_size": 0}, "hidden_size must be a positive int"),
    ],
)
def test_invalid_geometry_is_refused_with_the_reason(changes, message):
    fields = {"num_experts": 8, "top_k": 2, "hidden_size": 32, "intermediate_size": 24, **changes}
    with pytest.raises(ValueError, match=message):
        MoEGeometry(**fields)


def test_a_wrong_output_is_the_backends_contract_error():
    """An `_experts` that returns the wrong shape is named as the backend's fault."""
    x, ids, weights, experts = make_moe_data(SPEC)
    backend = _fakes.WrongShape(SPEC.geometry())
    with pytest.raises(MoEContractError, match=r"FAKE_WRONG_SHAPE .* broke the forward contract.*\[7, 32\]"):
        backend.forward(x, ids, weights, experts)


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda x, i, w: (x[:, :5], i, w), r"hidden_states must be \[T, 32\]"),
        (lambda x, i, w: (x, i + 8, w), r"topk_ids must lie in 0..7"),
        (lambda x, i, w: (x, i.float(), w), r"topk_ids must be an integer \[T, 2\] tensor"),
        (lambda x, i, w: (x, i, w[:, :1]), r"topk_weights must be a float \[T, 2\] tensor"),
    ],
)
def test_bad_inputs_are_refused_before_the_kernel_runs(mangle, message):
    x, ids, weights, experts = make_moe_data(SPEC)
    backend = _fakes.TorchMoEBackend(SPEC.geometry())
    with pytest.raises(ValueError, match=message):
        backend.forward(*mangle(x, ids, weights), experts)


def test_an_expert_receiving_no_token_contributes_nothing():
    """Zeroing the weights of every expert no token chose leaves the output unchanged."""
    spec = next(s for s in MOE_SPECS if s.name == "moe_idle_experts")
    x, ids, weights, experts = make_moe_data(spec)
    backend = _fakes.TorchMoEBackend(spec.geometry())
    idle = sorted(set(range(spec.num_experts)) - set(ids.flatten().tolist()))
    assert idle, "the spec must leave experts idle"
    gate_up, down = experts.gate_up.clone(), experts.down.clone()
    gate_up[idle], down[idle] = torch.nan, torch.nan
    same = backend.forward(x, ids, weights, ExpertWeights(gate_up, down))
    assert torch.equal(same, backend.forward(x, ids, weights, experts))
