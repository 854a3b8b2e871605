"""GPT-OSS against transformers (sinks, alternating windows, YaRN, biased router and experts, clamped SwiGLU) on every
capable attention x MoE backend; its MXFP4 experts; and what `kernelbay explain` reads from the real configs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

from kernelbay.attention import BackendNotCapable, LayerKind
from kernelbay.moe import dequantize_mxfp4
from kernelbay_engine import LLM, AutoModelForCausalLM, SamplingParams
from kernelbay_engine.config import ModelConfig
from kernelbay_engine.explain import explain_model
from kernelbay_engine.layers.moe import bind_moe_backends, moe_layers
from kernelbay_engine.loading import load_weights, open_checkpoint
from kernelbay_engine.runner import ModelRunner
from plugins.llama.tests._tiny_gpt_oss import TINY_GPT_OSS, quantize_mxfp4
from tests.models._parity import BACKENDS, compare_generation, runner

FULL, SLIDING = LayerKind.FULL, LayerKind.SLIDING

MOE_BACKENDS = ("TORCH_MOE", "TORCH_GROUPED_MOE")
CONFIGS = Path(__file__).resolve().parents[3] / "tests" / "data" / "configs"
TINY = TINY_GPT_OSS["gpt_oss"]
EXPERT_TENSORS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


@pytest.fixture(scope="module")
def gpt_oss(tiny_checkpoints):
    """moe_backend -> (transformers model, kernelbay model loaded with that MoE kernel), each loaded once."""
    cache = {}

    def get(moe_backend: str):
        if moe_backend not in cache:
            folder, hf_model = tiny_checkpoints.get("gpt_oss", TINY)
            model = AutoModelForCausalLM.from_pretrained(folder, progress=False, moe_backend=moe_backend)
            cache[moe_backend] = (hf_model, model)
        return cache[moe_backend]

    return get


@pytest.mark.parametrize("moe_backend", MOE_BACKENDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_and_greedy_tokens_match_transformers(gpt_oss, backend, moe_backend):
    """Mixed-length prefill past the window plus 8 decode steps: logits within 1e-4, same greedy tokens."""
    hf_model, model = gpt_oss(moe_backend)
    assert {layer.backend.name for layer in moe_layers(model)} == {moe_backend}
    compare_generation(hf_model, runner(model, backend), f"gpt_oss {backend} {moe_backend}")


def test_the_model_has_the_structure_of_gpt_oss(gpt_oss):
    """Sinks and biases on every attention layer, windows alternating, YaRN, every FFN a biased-router MoE."""
    _, model = gpt_oss("TORCH_MOE")
    config = model.config
    assert config.layer_types == (SLIDING, FULL, SLIDING, FULL) and config.attention_sinks
    assert (config.rope.rope_type, config.moe.activation, config.moe.bias) == ("yarn", "swigluoai", True)
    for layer in model.model.layers:
        attn = layer.self_attn
        assert attn.attn.geometry.sinks and attn.sinks.shape == (4,) and attn.o_proj.has_bias
        assert layer.mlp.gate.bias is not None and layer.mlp.experts.gate_up_proj.shape == (4, 64, 64)


def test_a_backend_without_sinks_is_refused_with_the_capability_named(gpt_oss):
    """FLEX does not declare sinks: asking for it is an error naming them, never attention without them."""
    _, model = gpt_oss("TORCH_MOE")
    with pytest.raises(
        BackendNotCapable, match=r"(?s)FLEX cannot run layers.*- sinks: attention sinks is not supported"
    ):
        ModelRunner(model, num_blocks=16, block_size=4, attention_backend="FLEX")


def test_experts_are_rearranged_into_expert_weights_layout_once(gpt_oss):
    """Loaded as the checkpoint stores them (gate/up interleaved, [E, H, 2I]); bound as [E, 2I, H], gate rows first,
    held once: TORCH_MOE computes on the rearranged tensors themselves, and binding again reuses them."""
    hf_model, model = gpt_oss("TORCH_MOE")
    layer = model.model.layers[0].mlp
    stored = hf_model.model.layers[0].mlp.experts.gate_up_proj  # [E, H, 2I], interleaved
    assert torch.equal(layer.experts.gate_up_proj[:, :32], stored[..., ::2].transpose(1, 2))
    assert torch.equal(layer.experts.gate_up_proj[:, 32:], stored[..., 1::2].transpose(1, 2))
    assert torch.equal(layer.experts.down_proj, hf_model.model.layers[0].mlp.experts.down_proj.transpose(1, 2))
    bind_moe_backends(model, "TORCH_MOE")
    assert layer.prepared.gate_up is layer.experts.gate_up_proj and layer.prepared.down is layer.experts.down_proj


def _mxfp4_folder(folder: Path, hf_model) -> torch.nn.Module:
    """Write the tiny model with its experts MXFP4 (`*_blocks` / `*_scales`, rows = output features, as GPT-OSS
    ships them); returns transformers' model on the dequantized expert weights."""
    reference = copy.deepcopy(hf_model)
    state = {k: v.contiguous() for k, v in hf_model.state_dict().items()}
    params = dict(reference.named_parameters())
    for name in [n for n in state if n.endswith(EXPERT_TENSORS)]:
        blocks, scales = quantize_mxfp4(state.pop(name).transpose(1, 2))
        state[f"{name}_blocks"], state[f"{name}_scales"] = blocks.contiguous(), scales.contiguous()
        with torch.no_grad():
            params[name].copy_(dequantize_mxfp4(blocks, scales).transpose(1, 2))
    hf_model.config.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "lm_head"],
    }
    (folder / "config.json").write_text(json.dumps(config))
    safetensors.torch.save_file(state, folder / "model.safetensors")
    return reference


