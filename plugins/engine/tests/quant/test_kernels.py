"""Each quantized CPU kernel against the dequantized reference of its weight, and the errors of bad blocks.

Tolerance: the torch kernels compute in bf16 (activations and output rounded to 8 mantissa bits), int8_dot
rounds the activations to int8 per block of 32, so each output is compared with `x @ W_dq^T` in float32 to 1.5%
of the largest reference output; a wrong scale, zero, nibble order or padding is off by far more (a swapped nibble
plane by ~100%). int8_dot is also held to its own stated arithmetic to float32 rounding (test_int8_dot_*).
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
from kernelbay_engine.quant.kernels import NativeDotKernel
from kernelbay_engine.quant.method import DequantizedLinearMethod
from plugins.engine.tests.quant._kernels_here import (
    DOT,
    assert_unavailable_say_why,
    available,
    chosen,
    first_available,
    kernel_param,
    needs_dot,
    not_available,
    requires_kernel,
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


# each weight kind with its torch kernel (K = 32, one group: the per-channel kernel for Q8_0)
GGUF_KINDS = [("q8_0", "int8_group"), ("q4_0", "int4_group"), ("q4_1", "int4_group")]
FLOAT_KINDS = [("int8", "int8_channel"), ("int8_g32", "int8_group"), ("int4_g32", "int4_group")]
REQUESTS = [None, "torch", kernel_param("int8_dot")]  # None: auto-selection; "torch": the kind's torch kernel


def _torch_kernel(kind: str, kernel: str, k: int) -> str:
    return "int8_channel" if kind in ("q8_0", "int8_g32") and k == 32 else kernel


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("kind,kernel", GGUF_KINDS)
@pytest.mark.parametrize("request_", REQUESTS)
def test_gguf_blocks_run_on_their_kernel(kind, kernel, n, k, request_):
    """GGUF Q8_0/Q4_0/Q4_1 blocks stay quantized and match their dequantized weight on int8_dot (preferred where
    it runs) and on their torch kernel, requested by name; where neither runs, selection gives the dense kernel."""
    gen = torch.Generator().manual_seed(n * k)
    weight, layer = _codes(kind, n, k, gen), _layer(n, k)
    torch_kernel = _torch_kernel(kind, kernel, k)
    requested = torch_kernel if request_ == "torch" else request_
    if requested:
        requires_kernel(requested)
    choice = set_quantized_weight(layer, weight, kernel=requested)
    expected = requested or chosen(torch_kernel)
    assert choice.kernel.name == expected
    if expected == "dense":  # the codes dequantized once into a plain weight the layer holds
        assert type(layer.method) is DequantizedLinearMethod and layer.method.holds_weight
        assert_unavailable_say_why(choice.candidates)
    else:
        assert "weight" not in layer._parameters  # held once, by the kernel
    _check(layer, weight, f"{kind} {expected} {n}x{k}", gen)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("kind,kernel", FLOAT_KINDS)
@pytest.mark.parametrize("request_", REQUESTS)
def test_float_weights_quantized_run_on_their_kernel(kind, kernel, n, k, request_):
    """quantize() of a float weight, per-channel or in groups of 32, matches its dequantized weight (with a bias)."""
    gen = torch.Generator().manual_seed(n + k)
    weight, layer = _float(kind, n, k, gen), _layer(n, k, bias=True)
    torch_kernel = _torch_kernel(kind, kernel, k)
    requested = torch_kernel if request_ == "torch" else request_
    if requested:
        requires_kernel(requested)
    assert set_quantized_weight(layer, weight, kernel=requested).kernel.name == (requested or chosen(torch_kernel))
    _check(layer, weight, f"{kind} {requested} {n}x{k}", gen)


def _fp16_scales(w):
    """The weight int8_dot holds: scale and offset (d * u + m per block) rounded to float16, as it stores them."""
    scale = w.scale.half().float()
    if w.zero is None:
        return type(w)(w.bits, w.group_size, w.q, scale)
    return type(w)(w.bits, w.group_size, w.q, scale, (w.zero - 8 * w.scale).half().float() + 8 * scale)


def _int8_rounded(x: torch.Tensor) -> torch.Tensor:
    """x with each block of 32 rounded to int8 steps of max|x| / 127 (nearest even), as int8_dot rounds it."""
    blocks = x.view(x.shape[0], -1, 32)
    step = blocks.abs().amax(-1, keepdim=True) / 127
    return (torch.round(blocks / torch.where(step > 0, step, 1)) * step).view_as(x)


@needs_dot
@pytest.mark.parametrize(
    "bits,group,n,k",
    [(4, 32, 97, 256), (4, 64, 33, 320), (4, 128, 16, 384), (4, 32, 40, 416), (8, 32, 129, 96), (8, None, 33, 64)],
)
def test_int8_dot_computes_its_stated_arithmetic(bits, group, n, k):
    """int8_dot = (the weights with fp16 scales) @ (x rounded to int8 per block of 32), to float32 rounding: odd
    block counts (padded to pairs), groups of 32 / 64 / 128, per-channel, 1 to 9 rows (tiles of 4, 2, 1)."""
    gen = torch.Generator().manual_seed(bits * n + k)
    weight = quantize(torch.randn(n, k, generator=gen), bits, group)
    run = NativeDotKernel.pack(weight).run
    reference = _fp16_scales(weight).dequantize()
    for m in (1, 2, 3, 4, 5, 9):
        x = torch.randn(m, k, generator=gen) * torch.logspace(-2, 1, k)  # blocks of very different scales
        x[0, :32] = 0  # an all-zero block: step 0
        expected = _int8_rounded(x) @ reference.t()
        torch.testing.assert_close(run(x), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


@needs_dot
def test_int8_dot_propagates_nan_and_inf_and_takes_empty_batches():
    """A NaN or inf activation reaches its outputs (as a float product would); zero rows give an empty output."""
    weight = quantize(torch.randn(8, 64), 4, 32)
    run = NativeDotKernel.pack(weight).run
    x = torch.randn(3, 64)
    x[1, 40], x[2, 3] = float("nan"), float("inf")
    y = run(x)
    assert torch.isfinite(y[0]).all() and torch.isnan(y[1]).all() and not torch.isfinite(y[2]).any()
    assert run(torch.empty(0, 64)).shape == (0, 8)


@needs_dot
def test_int8_dot_refuses_what_it_cannot_run():
    """The op's checks name the problem (a K differing from the weight's by a block included); the layer's run
    copies a strided view first; scales beyond float16 are a ConfigError naming the other kernels."""
    from kernelbay_engine import native

    qdot = native.ops().qdot
    codes, d = torch.zeros(4, 32, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="x must be contiguous float32"):
        qdot(torch.zeros(1, 64, dtype=torch.bfloat16), codes, d, d, 4)
    with pytest.raises(RuntimeError, match="x must be contiguous float32"):
        qdot(torch.zeros(64, 2).t(), codes, d, d, 4)
    with pytest.raises(RuntimeError, match="K = 48 is not a multiple of 32"):
        qdot(torch.zeros(1, 48), codes, d, d, 4)
    for k in (32, 96):  # one block fewer or more than the weight's two: never a silent padding
        with pytest.raises(RuntimeError, match=f"x has K = {k}, the weight 64"):
            qdot(torch.zeros(1, k), codes, d, d, 4)
    with pytest.raises(RuntimeError, match="codes hold 32 bytes a row, 64 expected"):
        qdot(torch.zeros(1, 64), codes, d, d, 8)
    with pytest.raises(RuntimeError, match="bits must be 4 or 8"):
        qdot(torch.zeros(1, 64), codes, d, d, 3)
    weight = quantize(torch.randn(8, 64), 4, 32)
    run = NativeDotKernel.pack(weight).run
    wide = torch.randn(3, 128)
    torch.testing.assert_close(run(wide[:, ::2]), run(wide[:, ::2].contiguous()), rtol=0, atol=0)  # a strided view
    huge = quantize(torch.randn(4, 64) * 1e7, 8, 32)
    with pytest.raises(ConfigError, match=r"beyond float16's range[\s\S]*int8_channel, int4_group"):
        NativeDotKernel.pack(huge)
    for bits in (4, 8):  # a NaN scale (a corrupt file's) is refused as well, in d or (4-bit) in m alone
        broken = quantize(torch.randn(4, 64), bits, 32)
        (broken.zero if bits == 4 else broken.scale)[2, 1] = float("nan")
        with pytest.raises(ConfigError, match=r"beyond float16's range"):
            NativeDotKernel.pack(broken)


def test_int8_dot_unavailable_says_why_and_the_torch_kernel_runs():
    """Without the native ops (KERNELBAY_NATIVE=0, a failed build) the layer goes to its torch kernel (dense where
    that cannot run either) and the candidate list says why int8_dot did not run."""
    from kernelbay_engine import native
    from kernelbay_engine.quant import select

    select.select_kernel.cache_clear()
    try:
        with native.LIBRARY.forced(None, "disabled by KERNELBAY_NATIVE=0"):
            choice = select_kernel(LinearRequirements(4, 32, 64, 48, torch.float32))
    finally:
        select.select_kernel.cache_clear()
    assert choice.kernel.name == first_available("int4_group")
    by_name = {c.name: c for c in choice.candidates}
    assert by_name["int8_dot"].failures == ("not available: native CPU ops not in use: disabled by KERNELBAY_NATIVE=0",)
    assert by_name["int4_group"].failures == not_available("int4_group")


@pytest.mark.parametrize("kernel", ["torch", kernel_param("int8_dot")])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_a_residual_added_by_the_layer_is_the_same_sum(kind, bias, kernel):
    """layer(x, residual) == residual + layer(x), bit for bit; without a bias the add takes a bf16 kernel's output
    as it is (the input's cast is the only one); int8_dot computes in float32: no cast at all."""
    gen = torch.Generator().manual_seed(7)
    layer = _layer(97, 256, bias=bias)
    name = {"q8_0": "int8_group", "q4_1": "int4_group"}[kind] if kernel == "torch" else kernel
    requires_kernel(name)
    set_quantized_weight(layer, _codes(kind, 97, 256, gen), kernel=name)
    for m in ROWS:
        x, residual = torch.randn(m, 256, generator=gen), torch.randn(m, 97, generator=gen)
        assert torch.equal(layer(x, residual), residual + layer(x))
        casts = (2 if bias else 1) if kernel == "torch" else 0
        assert dispatched(layer, x, residual).count("aten._to_copy.default") == casts


@pytest.mark.parametrize("kernel", [kernel_param("int8_group"), kernel_param("int8_dot")])
@pytest.mark.parametrize("quantized", [("gate_up_proj", "down_proj"), ("gate_up_proj",)])
def test_a_gated_mlp_on_quantized_kernels_matches_its_dequantized_weights(quantized, kernel):
    """Both projections on bf16 kernels: act(gate) * up runs in bf16 (no cast out and back in); one of them only:
    the float path; int8_dot computes in float32 (no cast). Each way the MLP matches float math on the dequantized
    weights."""
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
            set_quantized_weight(layer, weight, kernel=kernel)
            weights[name] = weight.dequantize()
    x, residual = torch.randn(5, 64, generator=gen), torch.randn(5, 64, generator=gen)
    casts = dispatched(mlp, x, residual).count("aten._to_copy.default")
    # bf16 path: x into bf16 only; float path: out of it too
    assert casts == (0 if kernel == "int8_dot" else 1 if len(quantized) == 2 else 2)
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
    with pytest.raises(ConfigError, match="valid kernels are int8_dot, int8_channel, int4_group, int8_group, dense"):
        select_kernel(req, "int3")


def test_the_dense_kernel_holds_plain_weights():
    """Requested by name, the dense kernel dequantizes once: the layer gets plain float weights it holds (a load
    after it reads nothing into them)."""
    gen = torch.Generator().manual_seed(2)
    weight, layer = _codes("q4_0", 48, 64, gen), _layer(48, 64)
    assert set_quantized_weight(layer, weight, kernel="dense").kernel.name == "dense"
    assert isinstance(layer.method, UnquantizedLinearMethod) and layer.method.holds_weight
    torch.testing.assert_close(layer.weight, weight.dequantize())


def test_every_candidate_has_a_reason():
    """Selection for Q8_0 groups: the per-channel and int4 kernels say why not, int8_dot (where it runs) or
    int8_group is chosen, dense where neither runs; a kernel unavailable here says why in its own words."""
    choice = select_kernel(LinearRequirements(8, 32, 64, 48, torch.float32))
    by_name = {c.name: c for c in choice.candidates}
    expected = chosen("int8_group")
    assert choice.kernel.name == expected and by_name[expected].chosen
    assert [c.name for c in choice.candidates if c.chosen] == [expected]
    if DOT:
        assert by_name["int8_dot"].reason.startswith("chosen: int8 activations per block of 32 on AVX-512 VNNI")
    if expected == "int8_group":
        assert by_name["int8_group"].reason.startswith("chosen: bf16 activations on ")
    elif available("int8_group"):
        assert by_name["int8_group"].reason == "capable, a preferred kernel was chosen"
    assert by_name["int8_channel"].failures == (
        "group size 32: it supports per-channel scales",
        *not_available("int8_channel"),
    )
    assert by_name["int4_group"].failures == ("8-bit weights: it runs 4-bit ones", *not_available("int4_group"))
    if expected == "dense":
        assert by_name["dense"].reason == "chosen: plain weights in the model dtype"
    else:
        assert by_name["dense"].reason == "capable, a preferred kernel was chosen"
    assert_unavailable_say_why(choice.candidates)


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


@needs_dot
def test_int8_dot_from_concurrent_threads_gives_each_its_own_result():
    """Callers on several Python threads at once (the server's workers): each call's quantized activations are its
    own, so every result equals the same call made alone."""
    from concurrent.futures import ThreadPoolExecutor

    gen = torch.Generator().manual_seed(11)
    run = NativeDotKernel.pack(quantize(torch.randn(256, 192, generator=gen), 4, 32)).run
    inputs = [torch.randn(1 + i % 5, 192, generator=gen) for i in range(32)]
    alone = [run(x) for x in inputs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(run, inputs))
    assert all(torch.equal(a, b) for a, b in zip(alone, together, strict=True))
