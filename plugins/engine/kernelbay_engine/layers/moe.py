"""The mixture-of-experts layer every family shares: router, stacked experts, shared expert, the chosen kernel.

Public interface:
- `Routing`: how tokens pick experts (scores `softmax` | `sigmoid`; method `greedy` | `group_limited_greedy` |
  `noaux_tc`; groups; renormalisation; scaling). `Routing.from_moe_config(config.moe)` reads the core's
  `MoEConfig`; `Routing.kind` is the core's routing name (`kernelbay.moe.ROUTINGS`).
- `Router`: weight [E, H] (optional bias [E]; `e_score_correction_bias` [E] under `noaux_tc`);
  `forward(x [T, H]) -> (topk_ids [T, k] int64, topk_weights [T, k] float32)`, already scaled.
- `Experts`: stacked weights in `kernelbay.moe.ExpertWeights` layout, gate_up_proj [E, 2I, H] (gate rows first) and
  down_proj [E, H, I] (`ExpertLinear`, optional biases). Loads per-expert checkpoint tensors
  `experts.<e>.<gate>.weight` / `<up>` / `<down>` (names per family: `gate_proj/up_proj/down_proj`, Mixtral's
  `w1/w3/w2`) and transformers' stacked `experts.gate_up_proj` / `experts.down_proj` through `STACKED_EXPERTS`
  (a `NameRules` rename the family adds). FP8 block-scaled checkpoints load as stored.
- `SparseMoE`: router + experts + an optional always-on shared expert (a `GatedMLP` under the family's name,
  optionally scaled by `sigmoid(shared_expert_gate(x))`, Qwen2-MoE); `forward(x [T, H]) -> [T, H]` calls the bound
  MoE backend's `forward(x, topk_ids, topk_weights, weights)`. `SparseMoE.from_config(config, layer_idx, names=...)`
  builds the layer `config.moe` puts there (None where the FFN is dense).
- `bind_moe_backends(model, requested=None)`: one kernel for the model's MoE layers, chosen by
  `kernelbay_engine.selection.select_moe` (a requested name, else KERNELBAY_MOE_BACKEND, else the platform's
  priority; unknown or incapable names are the selector's errors), built from each layer's geometry, with
  `prepare_weights` run once per layer. `AutoModelForCausalLM.from_pretrained` calls it after loading. A kernel
  that keeps the loaded tensors (TORCH_MOE on dense weights) can be switched by calling it again; one that repacks
  them (TORCH_GROUPED_MOE's oneDNN layout, any dequantization) holds the only copy, the loaded one is released, and
  switching needs a new load.
  `moe_layers(model)` lists the bound layers; `no_moe_layers(name, arch)` is the error for a kernel named for a
  dense model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from kernelbay.errors import ConfigError, KernelbayError
from kernelbay.moe import ExpertWeights, MoEBackend, MoEGeometry, dense_weights
from kernelbay_engine.failures import KernelRaised
from kernelbay_engine.layers.activation import GatedMLP
from kernelbay_engine.layers.linear import ExpertLinear, Linear

if TYPE_CHECKING:
    from kernelbay_engine.distributed.layers import ExpertParallel

ROUTING_METHODS = {("softmax", "greedy"), ("softmax", "group_limited_greedy"), ("sigmoid", "noaux_tc")}
_KINDS = {"greedy": "softmax_topk", "group_limited_greedy": "grouped_topk", "noaux_tc": "noaux_tc"}
_CORE_METHODS = {kind: method for method, kind in _KINDS.items()}
# transformers keeps experts stacked in memory and may save them so: `experts.gate_up_proj` has no `.weight`.
STACKED_EXPERTS = (r"^(.*\.experts\.(?:gate_up|down)_proj)$", r"\1.weight")
DEFAULT_NAMES = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class Routing:
    """How tokens pick experts; only the (scoring, method) pairs checkpoints use are accepted."""

    num_experts: int
    top_k: int
    scoring: str = "softmax"
    method: str = "greedy"
    num_groups: int = 1
    top_groups: int = 1
    normalize: bool = False  # renormalise the chosen weights to sum to 1 (Mixtral; norm_topk_prob)
    scaling: float = 1.0  # routed_scaling_factor

    def __post_init__(self):
        if (self.scoring, self.method) not in ROUTING_METHODS:
            raise ConfigError(
                f"MoE routing scoring_func={self.scoring!r} with topk_method={self.method!r} is not "
                f"supported; supported: {sorted(ROUTING_METHODS)}"
            )
        if not 0 < self.top_k <= self.num_experts:
            raise ConfigError(f"num_experts_per_tok must be in 1..{self.num_experts}, got {self.top_k}")
        if self.num_experts % self.num_groups or not 0 < self.top_groups <= self.num_groups:
            raise ConfigError(
                f"n_group={self.num_groups} must divide the {self.num_experts} experts and "
                f"topk_group={self.top_groups} must be in 1..n_group"
            )

    @classmethod
    def from_moe_config(cls, moe) -> Routing:
        """From the core's resolved `MoEConfig` (softmax scores unless the routing is `noaux_tc`)."""
        method = _CORE_METHODS[moe.routing]
        return cls(
            num_experts=moe.num_experts,
            top_k=moe.top_k,
            scoring="sigmoid" if method == "noaux_tc" else "softmax",
            method=method,
            num_groups=moe.num_groups,
            top_groups=moe.top_groups,
            normalize=moe.normalize,
            scaling=moe.scaling,
        )

    @property
    def kind(self) -> str:
        """The core's name for this routing (what MoE backends declare in `routings`)."""
        return _KINDS[self.method]


