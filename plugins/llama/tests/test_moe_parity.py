"""Mixtral, Qwen2-MoE and Qwen3-MoE against transformers on every capable attention backend x MoE backend."""

from __future__ import annotations

import pytest
import safetensors.torch

from kernelbay.errors import ConfigError
from kernelbay_engine import AutoModelForCausalLM
from kernelbay_engine.layers.moe import SparseMoE, bind_moe_backends, moe_layers
from plugins.llama.tests._tiny_moe import TINY_MOE
from tests.models._parity import BACKENDS, compare_generation, runner

MOE_BACKENDS = ("TORCH_MOE", "TORCH_GROUPED_MOE")


@pytest.mark.parametrize("moe_backend", MOE_BACKENDS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(TINY_MOE))
def test_logits_and_greedy_tokens_match_transformers(loaded_moe, name, backend, moe_backend):
    """Mixed-length prefill plus 8 decode steps: logits within 1e-4, same greedy tokens."""
    hf_model, model = loaded_moe(name, moe_backend, TINY_MOE[name])
    assert model.moe_selection.backend_name == moe_backend
    assert {layer.backend.name for layer in moe_layers(model)} == {moe_backend}
    compare_generation(hf_model, runner(model, backend), f"{name} {backend} {moe_backend}")


def test_layers_are_moe_where_the_config_says(loaded):
    """Qwen2-MoE's mlp_only_layers=[1] stays dense; its MoE layers carry the gated shared expert."""
    _, model = loaded("qwen2_moe", TINY_MOE["qwen2_moe"])
    kinds = [isinstance(layer.mlp, SparseMoE) for layer in model.model.layers]
    assert kinds == [True, False, True]
    moe = model.model.layers[0].mlp
    assert moe.shared_expert_gate is not None and moe.shared_expert.down_proj.in_features == 40
    assert (moe.geometry.num_experts, moe.geometry.top_k, moe.gate.routing.normalize) == (6, 2, False)
    _, stepped = loaded("qwen2_moe_sparse_step", TINY_MOE["qwen2_moe_sparse_step"])
    assert [isinstance(layer.mlp, SparseMoE) for layer in stepped.model.layers] == [False, True, False, True]


@pytest.mark.parametrize("name", sorted(TINY_MOE))
def test_transformers_stacked_expert_tensors_load(loaded, tmp_path, name):
    """A checkpoint holding transformers' in-memory names (`mlp.experts.gate_up_proj` [E, 2I, H]) loads the same."""
    hf_model, _ = loaded(name, TINY_MOE[name])
    hf_model.config.save_pretrained(tmp_path)
    state = {k: v.contiguous() for k, v in hf_model.state_dict().items()}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in state)
    safetensors.torch.save_file(state, tmp_path / "model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(tmp_path, progress=False, moe_backend="TORCH_MOE")
    prompts = [[1, 5, 9, 22], [7]]
    compare_generation(hf_model, runner(model, "VANILLA"), f"{name} stacked", prompts=prompts, steps=2)


def test_expert_weights_are_held_once(loaded_moe):
    """TORCH_MOE computes with the loaded parameters themselves, so it can be swapped for another kernel;
    TORCH_GROUPED_MOE repacks them for oneDNN and the loaded copy is released, so swapping it needs a new load."""
    _, model = loaded_moe("mixtral", "TORCH_MOE", TINY_MOE["mixtral"])
    layer = model.model.layers[0].mlp
    assert layer.prepared.gate_up is layer.experts.gate_up_proj.weight
    assert layer.experts.gate_up_proj.weight.shape == (4, 64, 64)
    assert layer.prepared.down is layer.experts.down_proj.weight
    _, grouped = loaded_moe("mixtral", "TORCH_GROUPED_MOE", TINY_MOE["mixtral"])
    experts = grouped.model.layers[0].mlp.experts
    assert not hasattr(experts.gate_up_proj, "weight") and experts.released_by == "TORCH_GROUPED_MOE"
    assert len(grouped.model.layers[0].mlp.prepared.packed_gate_up) == 4
    with pytest.raises(ConfigError, match=r"repacked by the MoE backend TORCH_GROUPED_MOE .* load the model again"):
        bind_moe_backends(grouped, "TORCH_MOE")
