"""A tiny FP8 block-quantized Qwen3-MoE checkpoint (qwen3-30b-a3b-fp8's format) loads and matches transformers on
its dequantised weights, whether the kernel reads the experts as fp8_block or they are dequantized at load."""

from __future__ import annotations

import pytest
import torch
import transformers

from kernelbay.moe import ExpertWeights
from kernelbay_engine import AutoModelForCausalLM
from kernelbay_engine.layers.moe import moe_layers
from plugins.engine.tests.models.test_fp8 import _fp8_checkpoint
from plugins.llama.tests._tiny_moe import TINY_MOE
from tests.models._parity import compare_generation, runner


@pytest.fixture(scope="module")
def fp8_qwen3_moe(tiny_checkpoints, tmp_path_factory):
    """(FP8 folder, transformers model on the dequantised weights)."""
    src = tiny_checkpoints.get("qwen3_moe", TINY_MOE["qwen3_moe"])[0]
    root = tmp_path_factory.mktemp("qwen3-moe-fp8")
    fp8, ref = _fp8_checkpoint(src, root / "fp8", root / "ref", (16, 16))
    return fp8, transformers.AutoModelForCausalLM.from_pretrained(ref, attn_implementation="eager").eval()


@pytest.mark.parametrize("moe_backend", ("TORCH_MOE", "TORCH_GROUPED_MOE"))
def test_fp8_experts_are_read_as_stored(fp8_qwen3_moe, moe_backend):
    folder, reference = fp8_qwen3_moe
    model = AutoModelForCausalLM.from_pretrained(folder, progress=False, moe_backend=moe_backend)
    layer = moe_layers(model)[0]
    assert layer.experts.stored_format() == ("fp8_block", (16, 16))
    assert layer.backend.geometry.expert_format == "fp8_block" and layer.prepared.gate_up_scale is None
    # the CPU kernels dequantize once, in prepare_weights, and hold the only copy: the FP8 tensors are released
    assert layer.experts.released_by == moe_backend and not hasattr(layer.experts.gate_up_proj, "weight_scale_inv")
    compare_generation(reference, runner(model, "VANILLA"), f"qwen3_moe fp8 {moe_backend}", steps=3)


@pytest.mark.usefixtures("dense_only_moe_kernels")
def test_experts_are_dequantized_at_load_when_no_kernel_reads_fp8(fp8_qwen3_moe):
    """With both CPU kernels declaring dense weights only, the selection says `dequantized` and the engine hands the
    kernel dense experts with a dense geometry."""
    folder, reference = fp8_qwen3_moe
    model = AutoModelForCausalLM.from_pretrained(folder, progress=False)
    layer = moe_layers(model)[0]
    assert layer.backend.geometry.expert_format == "dense" and layer.backend.geometry.block_size is None
    assert isinstance(layer.prepared, ExpertWeights) and layer.prepared.gate_up.dtype == torch.float32
    assert layer.prepared.gate_up_scale is None
    compare_generation(reference, runner(model, "VANILLA"), "qwen3_moe fp8 dequantized", steps=3)