def _group_mask(scores: torch.Tensor, r: Routing, group_score) -> torch.Tensor:
    """[T, E] bool: experts in the `top_groups` best groups of each token."""
    grouped = scores.view(-1, r.num_groups, r.num_experts // r.num_groups)
    best = torch.topk(group_score(grouped), k=r.top_groups, dim=-1, sorted=False)[1]
    mask = torch.zeros(grouped.shape[:2], dtype=torch.bool, device=scores.device).scatter_(1, best, True)
    return mask.unsqueeze(-1).expand_as(grouped).reshape(-1, r.num_experts)


class Router(nn.Module):
    """Scores every expert, keeps the top-k. Logits are computed in the weight's dtype (DeepSeek keeps its router
    in float32, like its reference; the others in the model dtype, like transformers), scores in float32."""

    def __init__(self, hidden_size: int, routing: Routing, *, bias: bool = False, dtype: torch.dtype | None = None):
        super().__init__()
        self.routing = routing
        self.weight = nn.Parameter(torch.empty(routing.num_experts, hidden_size, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(routing.num_experts, dtype=dtype), requires_grad=False) if bias else None
        if routing.method == "noaux_tc":
            self.e_score_correction_bias = nn.Parameter(
                torch.empty(routing.num_experts, dtype=torch.float32), requires_grad=False
            )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (topk_ids [T, top_k] int64, topk_weights [T, top_k] float32)."""
        r = self.routing
        logits = F.linear(x.to(self.weight.dtype), self.weight, self.bias).float()
        if r.method == "noaux_tc":
            weights, ids = self._noaux_tc(logits.sigmoid())
        else:
            weights, ids = self._softmax_topk(logits.softmax(dim=-1))
        if r.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + (1e-20 if r.method == "noaux_tc" else 0.0))
        return ids, weights * r.scaling if r.scaling != 1.0 else weights

    def _softmax_topk(self, scores: torch.Tensor):
        r = self.routing
        if r.method == "group_limited_greedy":
            scores = scores.masked_fill(~_group_mask(scores, r, lambda g: g.max(dim=-1).values), 0.0)
        return torch.topk(scores, k=r.top_k, dim=-1)

    def _noaux_tc(self, scores: torch.Tensor):
        """Chosen by biased score within the best groups, weighted by the unbiased score."""
        r = self.routing
        biased = scores + self.e_score_correction_bias
        mask = _group_mask(biased, r, lambda g: g.topk(2, dim=-1)[0].sum(dim=-1))
        ids = torch.topk(biased.masked_fill(~mask, float("-inf")), k=r.top_k, dim=-1)[1]
        return scores.gather(1, ids), ids


class Experts(nn.Module):
    """The routed experts' stacked weights (no forward of their own: the MoE backend computes them)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        *,
        bias: bool = False,
        names: tuple[str, str, str] = DEFAULT_NAMES,
    ):
        super().__init__()
        gate, up, down = names
        parts = {gate: intermediate_size, up: intermediate_size}
        self.gate_up_proj = ExpertLinear(hidden_size, parts, num_experts=num_experts, bias=bias)
        self.down_proj = ExpertLinear(intermediate_size, {down: hidden_size}, num_experts=num_experts, bias=bias)
        self.released_by: str | None = None

    def release(self, backend: str) -> None:
        """Drop the loaded weight tensors (not the biases) once a kernel holds its own repacked copy."""
        for layer in (self.gate_up_proj, self.down_proj):
            for name in ("weight", "weight_scale_inv"):
                if hasattr(layer, name):
                    delattr(layer, name)
        self.released_by = backend

    def stored_format(self) -> tuple[str, tuple[int, int] | None]:
        """("fp8_block", block) when the weights were created FP8 block-scaled, else ("dense", None)."""
        block = getattr(self.gate_up_proj.method, "block_size", None)
        return ("fp8_block", tuple(block)) if block is not None else ("dense", None)

    def expert_weights(self) -> ExpertWeights:
        """The loaded tensors themselves (no copy), in `ExpertWeights` layout."""
        if self.released_by is not None:
            raise ConfigError(
                f"the expert weights were repacked by the MoE backend {self.released_by} and their loaded copy "
                f"released (weights are held once); load the model again with moe_backend=NAME to use another kernel"
            )
        gu, down = self.gate_up_proj, self.down_proj
        return ExpertWeights(
            gu.weight,
            down.weight,
            gu.bias if gu.has_bias else None,
            down.bias if down.has_bias else None,
            getattr(gu, "weight_scale_inv", None),
            getattr(down, "weight_scale_inv", None),
        )


class SparseMoE(nn.Module):
    """Routed experts through the bound MoE backend, plus the shared expert when the family has one.

    geometry: the dense geometry of the routed experts (`config.moe.geometry(hidden)`); `shared_name`: the
    checkpoint's name of the shared expert (`shared_expert` Qwen2-MoE, `shared_experts` DeepSeek)."""

    def __init__(
        self,
        geometry: MoEGeometry,
        routing: Routing,
        *,
        names: tuple[str, str, str] = DEFAULT_NAMES,
        router_bias: bool = False,
        router_dtype: torch.dtype | None = None,
        shared_size: int = 0,
        shared_name: str = "shared_expert",
        shared_gate: bool = False,
        shared_activation: str = "silu",
    ):
        super().__init__()
        if (geometry.num_experts, geometry.top_k) != (routing.num_experts, routing.top_k):
            raise ValueError(f"routing {routing} disagrees with the expert geometry {geometry}")
        self.geometry = geometry
        self.gate = Router(geometry.hidden_size, routing, bias=router_bias, dtype=router_dtype)
        self.experts = Experts(
            geometry.hidden_size, geometry.intermediate_size, geometry.num_experts, bias=geometry.has_bias, names=names
        )
        self.shared_name = shared_name if shared_size else None
        if shared_size:
            self.add_module(shared_name, GatedMLP(geometry.hidden_size, shared_size, shared_activation))
        self.shared_expert_gate = Linear(geometry.hidden_size, 1) if shared_size and shared_gate else None
        self.backend: MoEBackend | None = None
        self.prepared: ExpertWeights | None = None
        self.expert_parallel: ExpertParallel | None = None
        """Expert parallelism (`kernelbay_engine.distributed.layers.ExpertParallel`): this rank's experts and how
        the ranks sum them; None: every expert is here."""

    @classmethod
    def from_config(cls, config, layer_idx: int, *, names: tuple[str, str, str] = DEFAULT_NAMES) -> SparseMoE | None:
        """The MoE layer `config.moe` puts at `layer_idx` (None where that layer's FFN is dense): routing, shared
        expert and its gate as the core resolved them (Mixtral, Qwen2-MoE, Qwen3-MoE)."""
        moe = config.moe
        if moe is None or not moe.layers[layer_idx]:
            return None
        return cls(
            moe.geometry(config.hidden_size),
            Routing.from_moe_config(moe),
            names=names,
            router_bias=moe.router_bias,
            shared_size=moe.shared_intermediate_size,
            shared_gate=moe.shared_gate,
            shared_activation=moe.activation,
        )

    def bind(self, backend: MoEBackend, weights: ExpertWeights) -> None:
        """Use `backend` from now on, with `weights` its `prepare_weights` returned."""
        self.backend, self.prepared = backend, weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend is None or self.prepared is None:
            raise RuntimeError(
                "this MoE layer has no MoE backend bound: load models through AutoModelForCausalLM.from_pretrained, "
                "or call kernelbay_engine.layers.moe.bind_moe_backends(model) after load_weights"
            )
        ids, weights = self.gate(x)
        if self.expert_parallel is None:
            out = self._experts(x, ids, weights)
        else:  # this rank's experts on the tokens routed to them, summed over the ranks
            out = self.expert_parallel.combine(self._experts(x, *self.expert_parallel.localize(ids, weights)))
        if self.shared_name is not None:
            shared = getattr(self, self.shared_name)(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out

    def _experts(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The backend's forward; what it raises is named as its failure (the runner adds layer and step)."""
        assert self.backend is not None and self.prepared is not None  # checked by forward
        try:
            return self.backend.forward(x, ids, weights, self.prepared)
        except KernelbayError:
            raise
        except Exception as err:  # whatever a plugin's kernel raises is named as its failure
            raise KernelRaised("MoE", self.backend.name, self, err) from err


def no_moe_layers(requested: str, architecture: str) -> ConfigError:
    """Naming an MoE kernel for a dense model is a mistake worth saying (exit 8, like an incapable backend)."""
    from kernelbay.errors import IncapableBackend

    return IncapableBackend(
        f"moe_backend={requested!r} was given, but {architecture} has no MoE layers; leave it out for dense models"
    )


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a is b:
        return True
    if a.is_meta or b.is_meta:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def moe_layers(model: nn.Module) -> list[SparseMoE]:
    return [m for m in model.modules() if isinstance(m, SparseMoE)]


def bind_moe_backends(model: nn.Module, requested: str | None = None, platform=None, chosen=None):
    """Select one MoE kernel for `model`'s MoE layers (or take `chosen`, `selection.select_moe`'s answer for this
    very model: `LLM` selects once, before any weight is read) and bind it to each of them; returns the
    `SelectionResult` (None for a model without MoE layers, where naming a kernel is an error)."""
    from kernelbay.dtypes import dtype_name
    from kernelbay_engine.models.base import activation_dtype_device
    from kernelbay_engine.selection import select_moe

    layers = moe_layers(model)
    if not layers:
        if requested:
            raise no_moe_layers(requested, type(model).__name__)
        return None
    dtype = activation_dtype_device(model)[0]
    if chosen is None:
        chosen = select_moe(model.config, requested=requested, platform=platform, dtype=dtype_name(dtype))
    elif chosen[0].requirements.dtype != dtype_name(dtype):
        raise ValueError(
            f"the MoE selection was made for dtype {chosen[0].requirements.dtype}; this model runs "
            f"{dtype_name(dtype)}: select for it (or pass none)"
        )
    if chosen is None:
        raise ConfigError(
            f"{type(model).__name__} built MoE layers but its config resolved no mixture of experts (config.moe is "
            "None): the config's expert fields (num_experts / num_local_experts, num_experts_per_tok) are missing"
        )
    selection, dequantized = chosen
    backends: dict[MoEGeometry, MoEBackend] = {}  # one instance per distinct geometry
    for layer in layers:
        fmt, block = layer.experts.stored_format()
        geometry = replace(layer.geometry, expert_format=fmt, block_size=block)
        weights = loaded = layer.experts.expert_weights()
        if dequantized and fmt != "dense":  # no chosen kernel reads the stored format: dense floats, once
            weights, geometry = dense_weights(geometry, weights, dtype), layer.geometry
        if geometry not in backends:
            backends[geometry] = selection.backend_cls(geometry)
        backend = backends[geometry]
        with torch.inference_mode():
            prepared = backend.prepare_weights(weights)
        layer.bind(backend, prepared)
        if not (_same_storage(prepared.gate_up, loaded.gate_up) or _same_storage(prepared.down, loaded.down)):
            layer.experts.release(backend.name)  # the kernel holds its own copy: the loaded one goes
    model.moe_selection = selection
    return selection
