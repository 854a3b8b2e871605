"""Mixture-of-experts kernels: what an MoE layer computes, the `MoEBackend` protocol and its selection
(DESIGN.md, "Kernels beyond attention"); backends come through the `kernelbay.moe_backends` entry points."""

from .._deprecation import renamed_constants
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
from ._names import ACTIVATIONS, EXPERT_FORMATS, ROUTINGS, canonical_activation

__all__ = [
    "ACTIVATIONS",
    "EXPERT_FORMATS",
    "ExpertWeights",
    "MOE_BACKEND_ENV",
    "MoEBackend",
    "MoEContractError",
    "MoEGeometry",
    "MoERequirements",
    "ROUTINGS",
    "dense_weights",
    "dequantize_fp8_blocks",
    "dequantize_mxfp4",
    "canonical_activation",
    "gated_activation",
    "select_moe_backend",
]

__getattr__ = renamed_constants(__name__, {"WEIGHT_FORMATS": ("EXPERT_FORMATS", EXPERT_FORMATS)})
