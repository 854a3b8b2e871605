"""The MoE vocabularies (torch-free: config resolution reads them)."""

from __future__ import annotations

ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "swigluoai")
"""Gated activations, act(gate) * up; "swigluoai" is GPT-OSS's clamped SwiGLU, (up + 1) * gate * sigmoid(a * gate)."""
EXPERT_FORMATS = ("dense", "fp8_block", "mxfp4")
"""How expert weights are stored (not to be confused with a checkpoint's weight format, the `kernelbay.weight_formats`
slot): plain floats; FP8-e4m3 with 2-D block scales; MXFP4 (4-bit e2m1, a uint8 e8m0
exponent per 32 values) as GPT-OSS checkpoints ship it."""
ROUTINGS = ("softmax_topk", "grouped_topk", "noaux_tc")
"""How ids/weights were chosen: softmax then top-k (optionally renormalised; Mixtral, Qwen-MoE, GPT-OSS), DeepSeek-V2's
group-limited greedy, DeepSeek-V3's sigmoid `noaux_tc`. Routing runs before the kernel; a kernel that fuses it declares
the kinds it implements."""
_ACTIVATION_ALIASES = {"swiglu": "silu", "gelu_new": "gelu_pytorch_tanh"}


def canonical_activation(name: str) -> str:
    text = _ACTIVATION_ALIASES.get(str(name), str(name))
    if text not in ACTIVATIONS:
        raise ValueError(f"unknown MoE activation {name!r}; kernelbay knows: {', '.join(ACTIVATIONS)}")
    return text
