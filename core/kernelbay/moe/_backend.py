"""The MoEBackend protocol (geometry-only construction, capability declarations, `forward(x, ids, weights)`)
and its selection: the attention selector's machinery (one cache, a reason per candidate) for MoE kernels."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import ClassVar

import torch

from .._deprecation import renamed_declaration, renamed_field
from ..attention._capabilities import Check, Kernel, KernelContractError, Requirements, _Any
from ..attention._selector import SelectionResult, select_for_layer_groups
from ..dtypes import MODEL_DTYPES, normalize_dtype
from ._geometry import ExpertWeights, MoEGeometry
from ._names import ACTIVATIONS, EXPERT_FORMATS, ROUTINGS, canonical_activation


class MoEContractError(KernelContractError):
    """An MoE backend answered outside the contract (wrong output shape or dtype)."""


@dataclass(frozen=True, slots=True)
class MoERequirements(Requirements):
    """What the MoE layers of a model need from a kernel (hashable: selection is cached)."""

    dtype: str = "bfloat16"
    activation: str = "silu"
    routing: str = "softmax_topk"
    bias: bool = False  # expert biases (GPT-OSS)
    expert_format: str = "dense"  # how the expert weights are stored: one of EXPERT_FORMATS
    platform: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        object.__setattr__(self, "activation", canonical_activation(self.activation))
        if self.routing not in ROUTINGS:
            raise ValueError(f"unknown MoE routing {self.routing!r}; kernelbay knows: {', '.join(ROUTINGS)}")
        if self.expert_format not in EXPERT_FORMATS:
            raise ValueError(f"unknown expert format {self.expert_format!r}; use one of {EXPERT_FORMATS}")

    @classmethod
    def from_geometry(cls, geometry: MoEGeometry, dtype: str = "bfloat16", routing: str = "softmax_topk", **kw):
        return cls(dtype, geometry.activation, routing, geometry.has_bias, geometry.expert_format, **kw)

    def describe(self) -> str:
        extras = [self.routing] + (["bias"] if self.bias else []) + [f"weights={self.expert_format}"]
        return f"MoE layers ({self.activation}, {self.dtype}, {', '.join(extras)})"


renamed_field(MoERequirements, "weight_format", "expert_format")


class MoEBackend(Kernel):
    """Subclass, declare capabilities as class attributes (conservative: no dtype, platform or activation by
    default; `ANY` from kernelbay.attention declares an open set), implement `_experts`."""

    SLOT = "moe_backend"
    CHECKS = (
        Check("activation", "activations", names=ACTIVATIONS),
        Check("routing", "routings", names=ROUTINGS),
        Check("expert_format", "expert_formats", names=EXPERT_FORMATS),
        Check("bias", "bias", "an expert bias"),
        Check("dtype", "dtypes", names=MODEL_DTYPES),
        Check("platform", "platforms"),
    )
    GEOMETRY = frozenset({"activation", "expert_format", "bias"})
    ContractError = MoEContractError
    dtypes: ClassVar[Collection[str] | _Any] = frozenset()
    activations: ClassVar[Collection[str] | _Any] = frozenset()
    routings: ClassVar[Collection[str] | _Any] = frozenset()
    expert_formats: ClassVar[Collection[str] | _Any] = frozenset({"dense"})
    platforms: ClassVar[Collection[str] | _Any] = frozenset()
    bias: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        renamed_declaration(cls, "weight_formats", "expert_formats")  # before the declarations are checked
        super().__init_subclass__(**kwargs)

    def __init__(self, geometry: MoEGeometry, quant_config=None):
        if not isinstance(geometry, MoEGeometry):
            raise TypeError(f"{type(self).__name__} is built from a MoEGeometry, got {type(geometry).__name__}")
        self._refuse(MoERequirements.from_geometry(geometry), "these MoE layers")
        self.geometry = geometry
        self.quant_config = quant_config

    def prepare_weights(self, weights: ExpertWeights) -> ExpertWeights:
        """Called once after loading: repack the weights for this kernel (default: as stored)."""
        return weights

    def forward(
        self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, weights: ExpertWeights
    ) -> torch.Tensor:
        """hidden_states [T, H], topk_ids [T, k] (int), topk_weights [T, k] (float) -> [T, H] in hidden's dtype."""
        self._check_inputs(hidden_states, topk_ids, topk_weights)
        out = self._experts(hidden_states, topk_ids, topk_weights, weights)
        self._check_output(out, hidden_states.shape, hidden_states.dtype, "_experts")
        return out

    def _check_inputs(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> None:
        g = self.geometry
        want = (x.shape[0], g.top_k) if x.dim() == 2 else None
        problems = []
        if x.dim() != 2 or x.shape[1] != g.hidden_size:
            problems.append(f"hidden_states must be [T, {g.hidden_size}], got {tuple(x.shape)}")
        if tuple(ids.shape) != want or ids.dtype.is_floating_point:
            problems.append(f"topk_ids must be an integer [T, {g.top_k}] tensor, got {ids.dtype} {tuple(ids.shape)}")
        if tuple(weights.shape) != want or not weights.dtype.is_floating_point:
            problems.append(f"topk_weights must be a float [T, {g.top_k}] tensor, got {tuple(weights.shape)}")
        if not problems and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= g.num_experts):
            problems.append(f"topk_ids must lie in 0..{g.num_experts - 1}")
        if problems:
            raise ValueError(f"MoE backend {self.name}: " + "; ".join(problems))

    def _experts(
        self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, weights: ExpertWeights
    ) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement _experts(hidden, ids, weights, experts)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(experts={self.geometry.num_experts}, top_k={self.geometry.top_k})"


def select_moe_backend(requirements: MoERequirements, requested: str | None = None, platform=None) -> SelectionResult:
    """The MoE kernel for a model's MoE layers on `platform` (default: the current one).

    Candidates: the platform's `moe_backend_priority()`, then every installed `kernelbay.moe_backends` entry.
    `requested` (or KERNELBAY_MOE_BACKEND) must be known and capable; there is no fallback."""
    return select_for_layer_groups({"moe": requirements}, requested, platform, "moe_backend").groups[0][1]
