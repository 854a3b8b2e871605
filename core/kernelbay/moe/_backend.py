"""The MoEBackend protocol: geometry-only construction, capability declarations, `forward(x, ids, weights)`."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, replace
from typing import ClassVar

import torch

from ..attention._capabilities import _Any, capability_failures, check_declarations
from ..dtypes import MODEL_DTYPES, normalize_dtype
from ..errors import KernelbayError
from ._geometry import ExpertWeights, MoEGeometry
from ._names import ACTIVATIONS, ROUTINGS, WEIGHT_FORMATS, canonical_activation


class MoEContractError(KernelbayError, RuntimeError):
    """An MoE backend answered outside the contract (wrong output shape or dtype)."""


@dataclass(frozen=True, slots=True)
class MoERequirements:
    """What the MoE layers of a model need from a kernel (hashable: selection is cached)."""

    dtype: str = "bfloat16"
    activation: str = "silu"
    routing: str = "softmax_topk"
    bias: bool = False  # expert biases (GPT-OSS)
    weight_format: str = "dense"
    platform: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        object.__setattr__(self, "activation", canonical_activation(self.activation))
        if self.routing not in ROUTINGS:
            raise ValueError(f"unknown MoE routing {self.routing!r}; kernelbay knows: {', '.join(ROUTINGS)}")
        if self.weight_format not in WEIGHT_FORMATS:
            raise ValueError(f"unknown expert weight format {self.weight_format!r}; use one of {WEIGHT_FORMATS}")

    @classmethod
    def from_geometry(cls, geometry: MoEGeometry, dtype: str = "bfloat16", routing: str = "softmax_topk", **kw):
        return cls(dtype, geometry.activation, routing, geometry.has_bias, geometry.weight_format, **kw)

    def with_platform(self, platform: str) -> MoERequirements:
        return replace(self, platform=platform)

    def describe(self) -> str:
        extras = [self.routing] + (["bias"] if self.bias else []) + [f"weights={self.weight_format}"]
        return f"MoE layers ({self.activation}, {self.dtype}, {', '.join(extras)})"

    def to_dict(self) -> dict:
        return asdict(self)


# As attention's table: requirement field, declaration, and for a boolean feature what its failure says.
_CHECKS = (
    ("activation", "activations", None),
    ("routing", "routings", None),
    ("weight_format", "weight_formats", None),
    ("bias", "bias", "an expert bias"),
    ("dtype", "dtypes", None),
    ("platform", "platforms", None),
)
_GEOMETRY = frozenset({"activation", "weight_format", "bias"})
_VOCABULARIES = {
    "activations": ACTIVATIONS,
    "routings": ROUTINGS,
    "weight_formats": WEIGHT_FORMATS,
    "dtypes": MODEL_DTYPES,
}


class MoEBackend:
    """Subclass, declare capabilities as class attributes, implement `_experts`.

    Declarations are conservative: what a backend does not declare it does not get (no dtype, no
    platform, no activation by default; `ANY` from kernelbay.attention declares an open set)."""

    name: ClassVar[str] = ""
    dtypes: ClassVar[Collection[str] | _Any] = frozenset()
    activations: ClassVar[Collection[str] | _Any] = frozenset()
    routings: ClassVar[Collection[str] | _Any] = frozenset()
    weight_formats: ClassVar[Collection[str] | _Any] = frozenset({"dense"})
    platforms: ClassVar[Collection[str] | _Any] = frozenset()
    bias: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        check_declarations(cls, _CHECKS, _VOCABULARIES, "MoE backend")

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        return True, "available"

    @classmethod
    def capability_failures(cls, req: MoERequirements, fields: Collection[str] | None = None) -> list[str]:
        """Every capability `req` needs that this backend does not declare, one line each (empty: capable)."""
        return capability_failures(cls, req, fields, _CHECKS)

    def __init__(self, geometry: MoEGeometry, quant_config=None):
        if not isinstance(geometry, MoEGeometry):
            raise TypeError(f"{type(self).__name__} is built from a MoEGeometry, got {type(geometry).__name__}")
        failures = type(self).capability_failures(MoERequirements.from_geometry(geometry), fields=_GEOMETRY)
        if failures:
            raise ValueError(
                f"MoE backend {self.name} cannot build these MoE layers: {'; '.join(failures)}. Pick a capable "
                f"one (see `kernelbay explain`) instead of silently computing something else"
            )
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
        ok = isinstance(out, torch.Tensor) and out.shape == hidden_states.shape and out.dtype == hidden_states.dtype
        if not ok:
            got = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise MoEContractError(
                f"MoE backend {self.name} ({type(self).__module__}) broke the forward contract: _experts must return "
                f"a {hidden_states.dtype} tensor {list(hidden_states.shape)}, got {got}"
            )
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