@pytest.fixture(scope="module")
def mxfp4_gpt_oss(tiny_checkpoints, tmp_path_factory):
    """(MXFP4 folder, transformers model on the dequantized experts)."""
    folder = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    return folder, _mxfp4_folder(folder, tiny_checkpoints.get("gpt_oss", TINY)[1])


@pytest.mark.parametrize("moe_backend", MOE_BACKENDS)
def test_mxfp4_experts_stay_packed_for_a_kernel_that_reads_them(mxfp4_gpt_oss, moe_backend):
    """Both CPU kernels declare mxfp4: they get the packed uint8 blocks as loaded (and dequantize them once in
    prepare_weights, after which the loaded copy is released); the model matches transformers on the dequantized
    weights."""
    folder, reference = mxfp4_gpt_oss
    model = AutoModelForCausalLM.from_config(ModelConfig.from_pretrained(folder))
    load_weights(model, open_checkpoint(folder), model.checkpoint_rules(), progress=False)
    experts = moe_layers(model)[0].experts
    assert experts.stored_format() == ("mxfp4", None)
    assert (experts.gate_up_proj_blocks.dtype, experts.gate_up_proj_blocks.shape) == (torch.uint8, (4, 64, 2, 16))
    bind_moe_backends(model, moe_backend)
    layer = moe_layers(model)[0]
    assert layer.backend.geometry.expert_format == "mxfp4" and layer.prepared.gate_up.dtype == torch.float32
    compare_generation(reference, runner(model, "SDPA"), f"gpt_oss mxfp4 {moe_backend}")


@pytest.mark.usefixtures("dense_only_moe_kernels")
def test_mxfp4_experts_are_dequantized_at_load_when_no_kernel_reads_them(mxfp4_gpt_oss):
    """With the CPU kernels declaring dense weights only, the engine dequantizes the experts at load
    (kernelbay.moe.dequantize_mxfp4) and binds a dense geometry; the tokens are transformers'."""
    folder, reference = mxfp4_gpt_oss
    model = AutoModelForCausalLM.from_pretrained(folder, progress=False)
    layer = moe_layers(model)[0]
    assert layer.backend.geometry.expert_format == "dense" and layer.prepared.gate_up.dtype == torch.float32
    assert layer.prepared.gate_up_scale is None and layer.prepared.gate_up.shape == (4, 64, 64)
    compare_generation(reference, runner(model, "VANILLA"), "gpt_oss mxfp4 dequantized")


@pytest.mark.parametrize(
    ("name", "layers", "experts", "active", "total"),
    [("gpt-oss-20b", 24, 32, 3.6e9, 20.9e9), ("gpt-oss-120b", 36, 128, 5.1e9, 116.8e9)],
)
def test_explain_reads_the_real_gpt_oss_geometry(name, layers, experts, active, total):
    """Experts, top-4, total parameters and active ones (as OpenAI's model card counts them: without the embedding
    table, which a token reads one row of), sinks required by both layer groups,
    SDPA chosen and FLEX refused for sinks, 2 x 8 KV heads x 64 x 4 bytes (no torch_dtype written: float32) per
    layer per token, MXFP4 kept packed."""
    doc = explain_model(CONFIGS / name)
    config, moe = doc["config"], doc["moe"]
    assert (moe["num_experts"], moe["top_k"], moe["stored_format"], moe["dequantized"]) == (experts, 4, "mxfp4", False)
    assert config["attention_sinks"] and doc["provider"]["module"] == "kernelbay_llama.gpt_oss"
    params = config["parameters"]
    embedding = config["vocab_size"] * config["hidden_size"]
    assert params["active_per_token"] - embedding == pytest.approx(active, rel=0.01)
    assert params["total"] == pytest.approx(total, rel=0.01)
    groups = {g["kind"]: g for g in doc["attention"]["layer_groups"]}
    assert groups[SLIDING]["layers"] == list(range(0, layers, 2))
    assert groups[FULL]["layers"] == list(range(1, layers, 2))
    for group in groups.values():
        assert group["requirements"]["sinks"] and group["backend"] == "SDPA"
        flex = next(c for c in group["candidates"] if c["name"] == "FLEX")
        assert "sinks: attention sinks is not supported" in flex["failures"]
    assert config["dtype"] == "float32" and doc["kv_cache"]["bytes_per_token"] == layers * 2 * 8 * 64 * 4


def test_llm_generates_transformers_greedy_tokens_with_the_default_kernels(tiny_checkpoints):
    """Through LLM (scheduler, default choices: SDPA for both layer groups, the platform's MoE kernel), a batch of
    prompts longer than the window decodes the tokens transformers' greedy generate does."""
    folder, hf_model = tiny_checkpoints.get("gpt_oss", TINY)
    llm = LLM(folder, progress=False, max_num_seqs=2)
    prompts = [[1, 5, 9, 22, 7, 3, 8, 90, 4], [40, 2]]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    with torch.no_grad():
        for prompt, out in zip(prompts, outputs, strict=True):
            expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None)
            assert out.token_ids == expected[0, len(prompt) :].tolist()
