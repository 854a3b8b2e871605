"""layers/fused.py: a decoder layer on int8_dot or fdot runs its norm / projections / RoPE / MLP in two native calls,
with the bits of the module path; where a condition fails the module path runs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernelbay_engine import LLM
from kernelbay_engine.quant import quantize, set_quantized_weight
from kernelbay_engine.runner import ModelRunner, StepRequest
from plugins.engine.tests.quant._kernels_here import needs_dot
from tests.models._parity import PROMPTS

pytestmark = needs_dot


def _layers(llm):
    return llm.model.model.layers


@torch.inference_mode()
def _logits(model, backend: str, steps: int = 4) -> list[torch.Tensor]:
    """Prefill of PROMPTS (mixed lengths), then `steps` greedy decode steps: every step's logits."""
    runner = ModelRunner(model, num_blocks=64, block_size=4, attention_backend=backend)
    out = [runner.step([StepRequest(i, p, 0) for i, p in enumerate(PROMPTS)])]
    lengths = [len(p) for p in PROMPTS]
    for _ in range(steps):
        nxt = out[-1].argmax(-1).tolist()
        out.append(runner.step([StepRequest(i, (t,), n) for i, (t, n) in enumerate(zip(nxt, lengths, strict=True))]))
        lengths = [n + 1 for n in lengths]
    return out


@pytest.mark.parametrize("backend", ["SDPA", "VANILLA"])
@pytest.mark.parametrize("mode", ["int4", "int8", "fp32"])
def test_the_native_path_gives_the_module_paths_bits(tiny_llama, mode, backend):
    """Every layer of a tiny Llama quantized (int8_dot) or float32 with its weights packed as fdot's panels takes the
    native path; its logits equal the module path's bit for bit, over a mixed-length prefill and decode steps."""
    options = {"prepack_weights": "always"} if mode == "fp32" else {"quantization": mode}
    llm = LLM(tiny_llama, progress=False, **options)
    if mode == "fp32":
        assert all(form == "fdot" for form in llm.prepack_report.forms.values()), llm.prepack_report.skipped
    layers = _layers(llm)
    calls = []
    for layer in layers:  # every layer builds its block, and each step runs it (counted)
        block = layer._native_block()
        assert block is not None
        counted = lambda *args, op=block.attention_in_op: calls.append(1) or op(*args)  # noqa: E731
        layer.native = dataclasses.replace(block, attention_in_op=counted)
    fused = _logits(llm.model, backend)
    assert len(calls) == len(layers) * len(fused)  # the prefill and every decode step took the native path
    for layer in layers:
        layer.native = None  # the module path
    for a, b in zip(fused, _logits(llm.model, backend), strict=True):
        assert torch.equal(a, b)


def test_no_native_path_where_a_condition_fails(tiny_llama):
    """Float linears left dense: no native block; a bf16 or non-contiguous input, autograd, a norm weight replaced or
    a layer re-quantized after the block was built: the module path."""
    plain = LLM(tiny_llama, progress=False)
    _logits(plain.model, "SDPA", steps=0)
    assert all(layer.native is None for layer in _layers(plain))

    llm = LLM(tiny_llama, progress=False, quantization="int4")
    _logits(llm.model, "SDPA", steps=0)
    layer = _layers(llm)[0]
    block = layer.native
    x, cos = torch.randn(3, layer.input_layernorm.weight.shape[0]), torch.randn(3, 16)
    assert block.runs(x, cos)
    assert not block.runs(x.bfloat16(), cos)
    assert not block.runs(x.t().contiguous().t(), cos)  # not contiguous
    with torch.enable_grad():
        assert not block.runs(x.requires_grad_(), cos)
    saved = layer.post_attention_layernorm.weight
    layer.post_attention_layernorm.weight = torch.nn.Parameter(saved.detach().clone(), requires_grad=False)
    assert not block.runs(x.detach(), cos)  # a norm weight replaced: the arguments would hold the old one
    layer.post_attention_layernorm.weight = saved
    assert block.runs(x.detach(), cos)
    down = layer.mlp.down_proj
    set_quantized_weight(down, quantize(down.dequantized_weight(), 4, 32), kernel="int4_group")
    assert not block.runs(x.detach(), cos)  # its linears changed: the module path runs the new kernel


def test_a_layer_with_a_bias_keeps_the_module_path(tmp_path):
    """Qwen2's q/k/v bias: native_block declines (the fused op adds no bias)."""
    from tests.models.conftest import build_reference

    reference = build_reference("qwen2")
    reference.save_pretrained(tmp_path)
    llm = LLM(tmp_path, progress=False, quantization="int8")
    _logits(llm.model, "SDPA", steps=0)
    qkv = _layers(llm)[0].self_attn.qkv_proj
    assert qkv.has_bias and qkv.method.kernel.name == "int8_dot"  # declined for the bias, not the kernel
    assert all(layer.native is None for layer in _layers(llm))
