"""`NativeDecoderBlock`: a pre-norm decoder layer's work around its attention in two native calls.

A decode step of a small model is bound by its Python-level calls as much as by its kernels: per layer the
module path makes ~21 (norm, qkv projection, RoPE split, output projection with the residual, norm, gate_up,
silu * up, down with the residual, and the module calls around them). When every linear of a layer runs a native
kernel (int8_dot's codes or fdot's float32 panels: `method.native`) and the layer is the plain pre-norm shape
(Llama, Mistral, Qwen2 without bias, SmolLM...), the native ops `attention_in` (norm, qkv, RoPE) and
`attention_out_mlp` (o_proj + residual, norm, gate_up, silu * up, down + residual) make the same calls in the same
order from C++: the same bits (tests/quant/test_fused.py), ~15 Python-level calls a layer fewer. The attention
itself stays the layer's backend call.

A family builds one with `native_block(...)` (None where any condition fails) and checks `block.runs(x, cos)`
each step: the linears' kernels unchanged since, float32 contiguous input, no autograd or torch.compile trace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernelbay_engine.layers.activation import GatedMLP
from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.layers.norm import RMSNorm
from kernelbay_engine.layers.rotary import RotaryEmbedding
from kernelbay_engine.native import ops, tracked


@dataclass(frozen=True, slots=True, eq=False)
class NativeDecoderBlock:
    """The native arguments of one layer (its packed linears, norm weights, head counts) and what they came from."""

    linears: tuple[Linear, Linear, Linear, Linear]  # qkv, o, gate_up, down
    methods: tuple[object, object, object, object]  # their methods when built: a layer re-quantized since is not run
    input_norm: RMSNorm
    post_norm: RMSNorm
    in_args: tuple  # attention_in's arguments after x (and before cos, sin): the norm's weight first
    out_args: tuple  # attention_out_mlp's arguments after attn and x: o_proj's 5, then the norm's weight
    attention_in_op: Callable
    attention_out_mlp_op: Callable

    def runs(self, x: torch.Tensor, cos: torch.Tensor) -> bool:
        """Whether this step can take the native path (else the module path runs, with the same result)."""
        qkv, o, gate_up, down = self.linears
        m_qkv, m_o, m_gate_up, m_down = self.methods
        w_in, w_post = self.input_norm.weight, self.post_norm.weight
        return (
            x.dtype == torch.float32
            and x.dim() == 2
            and x.is_contiguous()
            and cos.dtype == torch.float32
            and qkv.method is m_qkv
            and o.method is m_o
            and gate_up.method is m_gate_up
            and down.method is m_down
            and w_in is self.in_args[0]  # the norms' weights are the ones the arguments hold
            and w_post is self.out_args[5]
            and not tracked(x, w_in, w_post)
        )

    def attention_in(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [T, heads, D], k and v [T, kv_heads, D] (q and k rotated) from the layer's input x [T, hidden]."""
        return self.attention_in_op(x, *self.in_args, cos, sin)

    def attention_out_mlp(self, attn: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The layer's output from the attention's [T, heads * D] and the layer's input x (the residual)."""
        return self.attention_out_mlp_op(attn, x, *self.out_args)


def native_block(
    qkv: Linear,
    o: Linear,
    mlp: GatedMLP,
    input_norm: RMSNorm,
    post_norm: RMSNorm,
    rotary: RotaryEmbedding,
    heads: int,
    kv_heads: int,
    head_dim: int,
) -> NativeDecoderBlock | None:
    """The native path of a pre-norm layer (x + attn(norm(x)), then + mlp(norm(x))), or None where it cannot run:
    native ops unavailable, a linear on neither int8_dot nor fdot or with a bias, a norm with a unit offset or not
    float32, a non-silu MLP, interleaved or partial RoPE, a linear sharded over ranks (`combine`)."""
    native = ops()
    linears = (qkv, o, mlp.gate_up_proj, mlp.down_proj)
    if native is None or mlp.act_fn is not F.silu:
        return None
    if any(getattr(layer.method, "native", None) is None or layer.has_bias or layer.combine for layer in linears):
        return None
    for norm in (input_norm, post_norm):
        if norm.unit_offset or norm.weight.dtype != torch.float32 or not norm.weight.is_contiguous():
            return None
    p = rotary.params
    if p.interleaved or p.rotary_dim != head_dim:
        return None
    methods = (qkv.method, o.method, mlp.gate_up_proj.method, mlp.down_proj.method)
    packed = [layer.method.native for layer in linears]  # type: ignore[union-attr]  # checked above
    in_args = (input_norm.weight, input_norm.eps, *packed[0], heads, kv_heads)
    out_args = (*packed[1], post_norm.weight, post_norm.eps, *packed[2], *packed[3])
    return NativeDecoderBlock(
        linears, methods, input_norm, post_norm, in_args, out_args, native.attention_in, native.attention_out_mlp
    )
