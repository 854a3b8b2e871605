"""TORCH_GROUPED_MOE against the MoE kit, and its two paths (oneDNN-packed float32, F.linear otherwise) agreeing."""

from __future__ import annotations

import torch

from kernelbay.moe import ExpertWeights, MoEGeometry
from kernelbay.testing.moe import MOE_SPECS, check_moe_backend, reference_moe
from kernelbay_torch.moe import PackedExpertWeights, TorchGroupedMoEBackend, onednn_packing_available


def test_grouped_kernel_passes_every_kit_spec():
    report = check_moe_backend("TORCH_GROUPED_MOE")
    assert report.passed and report.counts()["pass"] == len(MOE_SPECS), report.render()


def _weights(geometry: MoEGeometry, dtype) -> ExpertWeights:
    gen = torch.Generator().manual_seed(0)
    e, h, i = geometry.num_experts, geometry.hidden_size, geometry.intermediate_size
    return ExpertWeights(
        (torch.randn(e, 2 * i, h, generator=gen) * 0.2).to(dtype),
        (torch.randn(e, h, i, generator=gen) * 0.2).to(dtype),
        torch.randn(e, 2 * i, generator=gen).to(dtype),
        torch.randn(e, h, generator=gen).to(dtype),
    )


def test_float32_weights_are_packed_per_expert_and_match_the_reference():
    geometry = MoEGeometry(6, 2, 32, 16, gate_up_bias=True, down_bias=True)
    backend, weights = TorchGroupedMoEBackend(geometry), _weights(geometry, torch.float32)
    prepared = backend.prepare_weights(weights)
    assert isinstance(prepared, PackedExpertWeights) == onednn_packing_available()
    if isinstance(prepared, PackedExpertWeights):
        assert len(prepared.packed_gate_up) == 6 and prepared.gate_up.is_meta and prepared.gate_up.shape == (6, 32, 32)
    x = torch.randn(11, 32)
    ids = torch.tensor([[e % 6, (e + 3) % 6] for e in range(11)])
    topk = torch.rand(11, 2)
    expected = reference_moe(geometry, x, ids, topk, weights).to(torch.float32)
    torch.testing.assert_close(backend.forward(x, ids, topk, prepared), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(backend.forward(x, ids, topk, weights), expected, atol=1e-5, rtol=1e-5)


def test_bfloat16_weights_stay_as_loaded():
    geometry = MoEGeometry(4, 2, 32, 16)
    weights = _weights(geometry, torch.bfloat16)
    prepared = TorchGroupedMoEBackend(geometry).prepare_weights(weights)
    assert prepared is weights
