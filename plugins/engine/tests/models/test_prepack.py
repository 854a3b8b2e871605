"""oneDNN weight prepacking: packed layers compute F.linear, hold their weight once, and keep transformers parity."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernelbay_engine import AutoModelForCausalLM
from kernelbay_engine.layers import prepack
from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.models.quant import UnquantizedLinearMethod
from kernelbay_engine.runner import ModelRunner
from tests._dispatch import dispatched
from tests.models._parity import compare_generation

pytestmark = pytest.mark.skipif(not prepack.prepacking_available()[0], reason=prepack.prepacking_available()[1])


def _layer(out_features: int, in_features: int, *, bias: bool = False) -> Linear:
    layer = Linear(in_features, out_features, bias=bias)
    layer.create_weights(UnquantizedLinearMethod(), torch.float32)
    with torch.no_grad():
        layer.weight.normal_()
        if bias:
            layer.bias.normal_()
    return layer


class _Model(torch.nn.Module):
    def __init__(self, **layers):
        super().__init__()
        for name, layer in layers.items():
            setattr(self, name, layer)


@pytest.mark.parametrize("bias", [False, True])
def test_packed_layer_computes_f_linear_for_any_row_count_and_rank(bias):
    """0, 1, 8 and 300 rows, 2-D and 3-D inputs, a transposed input: all equal F.linear with the original weight."""
    layer = _layer(384, 256, bias=bias)
    weight, b = layer.weight.detach().clone(), (layer.bias.detach().clone() if bias else None)
    report = prepack.prepack_linear_weights(_Model(proj=layer), rows=(1,), policy="always")
    assert report.packed == ["proj"] and isinstance(layer.method, prepack.PackedLinearMethod)
    inputs = [torch.randn(n, 256) for n in (0, 1, 8, 300)] + [torch.randn(2, 5, 256), torch.randn(256, 7).t()]
    with torch.inference_mode():
        for x in inputs:
            torch.testing.assert_close(layer(x), F.linear(x, weight, b), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("bias", [False, True])
def test_a_residual_added_by_a_packed_layer_is_the_same_sum(bias):
    """layer(x, residual) (oneDNN's fused add post-op where it applies) == residual + layer(x), bit for bit, and
    the residual is left as it was."""
    layer = _layer(384, 256, bias=bias)
    prepack.prepack_linear_weights(_Model(proj=layer), rows=(1,), policy="always")
    with torch.inference_mode():
        for n in (0, 1, 8, 300):
            x, residual = torch.randn(n, 256), torch.randn(n, 384)
            before = residual.clone()
            assert torch.equal(layer(x, residual), residual + layer(x))
            assert torch.equal(residual, before)
            fused = dispatched(layer, x, residual) == ["mkldnn._linear_pointwise.binary"]  # one call, no add
            assert fused == (not bias)


def test_packing_releases_the_dense_weight_but_can_still_give_it():
    """The dense parameter is gone (weights held once); dequantized_weight() rebuilds it exactly."""
    layer = _layer(64, 32, bias=True)
    original = layer.weight.detach().clone()
    model = _Model(proj=layer)
    prepack.prepack_linear_weights(model, rows=(1,), policy="always")
    assert [name for name, _ in model.named_parameters()] == ["proj.bias"]
    assert torch.equal(layer.dequantized_weight(), original)
    assert layer.method.param_names(layer) == ("bias",)
    with pytest.raises(ValueError, match="no expert dimension"):
        layer.method.weight(layer, 0)


def test_ineligible_layers_are_left_dense_with_a_reason():
    """Tied (other than the LM head), per-expert, float16 and FP8 layers stay as they were, each with the reason."""
    from kernelbay_engine.layers.linear import ExpertLinear
    from kernelbay_engine.models.quant import Fp8BlockLinearMethod

    embed = torch.nn.Embedding(50, 16)
    tied = _layer(50, 16)
    tied.weight = embed.weight
    experts = ExpertLinear(16, {"gate_proj": 8}, num_experts=2)
    experts.create_weights(UnquantizedLinearMethod(), torch.float32)
    half = Linear(16, 16)
    half.create_weights(UnquantizedLinearMethod(), torch.float16)
    fp8 = Linear(128, 128)
    fp8.create_weights(Fp8BlockLinearMethod((128, 128)), torch.float32)
    model = _Model(embed=embed, head=tied, experts=experts, half=half, fp8=fp8)
    report = prepack.prepack_linear_weights(model, rows=(1,), policy="always")
    assert report.packed == []
    assert "shared with another module" in report.skipped["head"]
    assert "per-expert" in report.skipped["experts"]
    assert "weight dtype torch.float16: packing is used for torch.float32" in report.skipped["half"]
    assert "Fp8BlockLinearMethod" in report.skipped["fp8"]
    assert all(not isinstance(m.method, prepack.PackedLinearMethod) for m in (tied, experts, half, fp8))


def test_a_model_keeps_the_layers_it_reads_itself_dense():
    """Layers named in the model's prepack_exclude stay dense, with the reason recorded."""
    model = _Model(head=_layer(64, 32), proj=_layer(64, 32))
    model.prepack_exclude = ("head",)
    report = prepack.prepack_linear_weights(model, rows=(1,), policy="always")
    assert report.packed == ["proj"] and "prepack_exclude" in report.skipped["head"]
    assert type(model.head.method) is UnquantizedLinearMethod


def test_auto_times_each_shape_once_and_skips_small_weights():
    """'auto' measures each distinct (out, in, bias) once, packs unless dense was faster by more than the margin,
    and explains the rest."""
    big_a, big_b, small = _layer(1024, 512), _layer(1024, 512), _layer(32, 32)
    model = _Model(a=big_a, b=big_b, small=small)
    report = prepack.prepack_linear_weights(model, rows=(1, 8), policy="auto")
    assert list(report.timings_ms) == [(1024, 512, False)]
    dense_ms, packed_ms = report.timings_ms[(1024, 512, False)]
    assert dense_ms > 0 and packed_ms > 0
    assert "too small to matter" in report.skipped["small"]
    decided_packed = packed_ms < dense_ms * prepack.PACKED_MARGIN
    assert ("a" in report.packed) == ("b" in report.packed) == decided_packed
    if not decided_packed:
        assert "measured slower packed" in report.skipped["a"]


def test_never_packs_nothing_and_unknown_policies_are_refused():
    layer = _layer(1024, 512)
    assert prepack.prepack_linear_weights(_Model(a=layer), rows=(1,), policy="never").packed == []
    assert type(layer.method) is UnquantizedLinearMethod
    with pytest.raises(ValueError, match="prepack policy must be one of auto, always, never; got 'fast'"):
        prepack.prepack_linear_weights(_Model(a=layer), rows=(1,), policy="fast")


@pytest.mark.parametrize("name", ["llama2_bias", "deepseek_v2_lite"])
def test_prepacked_models_keep_transformers_parity(tiny_checkpoints, name):
    """Every plain linear packed (attention with biases; MLA's kv_b_proj, dense and shared-expert MLPs): same bar."""
    folder, hf_model = tiny_checkpoints.get(name)
    model = AutoModelForCausalLM.from_pretrained(folder, progress=False)
    report = prepack.prepack_linear_weights(model, rows=(1,), policy="always")
    assert report.packed, report.skipped
    runner = ModelRunner(model, num_blocks=64, block_size=4, attention_backend="VANILLA")
    compare_generation(hf_model, runner, f"{name} prepacked")
