"""Mixture-of-experts kernels: what an MoE layer computes, the `MoEBackend` protocol and its selection
(DESIGN.md, "Kernels beyond attention"); backends come through the `kernelbay.moe_backends` entry points."""

from ..attention._capabilities import MOE_BACKEND_ENV
from ._backend import MoEBackend, MoEContractError, MoERequirements, select_moe_backend
from ._geometry import (
    ExpertWeights,
    MoEGeometry,
    dense_weights,
    dequantize_fp8_blocks,
    dequantize_mxfp4,
    gated_activation,
)
from ._names import ACTIVATIONS, ROUTINGS, WEIGHT_FORMATS, canonical_activation

__all__ = [
    "ACTIVATIONS",
    "ExpertWeights",
    "MOE_BACKEND_ENV",
    "MoEBackend",
    "MoEContractError",
    "MoEGeometry",
    "MoERequirements",
    "ROUTINGS",
    "WEIGHT_FORMATS",
    "dense_weights",
    "dequantize_fp8_blocks",
    "dequantize_mxfp4",
    "canonical_activation",
    "gated_activation",
    "select_moe_backend",
]
