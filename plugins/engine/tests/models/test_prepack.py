"""Weight prepacking (fdot's panels, oneDNN's blocked layout): packed layers compute F.linear, hold their weight once,
and keep transformers parity."""

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
METHODS = {"fdot": prepack.PanelLinearMethod, "onednn": prepack.PackedLinearMethod}


@pytest.fixture(params=prepack.FORMS)
def form(request) -> str:
    ok, reason = prepack.form_available(request.param)
    if not ok:
        pytest.skip(reason)
    return request.param


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


@pytest.mark.parametrize(("bias", "out_features", "in_features"), [(False, 384, 256), (True, 384, 256), (True, 37, 19)])
def test_packed_layer_computes_f_linear_for_any_row_count_and_rank(form, bias, out_features, in_features):
    """0, 1, 8 and 300 rows, 2-D and 3-D inputs, a transposed input, odd shapes (a partial panel, K not a multiple of
    16): all equal F.linear with the original weight."""
    layer = _layer(out_features, in_features, bias=bias)
    weight, b = layer.weight.detach().clone(), (layer.bias.detach().clone() if bias else None)
    report = prepack.prepack_linear_weights(_Model(proj=layer), policy="always", forms=(form,))
    assert report.packed == ["proj"] and report.forms == {"proj": form}
    assert isinstance(layer.method, METHODS[form])
    k = in_features
    inputs = [torch.randn(n, k) for n in (0, 1, 8, 300)] + [torch.randn(2, 5, k), torch.randn(k, 7).t()]
    with torch.inference_mode():
        for x in inputs:
            torch.testing.assert_close(layer(x), F.linear(x, weight, b), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("bias", [False, True])
def test_a_residual_added_by_a_packed_layer_is_the_same_sum(form, bias):
    """layer(x, residual) (oneDNN's fused add post-op where it applies) == residual + layer(x), bit for bit, and
    the residual is left as it was."""
    layer = _layer(384, 256, bias=bias)
    prepack.prepack_linear_weights(_Model(proj=layer), policy="always", forms=(form,))
    with torch.inference_mode():
        for n in (0, 1, 8, 300):
            x, residual = torch.randn(n, 256), torch.randn(n, 384)
            before = residual.clone()
            assert torch.equal(layer(x, residual), residual + layer(x))
            assert torch.equal(residual, before)
            if form == "onednn":
                fused = dispatched(layer, x, residual) == ["mkldnn._linear_pointwise.binary"]  # one call, no add
                assert fused == (not bias)


def test_packing_releases_the_dense_weight_but_can_still_give_it(form):
    """The dense parameter is gone (weights held once); dequantized_weight() rebuilds it exactly."""
    layer = _layer(70, 32, bias=True)
    original = layer.weight.detach().clone()
    model = _Model(proj=layer)
    prepack.prepack_linear_weights(model, policy="always", forms=(form,))
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
    report = prepack.prepack_linear_weights(model, policy="always")
    assert report.packed == []
    assert "shared with another module" in report.skipped["head"]
    assert "per-expert" in report.skipped["experts"]
    assert "weight dtype torch.float16: this form packs torch.float32" in report.skipped["half"]
    assert "Fp8BlockLinearMethod" in report.skipped["fp8"]
    assert all(not isinstance(m.method, tuple(METHODS.values())) for m in (tied, experts, half, fp8))


def test_a_model_keeps_the_layers_it_reads_itself_dense():
    """Layers named in the model's prepack_exclude stay dense, with the reason recorded."""
    model = _Model(head=_layer(64, 32), proj=_layer(64, 32))
    model.prepack_exclude = ("head",)
    report = prepack.prepack_linear_weights(model, policy="always")
    assert report.packed == ["proj"] and "prepack_exclude" in report.skipped["head"]
    assert type(model.head.method) is UnquantizedLinearMethod


def test_auto_packs_by_rule_without_running_a_product(monkeypatch):
    """'auto' packs each weight of MIN_AUTO_NUMEL elements or more in the first form it can take and leaves smaller
    ones dense, saying why, without timing anything: no product (dense or packed) runs while it decides, so a busy
    machine cannot change the decision."""

    def no_product(*args, **kwargs):
        raise AssertionError("a product ran while deciding the forms")

    for method in METHODS.values():
        monkeypatch.setattr(method, "apply", no_product)
    monkeypatch.setattr(prepack, "dense_linear", no_product)
    big_a, big_b, small = _layer(1024, 512), _layer(1024, 512), _layer(32, 32)
    report = prepack.prepack_linear_weights(_Model(a=big_a, b=big_b, small=small), policy="auto")
    first = next(f for f in prepack.FORMS if prepack.form_available(f)[0])
    assert report.packed == ["a", "b"] and report.forms == {"a": first, "b": first}
    assert report.skipped == {"small": f"weight has 1024 elements, below {prepack.MIN_AUTO_NUMEL}: too small to matter"}
    assert type(small.method) is UnquantizedLinearMethod


def test_planned_form_is_the_rule_explain_reports():
    """planned_form answers from dtype, size and the forms' availability alone: what `kernelbay explain` shows."""
    available = {"fdot": (True, "native fdot available"), "onednn": (True, "oneDNN available")}
    assert prepack.planned_form(torch.float32, 1 << 20, "auto", available) == ("fdot", None)
    assert prepack.planned_form(torch.float32, 10, "always", available) == ("fdot", None)
    assert prepack.planned_form(torch.float32, 10, "auto", available)[0] is None
    no_native = {**available, "fdot": (False, "the CPU lacks AVX-512 F / FMA")}
    assert prepack.planned_form(torch.float32, 1 << 20, "auto", no_native) == ("onednn", None)
    form, why = prepack.planned_form(torch.float16, 1 << 20, "auto", available)
    assert form is None and why == (
        "fdot: weight dtype torch.float16: this form packs torch.float32 only; "
        f"onednn: weight dtype torch.float16: this form packs {' and '.join(map(str, prepack._onednn_dtypes()))} only"
    )


def test_never_packs_nothing_and_unknown_policies_are_refused():
    layer = _layer(1024, 512)
    assert prepack.prepack_linear_weights(_Model(a=layer), policy="never").packed == []
    assert type(layer.method) is UnquantizedLinearMethod
    with pytest.raises(ValueError, match="prepack policy must be one of auto, always, never; got 'fast'"):
        prepack.prepack_linear_weights(_Model(a=layer), policy="fast")
    with pytest.raises(ValueError, match=r"prepack forms must be some of fdot, onednn; got \('mkl',\)"):
        prepack.prepack_linear_weights(_Model(a=layer), forms=("mkl",))
    assert type(layer.method) is UnquantizedLinearMethod


@pytest.mark.parametrize("name", ["llama2_bias", "deepseek_v2_lite"])
def test_prepacked_models_keep_transformers_parity(tiny_checkpoints, form, name):
    """Every plain linear packed (attention with biases; MLA's kv_b_proj, dense and shared-expert MLPs): same bar."""
    folder, hf_model = tiny_checkpoints.get(name)
    model = AutoModelForCausalLM.from_pretrained(folder, progress=False)
    report = prepack.prepack_linear_weights(model, policy="always", forms=(form,))
    assert report.packed, report.skipped
    runner = ModelRunner(model, num_blocks=64, block_size=4, attention_backend="VANILLA")
    compare_generation(hf_model, runner, f"{name} prepacked")


def test_an_fdot_row_has_the_same_bits_in_any_batch():
    """fdot's outputs are each one FMA chain over K: a row alone, in a batch of 3, 8 or 13 (every row tile) and on
    either thread gives the same bits."""
    if not prepack.fdot_available()[0]:
        pytest.skip(prepack.fdot_available()[1])
    layer = _layer(200, 72)
    prepack.prepack_linear_weights(_Model(proj=layer), policy="always", forms=("fdot",))
    x = torch.randn(13, 72)
    with torch.inference_mode():
        alone = torch.cat([layer(x[i : i + 1]) for i in range(13)])
        for n in (3, 8, 13):
            assert torch.equal(layer(x[:n]), alone[:n])


def test_fdot_refuses_other_dtypes_and_gives_autograd_the_aten_product():
    """A bfloat16 input is a TypeError naming the fix (no silent cast); with autograd the product is aten's, so
    gradients flow to the input."""
    if not prepack.fdot_available()[0]:
        pytest.skip(prepack.fdot_available()[1])
    layer = _layer(48, 32, bias=True)
    weight = layer.weight.detach().clone()
    prepack.prepack_linear_weights(_Model(proj=layer), policy="always", forms=("fdot",))
    with pytest.raises(TypeError, match=r"multiplies float32 inputs; got torch\.bfloat16"):
        layer(torch.randn(2, 32, dtype=torch.bfloat16))
    x = torch.randn(4, 32, requires_grad=True)
    layer(x).sum().backward()
    torch.testing.assert_close(x.grad, weight.sum(0).expand(4, 32))


@pytest.fixture
def without_native():
    from kernelbay_engine import native

    with native.LIBRARY.forced(None, "disabled by KERNELBAY_NATIVE=0"):
        yield


def test_fdot_unavailable_says_why_and_onednn_packs(without_native):
    """Without the native ops the fdot form is refused with native.status()'s reason and 'always' takes oneDNN's."""
    assert prepack.fdot_available() == (False, "native CPU ops not in use: disabled by KERNELBAY_NATIVE=0")
    layer, alone = _layer(64, 32), _layer(64, 32)
    report = prepack.prepack_linear_weights(_Model(proj=layer), policy="always")
    assert report.forms == {"proj": "onednn"}
    report = prepack.prepack_linear_weights(_Model(proj=alone), policy="always", forms=("fdot",))
    assert report.skipped == {"proj": "fdot: native CPU ops not in use: disabled by KERNELBAY_NATIVE=0"}
