"""Each quantized CPU kernel against the dequantized reference of its weight, and the errors of bad blocks.

Tolerance: the kernels compute in bf16 (activations and output rounded to 8 mantissa bits), so each output
is compared with `x @ W_dq^T` in float32 to 1.5% of the largest reference output; a wrong scale, zero,
nibble order or padding is off by far more (a swapped nibble plane by ~100%).
"""

from __future__ import annotations

import pytest
import torch

from kernelbay.errors import ConfigError
from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.models.quant import UnquantizedLinearMethod
from kernelbay_engine.quant import (
    LinearRequirements,
    from_q4_0,
    from_q4_1,
    from_q8_0,
    quantize,
    select_kernel,
    set_quantized_weight,
)
from tests._dispatch import dispatched

TOLERANCE = 1.5e-2
# odd N (padded to 16 by the int4 kernel), K multiple of 32; 4100 rows: packed in two row chunks (an LM head's case)
SHAPES = [(33, 64), (97, 256), (16, 32), (129, 96), (4100, 64)]
ROWS = (1, 3, 8, 17)


def _codes(kind: str, n: int, k: int, gen: torch.Generator):
    scale = (torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3).half()
    if kind == "q8_0":
        return from_q8_0(torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen), scale)
    nibbles = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
    if kind == "q4_0":
        return from_q4_0(nibbles, scale)
    return from_q4_1(nibbles, scale, -(torch.rand(n, k // 32, generator=gen) * 0.1).half())


def _float(kind: str, n: int, k: int, gen: torch.Generator):
    w = torch.randn(n, k, generator=gen)
    return {"int8": quantize(w, 8), "int8_g32": quantize(w, 8, 32), "int4_g32": quantize(w, 4, 32)}[kind]


def _layer(n: int, k: int, bias: bool = False) -> Linear:
    layer = Linear(k, n, bias=bias)
    layer.create_weights(UnquantizedLinearMethod(), torch.float32)
    if bias:
        torch.nn.init.normal_(layer.bias)
    return layer


def _check(layer: Linear, weight, label: str, gen: torch.Generator) -> None:
    for m in ROWS:
        x = torch.randn(m, weight.in_features, generator=gen)
        ref = x @ weight.dequantize().t() + (layer.bias if layer.has_bias else 0)
        err = ((layer(x) - ref).abs().max() / ref.abs().max()).item()
        assert err < TOLERANCE, f"[{label}] rows {m}: max error {err:.2e} of the largest output"


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize(
    "kind,kernel",
    [("q8_0", "int8_group"), ("q4_0", "int4_group"), ("q4_1", "int4_group")],
)
def test_gguf_blocks_run_on_their_kernel(kind, kernel, n, k):
    """GGUF Q8_0/Q4_0/Q4_1 blocks stay quantized and match their dequantized weight (K=32: one group = per-channel)."""
    gen = torch.Generator().manual_seed(n * k)
    weight, layer = _codes(kind, n, k, gen), _layer(n, k)
    choice = set_quantized_weight(layer, weight)
    expected = "int8_channel" if (kind == "q8_0" and k == 32) else kernel
    assert choice.kernel.name == expected
    assert "weight" not in layer._parameters  # held once, by the kernel
    _check(layer, weight, f"{kind} {expected} {n}x{k}", gen)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize(
    "kind,kernel", [("int8", "int8_channel"), ("int8_g32", "int8_group"), ("int4_g32", "int4_group")]
)
def test_float_weights_quantized_run_on_their_kernel(kind, kernel, n, k):
    """quantize() of a float weight, per-channel or in groups of 32, matches its dequantized weight (with a bias)."""
    gen = torch.Generator().manual_seed(n + k)
    weight, layer = _float(kind, n, k, gen), _layer(n, k, bias=True)
    expected = "int8_channel" if (kind == "int8_g32" and k == 32) else kernel
    assert set_quantized_weight(layer, weight).kernel.name == expected
    _check(layer, weight, f"{kind} {expected} {n}x{k}", gen)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_a_residual_added_by_the_layer_is_the_same_sum(kind, bias):
    """layer(x, residual) == residual + layer(x), bit for bit; without a bias the add takes the kernel's bf16
    output as it is (the input's cast is the only one)."""
    gen = torch.Generator().manual_seed(7)
    layer = _layer(97, 256, bias=bias)
    set_quantized_weight(layer, _codes(kind, 97, 256, gen))
    for m in ROWS:
        x, residual = torch.randn(m, 256, generator=gen), torch.randn(m, 97, generator=gen)
        assert torch.equal(layer(x, residual), residual + layer(x))
        assert dispatched(layer, x, residual).count("aten._to_copy.default") == (2 if bias else 1)


@pytest.mark.parametrize("quantized", [("gate_up_proj", "down_proj"), ("gate_up_proj",)])
def test_a_gated_mlp_on_quantized_kernels_matches_its_dequantized_weights(quantized):
    """Both projections on bf16 kernels: act(gate) * up runs in bf16 (no cast out and back in); one of them only:
    the float path. Either way the MLP matches float math on the dequantized weights."""
    from kernelbay_engine.layers.activation import GatedMLP

    gen = torch.Generator().manual_seed(3)
    mlp = GatedMLP(64, 96, "silu")
    weights = {}
    for name, layer in (("gate_up_proj", mlp.gate_up_proj), ("down_proj", mlp.down_proj)):
        layer.create_weights(UnquantizedLinearMethod(), torch.float32)
        torch.nn.init.normal_(layer.weight, generator=gen)
        weights[name] = layer.weight.detach().clone()
        if name in quantized:
            weight = quantize(layer.weight.detach(), 8, 32)
            set_quantized_weight(layer, weight)
            weights[name] = weight.dequantize()
    x, residual = torch.randn(5, 64, generator=gen), torch.randn(5, 64, generator=gen)
    casts = dispatched(mlp, x, residual).count("aten._to_copy.default")
    assert casts == (1 if len(quantized) == 2 else 2)  # bf16 path: x into bf16 only; float path: out of it too
    gate, up = (x @ weights["gate_up_proj"].t()).split(96, dim=-1)
    ref = residual + (torch.nn.functional.silu(gate) * up) @ weights["down_proj"].t()
    err = ((mlp(x, residual) - ref).abs().max() / ref.abs().max()).item()
    assert err < TOLERANCE


def test_q4_1_folds_its_min_into_the_zero():
    """Q4_1 value = q * scale + min, exactly as GGUF defines it (dequantized by hand)."""
    q = torch.tensor([[0, 15] * 16], dtype=torch.uint8)
    w = from_q4_1(q, torch.tensor([[0.5]]).half(), torch.tensor([[-2.0]]).half())
    assert w.dequantize()[0, :2].tolist() == [-2.0, 5.5]
    assert from_q4_0(q, torch.tensor([[0.5]])).dequantize()[0, :2].tolist() == [-4.0, 3.5]


def test_quantized_weight_reads_back_through_the_kernel():
    """dequantized_weight() of a quantized layer (what code reading weights sees) is the kernel's weight."""
    gen = torch.Generator().manual_seed(1)
    weight, layer = _codes("q4_1", 48, 64, gen), _layer(48, 64)
    set_quantized_weight(layer, weight)
    ref = weight.dequantize()
    assert ((layer.dequantized_weight() - ref).abs().max() / ref.abs().max()) < TOLERANCE


def test_a_requested_kernel_that_cannot_run_the_layer_is_an_error():
    """Requesting int4_group for 8-bit weights names why; an unknown kernel lists the valid ones."""
    req = LinearRequirements(8, 32, 64, 48, torch.float32)
    with pytest.raises(ConfigError, match=r"int4_group.*cannot run[\s\S]*8-bit weights"):
        select_kernel(req, "int4_group")
    with pytest.raises(ConfigError, match="valid kernels are int8_channel, int4_group, int8_group, dense"):
        select_kernel(req, "int3")


def test_the_dense_kernel_holds_plain_weights():
    """Requested by name, the dense kernel dequantizes once: the layer gets plain float weights."""
    gen = torch.Generator().manual_seed(2)
    weight, layer = _codes("q4_0", 48, 64, gen), _layer(48, 64)
    assert set_quantized_weight(layer, weight, kernel="dense").kernel.name == "dense"
    assert type(layer.method) is UnquantizedLinearMethod
    torch.testing.assert_close(layer.weight, weight.dequantize())


def test_every_candidate_has_a_reason():
    """Selection for Q8_0 groups: the per-channel and int4 kernels say why not, int8_group is chosen."""
    choice = select_kernel(LinearRequirements(8, 32, 64, 48, torch.float32))
    by_name = {c.name: c for c in choice.candidates}
    assert choice.kernel.name == "int8_group" and by_name["int8_group"].chosen
    assert by_name["int8_channel"].failures == ("group size 32: it supports per-channel scales",)
    assert by_name["int4_group"].failures == ("8-bit weights: it runs 4-bit ones",)
    assert by_name["dense"].reason == "capable, a preferred kernel was chosen"


BAD_BLOCKS = [
    (
        lambda: from_q8_0(torch.zeros(4, 48, dtype=torch.int8), torch.ones(4, 1)),
        "K = 48 is not a multiple of its block size 32",
    ),
    (
        lambda: from_q8_0(torch.zeros(4, 64, dtype=torch.int16), torch.ones(4, 2)),
        "Q8_0 codes must be int8, got torch.int16",
    ),
    (
        lambda: from_q8_0(torch.zeros(4, 64, dtype=torch.int8), torch.ones(4, 3)),
        r"Q8_0 scale must be \[N, K // 32\] = \[N, 2\]",
    ),
    (lambda: from_q4_0(torch.full((4, 64), 16, dtype=torch.uint8), torch.ones(4, 2)), "nibble values 0..15, found 16"),
    (lambda: from_q4_0(torch.zeros(4, 64, dtype=torch.int8), torch.ones(4, 2)), "Q4_0 codes must be uint8"),
    (
        lambda: from_q4_1(torch.zeros(4, 64, dtype=torch.uint8), torch.ones(4, 2), torch.ones(4, 2, dtype=torch.int32)),
        "Q4_1 min must be a float tensor",
    ),
    (lambda: quantize(torch.randn(4, 48), 4, 32), "in_features 48 is not a multiple of the group size 32"),
    (lambda: quantize(torch.randn(4, 64), 3), r"cannot quantize to 3 bits: supported widths are \(4, 8\)"),
    (lambda: quantize(torch.ones(4, 64, dtype=torch.int32), 8), "quantize takes a float"),
]


@pytest.mark.parametrize("make,message", BAD_BLOCKS)
def test_bad_blocks_are_named(make, message):
    """Wrong K, code dtype, scale shape, nibble range, bit width: each a ConfigError saying what is wrong."""
    with pytest.raises(ConfigError, match=message):
        make()


def test_a_weight_of_the_wrong_shape_is_refused():
    """A weight whose [N, K] differs from the layer's is refused with both shapes named."""
    gen = torch.Generator().manual_seed(3)
    with pytest.raises(ConfigError, match=r"quantized weight is \[48, 64\], the layer needs \[32, 64\]"):
        set_quantized_weight(_layer(32, 64), _codes("q4_0", 48, 64, gen))
