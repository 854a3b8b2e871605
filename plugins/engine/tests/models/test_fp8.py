"""FP8-e4m3 block-scaled checkpoints: per-layer formats, exclusions, and a forward equal to the dequantised one."""

from __future__ import annotations

import re

import pytest
import torch
import transformers

from kernelbay.errors import ConfigError
from kernelbay_engine import AutoModelForCausalLM
from kernelbay_engine.models.quant import (
    FP8_DTYPE,
    Fp8BlockLinearMethod,
    UnquantizedLinearMethod,
    dequantize_fp8_blocks,
    quantize_fp8_blocks,
)
from tests.models._parity import compare_generation

from ._files import tensors, write_variant

# Linear weights the checkpoint quantizes: projections and experts, not embeddings, norms, router or LM head.
QUANTIZED = re.compile(r".*(proj|proj_with_mqa)\.weight")


def _fp8_checkpoint(src, dst_fp8, dst_ref, block, not_converted=()):
    """Write the FP8 checkpoint and, next to it, the float32 checkpoint of its dequantised weights."""
    fp8, ref = {}, {}
    for name, tensor in tensors(src).items():
        keep = not QUANTIZED.fullmatch(name) or any(name.startswith(m + ".") for m in not_converted)
        if keep:
            fp8[name] = ref[name] = tensor
            continue
        q, scale = quantize_fp8_blocks(tensor, block)
        fp8[name], fp8[name.removesuffix("weight") + "weight_scale_inv"] = q, scale
        ref[name] = dequantize_fp8_blocks(q, scale, block)
    quant = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(block),
        "modules_to_not_convert": list(not_converted),
    }
    return write_variant(src, dst_fp8, fp8, quantization_config=quant), write_variant(src, dst_ref, ref)


def test_block_quantization_round_trip_is_close():
    """quantize -> dequantize stays within e4m3 precision, including partial edge blocks."""
    w = torch.randn(40, 50)
    q, scale = quantize_fp8_blocks(w, (16, 16))
    assert q.dtype == FP8_DTYPE and scale.shape == (3, 4)
    assert torch.allclose(dequantize_fp8_blocks(q, scale, (16, 16)), w, rtol=0.07, atol=1e-3)


@pytest.mark.parametrize("name", ["qwen3", "deepseek_v3"])
def test_fp8_forward_matches_the_dequantised_model(tiny_checkpoints, tmp_path, name):
    """Loaded FP8 weights (16x16 blocks, experts included) give transformers' logits on the dequantised weights."""
    src = tiny_checkpoints.get(name)[0]
    fp8, ref = _fp8_checkpoint(src, tmp_path / "fp8", tmp_path / "ref", (16, 16), ("model.layers.0.mlp",))
    model = AutoModelForCausalLM.from_pretrained(fp8, progress=False)
    reference = transformers.AutoModelForCausalLM.from_pretrained(ref, attn_implementation="eager").eval()
    from kernelbay_engine.runner import ModelRunner

    compare_generation(
        reference, ModelRunner(model, num_blocks=64, block_size=4, attention_backend="VANILLA"), f"{name} fp8", steps=3
    )
    layer0, layer1 = model.model.layers[0], model.model.layers[1]
    assert isinstance(layer0.mlp.down_proj.method, UnquantizedLinearMethod)  # excluded by modules_to_not_convert
    assert isinstance(layer1.self_attn.o_proj.method, Fp8BlockLinearMethod)
    assert layer1.self_attn.o_proj.weight.dtype == FP8_DTYPE
    assert isinstance(model.lm_head.method, UnquantizedLinearMethod)


def test_fused_projection_not_aligned_to_scale_blocks_is_refused(tiny_checkpoints, tmp_path):
    """Qwen3-tiny's v_proj starts at row 144 of the fused qkv: with 32-row scale blocks that is an error."""
    src = tiny_checkpoints.get("qwen3")[0]
    fp8, _ = _fp8_checkpoint(src, tmp_path / "fp8", tmp_path / "ref", (32, 32))
    with pytest.raises(ConfigError, match="cannot fuse 'v_proj' into one FP8 layer: it starts at row 144"):
        AutoModelForCausalLM.from_pretrained(fp8, progress=False)
