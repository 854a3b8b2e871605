"""Mixture-of-experts kernels: what an MoE layer computes, the `MoEBackend` protocol and its selection
(DESIGN.md, "Kernels beyond attention"); backends come through the `kernelbay.moe_backends` entry points."""

from ._backend import (
    MoEBackend,
    MoEContractError,
    MoERequirements,
    select_moe_backend,
    select_moe_for_model,
    stored_expert_format,
)
from ._geometry import ExpertWeights, MoEGeometry, dense_weights, dequantize_mxfp4, gated_activation
from ._names import ACTIVATIONS, ROUTINGS, WEIGHT_FORMATS

__all__ = [
    "ACTIVATIONS",
    "ExpertWeights",
    "MoEBackend",
    "MoEContractError",
    "MoEGeometry",
    "MoERequirements",
    "ROUTINGS",
    "WEIGHT_FORMATS",
    "dense_weights",
    "dequantize_mxfp4",
    "gated_activation",
    "select_moe_backend",
    "select_moe_for_model",
    "stored_expert_format",
]
