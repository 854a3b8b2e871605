"""What one MoE layer group computes: the geometry record, the stacked expert weights, the activations.

This is the contract's meaning of an MoE layer; the conformance kit's reference, the engine and every
backend read it from here. For each token t and each of its top-k (expert e, weight w):

    gate, up = split(gate_up[e] @ x_t + gate_up_bias[e])      # gate rows first, then up rows
    out_t   += w * (down[e] @ act(gate, up) + down_bias[e])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .._deprecation import renamed_field
from ._names import EXPERT_FORMATS, canonical_activation


@dataclass(frozen=True, slots=True)
class MoEGeometry:
    """Geometry of the MoE layers of one group: what a backend is constructed from (nothing per step)."""

    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int  # one expert's FFN width I (gate_up has 2I rows)
    activation: str = "silu"
    gate_up_bias: bool = False
    down_bias: bool = False
    alpha: float | None = None  # swigluoai: sigmoid slope (GPT-OSS 1.702)
    limit: float | None = None  # swigluoai: clamp of gate (above) and up (both sides)
    expert_format: str = "dense"  # how the expert weights are stored: one of EXPERT_FORMATS
    block_size: tuple[int, int] | None = None  # fp8_block: (rows, cols) of one scale block

    def __post_init__(self):
        object.__setattr__(self, "activation", canonical_activation(self.activation))
        problems = [
            f"{name} must be a positive int, got {getattr(self, name)!r}"
            for name in ("num_experts", "top_k", "hidden_size", "intermediate_size")
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1
        ]
        if not problems and self.top_k > self.num_experts:
            problems.append(f"top_k {self.top_k} exceeds num_experts {self.num_experts}")
        if self.expert_format not in EXPERT_FORMATS:
            problems.append(f"expert_format {self.expert_format!r} is not one of {', '.join(EXPERT_FORMATS)}")
        if (self.expert_format == "fp8_block") != (self.block_size is not None):
            problems.append("block_size is given exactly when expert_format is 'fp8_block'")
        if self.activation == "swigluoai" and (self.alpha is None or self.limit is None):
            problems.append("the swigluoai activation needs alpha and limit (config swiglu_alpha / swiglu_limit)")
        if problems:
            raise ValueError("invalid MoE geometry: " + "; ".join(problems))

    @property
    def has_bias(self) -> bool:
        return self.gate_up_bias or self.down_bias


renamed_field(MoEGeometry, "weight_format", "expert_format")


@dataclass(frozen=True, slots=True)
class ExpertWeights:
    """The stacked weights of one MoE layer, in the format `MoEGeometry.expert_format` names.

    dense:     gate_up [E, 2I, H], down [E, H, I] (float);
    fp8_block: the same shapes in float8_e4m3fn, gate_up_scale [E, ceil(2I/bn), ceil(H/bk)], down_scale likewise;
    mxfp4:     gate_up [E, 2I, H/32, 16] uint8 (two e2m1 values per byte, low nibble first), gate_up_scale
               [E, 2I, H/32] uint8 (e8m0 exponents, bias 127); down [E, H, I/32, 16], down_scale [E, H, I/32].
    Biases (when declared by the geometry): gate_up_bias [E, 2I], down_bias [E, H], float.
    """

    gate_up: torch.Tensor
    down: torch.Tensor
    gate_up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None
    gate_up_scale: torch.Tensor | None = None
    down_scale: torch.Tensor | None = None


def gated_activation(geometry: MoEGeometry, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """act(gate, up) [*, I] for the geometry's activation."""
    act = geometry.activation
    if act == "silu":
        return F.silu(gate) * up
    if act == "gelu":
        return F.gelu(gate) * up
    if act == "gelu_pytorch_tanh":
        return F.gelu(gate, approximate="tanh") * up
    limit, alpha = float(geometry.limit or 0.0), float(geometry.alpha or 0.0)
    gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    return (up + 1) * gate * torch.sigmoid(gate * alpha)


_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """[..., G, 16] uint8 e2m1 pairs + [..., G] uint8 e8m0 exponents -> [..., G * 32] floats."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise ValueError(
            f"MXFP4 blocks [..., G, 16] and scales [..., G] disagree: {tuple(blocks.shape)} vs {tuple(scales.shape)}"
        )
    lut = torch.tensor(_E2M1, dtype=torch.float32, device=blocks.device)
    values = torch.stack((lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]), dim=-1).flatten(-2)
    exponent = torch.exp2(scales.to(torch.float32) - 127.0).unsqueeze(-1)
    return (values * exponent).flatten(-2).to(dtype)


def dequantize_fp8_blocks(
    weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], dtype=torch.float32
) -> torch.Tensor:
    """weight [*, out, in] fp8, scale [*, ceil(out/bn), ceil(in/bk)] -> `dtype` [*, out, in]: each scale covers
    one bn x bk block (the checkpoints' convention); the one home of FP8 block dequantisation."""
    rows, cols = block
    full = scale.repeat_interleave(rows, dim=-2)[..., : weight.shape[-2], :]
    full = full.repeat_interleave(cols, dim=-1)[..., : weight.shape[-1]]
    return (weight.to(torch.float32) * full.to(torch.float32)).to(dtype)


def dense_weights(geometry: MoEGeometry, weights: ExpertWeights, dtype=torch.float32) -> ExpertWeights:
    """The same weights as plain floats (what a kernel without the stored format, or the reference, computes with)."""
    if geometry.expert_format == "dense":
        gate_up, down = weights.gate_up.to(dtype), weights.down.to(dtype)
    elif weights.gate_up_scale is None or weights.down_scale is None:
        raise ValueError(f"{geometry.expert_format} expert weights need gate_up_scale and down_scale")
    elif geometry.expert_format == "fp8_block":
        assert geometry.block_size is not None  # checked by MoEGeometry
        gate_up = dequantize_fp8_blocks(weights.gate_up, weights.gate_up_scale, geometry.block_size, dtype)
        down = dequantize_fp8_blocks(weights.down, weights.down_scale, geometry.block_size, dtype)
    else:
        gate_up = dequantize_mxfp4(weights.gate_up, weights.gate_up_scale, dtype)
        down = dequantize_mxfp4(weights.down, weights.down_scale, dtype)
    return ExpertWeights(gate_up, down, weights.gate_up_bias, weights.down_bias)
