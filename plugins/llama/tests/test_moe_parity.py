"""Mixtral, Qwen2-MoE and Qwen3-MoE against transformers on every capable attention backend x MoE backend."""

from __future__ import annotations

import pytest
import safetensors.torch
import torch

from kernelbay_engine import AutoModelForCausalLM
from kernelbay_engine.layers.moe import SparseMoE, bind_moe_backends
from plugins.llama.tests._tiny_moe import TINY_MOE
from tests.models._parity import BACKENDS, compare_generation, runner

MOE_BACKENDS = ("TORCH_MOE", "TORCH_GROUPED_MOE")


@pytest.mark.parametrize("moe_backend", MOE_BACKENDS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(TINY_MOE))
def test_logits_and_greedy_tokens_match_transformers(loaded, name, backend, moe_backend):
    """Mixed-length prefill plus 8 decode steps: logits within 1e-4, same greedy tokens."""
    hf_model, model = loaded(name, TINY_MOE[name])
    assert bind_moe_backends(model, moe_backend).backend_name == moe_backend
    compare_generation(hf_model, runner(model, backend), f"{name} {backend} {moe_backend}")


def test_layers_are_moe_where_the_config_says(loaded):
    """Qwen2-MoE's mlp_only_layers=[1] stays dense; its MoE layers carry the gated shared expert."""
    _, model = loaded("qwen2_moe", TINY_MOE["qwen2_moe"])
    kinds = [isinstance(layer.mlp, SparseMoE) for layer in model.model.layers]
    assert kinds == [True, False, True]
    moe = model.model.layers[0].mlp
    assert moe.shared_expert_gate is not None and moe.shared_expert.down_proj.in_features == 40
    assert (moe.geometry.num_experts, moe.geometry.top_k, moe.gate.routing.normalize) == (6, 2, False)


@pytest.mark.parametrize("name", sorted(TINY_MOE))
def test_transformers_stacked_expert_tensors_load(loaded, tmp_path, name):
    """A checkpoint holding transformers' in-memory names (`mlp.experts.gate_up_proj` [E, 2I, H]) loads the same."""
    hf_model, _ = loaded(name, TINY_MOE[name])
    hf_model.config.save_pretrained(tmp_path)
    state = {k: v.contiguous() for k, v in hf_model.state_dict().items()}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in state)
    safetensors.torch.save_file(state, tmp_path / "model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(tmp_path, progress=False)
    prompts = [[1, 5, 9, 22], [7]]
    compare_generation(hf_model, runner(model, "VANILLA"), f"{name} stacked", prompts=prompts, steps=2)


def test_expert_weights_are_the_loaded_tensors(loaded):
    """The dense kernels prepare nothing: the bound weights are the loaded parameters themselves, held once."""
    _, model = loaded("mixtral", TINY_MOE["mixtral"])
    for moe_backend in MOE_BACKENDS:
        bind_moe_backends(model, moe_backend)
        layer = model.model.layers[0].mlp
        assert layer.prepared.gate_up is layer.experts.gate_up_proj.weight
        assert layer.experts.gate_up_proj.weight.shape == (4, 64, 64)
        assert torch.equal(layer.prepared.down, layer.experts.down_proj.weight)
