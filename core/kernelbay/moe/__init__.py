"""Mixture-of-experts kernels: the `MoEBackend` protocol and its selector (DESIGN.md, "Kernels beyond attention").

- meaning: `MoEGeometry` (construction), `ExpertWeights` (stacked weights), `gated_activation`,
  `dense_weights` / `dequantize_mxfp4` (stored formats as floats), `ACTIVATIONS`, `ROUTINGS`, `WEIGHT_FORMATS`;
- protocol: `MoEBackend` (declarations, `forward(hidden, topk_ids, topk_weights, weights)`), `MoEContractError`;
- selection: `MoERequirements`, `select_moe_backend`, `select_moe_for_model`, `stored_expert_format`,
  `MOE_BACKEND_ENV`.
Backends are found through the `kernelbay.moe_backends` entry-point group.
"""

from __future__ import annotations

from ..attention._selector import MOE_BACKEND_ENV
from ._backend import MoEBackend, MoEContractError, MoERequirements
from ._geometry import (
    ExpertWeights,
    MoEGeometry,
    dense_weights,
    dequantize_mxfp4,
    gated_activation,
)
from ._names import ACTIVATIONS, ROUTINGS, WEIGHT_FORMATS
from ._select import select_moe_backend, select_moe_for_model, stored_expert_format

__all__ = [
    "ACTIVATIONS",
    "MOE_BACKEND_ENV",
    "ROUTINGS",
    "WEIGHT_FORMATS",
    "ExpertWeights",
    "MoEBackend",
    "MoEContractError",
    "MoEGeometry",
    "MoERequirements",
    "dense_weights",
    "dequantize_mxfp4",
    "gated_activation",
    "select_moe_backend",
    "select_moe_for_model",
    "stored_expert_format",
]
