"""RotaryEmbedding.apply's few-op paths (decode is dispatch-bound) give bit for bit the reference rotation: the
native op where it runs (kernelbay_engine.native), the roll-based aten ops elsewhere; every test runs both."""

from __future__ import annotations

import pytest
import torch

from kernelbay_engine import native
from kernelbay_engine.layers.rotary import RopeParams, RotaryEmbedding
from tests._dispatch import DispatchedOps


@pytest.fixture(autouse=True, params=["native", "aten"])
def path(request):
    """Each test once with the native ops (they must build here) and once on the aten path."""
    if request.param == "native":
        assert native.ops() is not None, native.status()
        yield request.param
    else:
        with native.LIBRARY.forced(None):
            yield request.param


def _reference(rotary: RotaryEmbedding, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return rotary._rotate(x, cos, sin)  # the formula transformers uses: x * cos + rotate_half(x) * sin


def _fused_qkv(tokens: int, heads: int, kv_heads: int, dim: int, dtype: torch.dtype):
    """q, k, v as the llama attention block gets them: views of one fused projection's output."""
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim).to(dtype) * 3
    q, k, _ = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    return q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 7])
def test_fused_qk_rotation_is_bitwise_the_reference(dtype, tokens):
    rotary = RotaryEmbedding(RopeParams(theta=10000.0, rotary_dim=64))
    q, k = _fused_qkv(tokens, 9, 3, 64, dtype)
    cos, sin = rotary.cos_sin(torch.arange(100, 100 + tokens), dtype)
    rq, rk = rotary.apply(q, k, cos, sin)
    assert torch.equal(rq, _reference(rotary, q, cos, sin))
    assert torch.equal(rk, _reference(rotary, k, cos, sin))
    assert rq.is_contiguous() and rk.is_contiguous()  # what the backends got before (fresh tensors)
    assert (rq.shape, rk.shape) == (q.shape, k.shape)


@pytest.mark.parametrize("tokens", [1, 4])
def test_q_and_k_of_one_projection_rotate_in_one_pass(tokens, path):
    """The point of the fast path: one native call, or one roll and one multiply-add, for q and k together."""
    rotary = RotaryEmbedding(RopeParams(theta=10000.0, rotary_dim=64))
    q, k = _fused_qkv(tokens, 9, 3, 64, torch.float32)
    cos, sin = rotary.cos_sin(torch.arange(tokens), torch.float32)
    rotary.apply(q, k, cos, sin)  # builds the step's signed sin table once
    with DispatchedOps() as ops:
        rotary.apply(q, k, cos, sin)
    names = [n.removeprefix("aten.") for n in ops.names]
    compute = [
        n for n in names if n.split(".")[0] in ("mm", "bmm", "matmul", "mul", "add", "cat", "neg", "clone", "roll")
    ]
    copies = 2 if tokens > 1 else 0  # the copies making q and k contiguous
    if path == "native":
        assert names.count("empty.memory_format") == 1 and len(compute) == copies, names
        return
    assert compute.count("mul.Tensor") == 2 and compute.count("add.Tensor") == 1, names
    assert compute.count("roll.default") == 1, names
    assert len(compute) <= 4 + copies, names


def test_separate_q_and_k_take_the_same_result():
    """Not views of one buffer (Qwen3's q/k norms make new tensors): each is rotated on its own, same bits."""
    rotary = RotaryEmbedding(RopeParams(theta=500000.0, rotary_dim=32))
    q, k = torch.randn(5, 4, 32), torch.randn(5, 2, 32)
    cos, sin = rotary.cos_sin(torch.tensor([0, 1, 2, 40, 41]), torch.float32)
    rq, rk = rotary.apply(q, k, cos, sin)
    assert torch.equal(rq, _reference(rotary, q, cos, sin))
    assert torch.equal(rk, _reference(rotary, k, cos, sin))


def test_step_tables_are_rebuilt_for_a_new_step():
    """The [T, 1, D] views are reused only for the very tensors they were made from."""
    rotary = RotaryEmbedding(RopeParams(theta=10000.0, rotary_dim=16))
    q, k = _fused_qkv(1, 2, 1, 16, torch.float32)
    for position in (3, 900):
        cos, sin = rotary.cos_sin(torch.tensor([position]), torch.float32)
        rq, _ = rotary.apply(q, k, cos, sin)
        assert torch.equal(rq, _reference(rotary, q, cos, sin))


@pytest.mark.parametrize(
    "params",
    [
        RopeParams(theta=10000.0, rotary_dim=16),  # partial rotary on a 32-wide head
        RopeParams(theta=10000.0, rotary_dim=32, interleaved=True),  # DeepSeek's pairs
    ],
    ids=["partial", "interleaved"],
)
def test_other_layouts_keep_the_general_rotation(params):
    rotary = RotaryEmbedding(params)
    q, k = _fused_qkv(3, 4, 2, 32, torch.float32)
    cos, sin = rotary.cos_sin(torch.arange(3), torch.float32)
    rq, rk = rotary.apply(q, k, cos, sin)
    assert torch.equal(rq, _reference(rotary, q, cos, sin))
    assert torch.equal(rk, _reference(rotary, k, cos, sin))
    if not params.interleaved:  # the pass-through dims are untouched
        assert torch.equal(rq[..., 16:], q[..., 16:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 6])
def test_split_rotate_is_the_split_and_rotation_of_the_cast(dtype, tokens, path):
    """A fused projection's output (bf16: a quantized kernel's) -> float32 q, k rotated and v, the same bits as
    casting, splitting by heads and `apply`; one native call on the native path."""
    rotary = RotaryEmbedding(RopeParams(theta=10000.0, rotary_dim=32))
    heads, kv_heads = 6, 2
    qkv = (torch.randn(tokens, (heads + 2 * kv_heads) * 32) * 3).to(dtype)
    cos, sin = rotary.cos_sin(torch.arange(50, 50 + tokens), torch.float32)
    q, k, v = rotary.split_rotate(qkv, heads, kv_heads, cos, sin)
    wq, wk, wv = qkv.float().view(tokens, heads + 2 * kv_heads, 32).split_with_sizes((heads, kv_heads, kv_heads), 1)
    assert torch.equal(q, _reference(rotary, wq, cos, sin)) and torch.equal(k, _reference(rotary, wk, cos, sin))
    assert torch.equal(v, wv) and q.dtype == k.dtype == v.dtype == torch.float32
    with DispatchedOps() as ops:
        rotary.split_rotate(qkv, heads, kv_heads, cos, sin)
    assert (len(ops.names) == 3) == (path == "native"), ops.names  # q, k, v allocated, nothing else dispatched
