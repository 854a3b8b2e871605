"""DeepSeek's MoE layers on the shared MoE slot: parity with transformers on every MoE backend (VANILLA attention:
the only one capable of MLA on CPU)."""

from __future__ import annotations

import pytest
import torch

from kernelbay_engine.layers.moe import SparseMoE, moe_layers
from tests.models._parity import compare_generation, runner
from tests.models._tiny import TINY_DEEPSEEK


@pytest.mark.parametrize("moe_backend", ("TORCH_MOE", "TORCH_GROUPED_MOE"))
@pytest.mark.parametrize("name", sorted(TINY_DEEPSEEK))
def test_deepseek_matches_transformers_on_each_moe_backend(loaded_moe, name, moe_backend):
    """Greedy, group-limited and noaux_tc routing through each kernel: logits within 1e-4, same tokens."""
    hf_model, model = loaded_moe(name, moe_backend)
    assert {layer.backend.name for layer in moe_layers(model)} == {moe_backend}
    compare_generation(hf_model, runner(model, "VANILLA"), f"{name} {moe_backend}")


def test_deepseek_layers_use_the_shared_moe_layer(loaded):
    """first_k_dense_replace=1 keeps layer 0 dense; V3's router is float32 with its correction bias."""
    _, model = loaded("deepseek_v3")
    layers = model.model.layers
    assert [isinstance(layer.mlp, SparseMoE) for layer in layers] == [False, True, True]
    router = layers[1].mlp.gate
    assert router.routing.kind == "noaux_tc" and router.routing.scaling == 2.5 and router.routing.normalize
    assert router.weight.dtype == torch.float32 and router.e_score_correction_bias.shape == (8,)
