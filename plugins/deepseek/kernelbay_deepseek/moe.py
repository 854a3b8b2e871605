"""DeepSeek mixture of experts: a router, routed experts (stacked weights), always-on shared experts.

Routing (from the config):
- V2 `softmax` scores, `greedy` top-k or `group_limited_greedy` (best experts of the best groups);
- V3 `sigmoid` scores with `noaux_tc`: groups ranked by the sum of their top-2 biased scores, experts
  chosen by biased score (`e_score_correction_bias`), weighted by their unbiased score, optionally
  renormalised (`norm_topk_prob`); both scaled by `routed_scaling_factor`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kernelbay.errors import ConfigError
from kernelbay_engine.layers import ExpertLinear, GatedMLP, activation

ROUTINGS = {("softmax", "greedy"), ("softmax", "group_limited_greedy"), ("sigmoid", "noaux_tc")}


@dataclass(frozen=True, slots=True)
class Routing:
    """How tokens pick experts; checked against the combinations DeepSeek checkpoints use."""

    num_experts: int
    top_k: int
    scoring: str = "softmax"
    method: str = "greedy"
    num_groups: int = 1
    top_groups: int = 1
    normalize: bool = False
    scaling: float = 1.0

    def __post_init__(self):
        if (self.scoring, self.method) not in ROUTINGS:
            raise ConfigError(
                f"MoE routing scoring_func={self.scoring!r} with topk_method={self.method!r} is not "
                f"supported; supported: {sorted(ROUTINGS)}"
            )
        if not 0 < self.top_k <= self.num_experts:
            raise ConfigError(f"num_experts_per_tok must be in 1..{self.num_experts}, got {self.top_k}")
        if self.num_experts % self.num_groups or not 0 < self.top_groups <= self.num_groups:
            raise ConfigError(
                f"n_group={self.num_groups} must divide n_routed_experts={self.num_experts} and "
                f"topk_group={self.top_groups} must be in 1..n_group"
            )

    @classmethod
    def from_config(cls, hf, default: tuple[str, str]) -> Routing:
        """`default`: (scoring, method) when config.json leaves them out (transformers' V3 config does)."""
        return cls(
            num_experts=hf.n_routed_experts,
            top_k=hf.num_experts_per_tok,
            scoring=getattr(hf, "scoring_func", None) or default[0],
            method=getattr(hf, "topk_method", None) or default[1],
            num_groups=getattr(hf, "n_group", None) or 1,
            top_groups=getattr(hf, "topk_group", None) or 1,
            normalize=bool(getattr(hf, "norm_topk_prob", False)),
            scaling=float(getattr(hf, "routed_scaling_factor", None) or 1.0),
        )


def _group_mask(scores: torch.Tensor, r: Routing, group_score) -> torch.Tensor:
    """[T, E] bool: experts in the `top_groups` best groups of each token."""
    grouped = scores.view(-1, r.num_groups, r.num_experts // r.num_groups)
    best = torch.topk(group_score(grouped), k=r.top_groups, dim=-1, sorted=False)[1]
    mask = torch.zeros(grouped.shape[:2], dtype=torch.bool, device=scores.device).scatter_(1, best, True)
    return mask.unsqueeze(-1).expand_as(grouped).reshape(-1, r.num_experts)


class Router(nn.Module):
    """weight: [num_experts, hidden] (float32, like the reference); e_score_correction_bias: [num_experts] (V3)."""

    def __init__(self, hidden_size: int, routing: Routing):
        super().__init__()
        self.routing = routing
        self.weight = nn.Parameter(
            torch.empty(routing.num_experts, hidden_size, dtype=torch.float32), requires_grad=False
        )
        if routing.method == "noaux_tc":
            self.e_score_correction_bias = nn.Parameter(
                torch.empty(routing.num_experts, dtype=torch.float32), requires_grad=False
            )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (weights [T, top_k] float32, expert ids [T, top_k])."""
        r = self.routing
        logits = F.linear(x.float(), self.weight.float())
        if r.method == "noaux_tc":
            weights, ids = self._noaux_tc(logits.sigmoid())
        else:
            weights, ids = self._softmax_topk(logits.softmax(dim=-1, dtype=torch.float32))
        return weights * r.scaling, ids

    def _softmax_topk(self, scores: torch.Tensor):
        r = self.routing
        if r.method == "group_limited_greedy":
            scores = scores.masked_fill(~_group_mask(scores, r, lambda g: g.max(dim=-1).values), 0.0)
        return torch.topk(scores, k=r.top_k, dim=-1, sorted=False)

    def _noaux_tc(self, scores: torch.Tensor):
        r = self.routing
        biased = scores + self.e_score_correction_bias
        mask = _group_mask(biased, r, lambda g: g.topk(2, dim=-1)[0].sum(dim=-1))
        ids = torch.topk(biased.masked_fill(~mask, float("-inf")), k=r.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
        if r.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights, ids


class Experts(nn.Module):
    """Routed experts, weights stacked: gate_up_proj [E, 2I, hidden], down_proj [E, hidden, I].

    Loads per-expert checkpoint tensors `experts.<e>.{gate,up,down}_proj.*` into their slice.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, act: str):
        super().__init__()
        self.gate_up_proj = ExpertLinear(
            hidden_size, {"gate_proj": intermediate_size, "up_proj": intermediate_size}, num_experts=num_experts
        )
        self.down_proj = ExpertLinear(intermediate_size, {"down_proj": hidden_size}, num_experts=num_experts)
        self.act_fn = activation(act)

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [T, hidden], weights/ids [T, top_k] -> [T, hidden]; loops over the experts that got tokens."""
        out = torch.zeros_like(x)
        for expert in ids.unique().tolist():
            token, slot = torch.where(ids == expert)
            gate, up = self.gate_up_proj.split(F.linear(x[token], self.gate_up_proj.expert_weight(expert).to(x.dtype)))
            y = F.linear(self.act_fn(gate) * up, self.down_proj.expert_weight(expert).to(x.dtype))
            out.index_add_(0, token, (y * weights[token, slot, None]).to(x.dtype))
        return out


class MoE(nn.Module):
    """Routed experts plus shared experts (one wider MLP), summed."""

    def __init__(self, config, default_routing: tuple[str, str]):
        super().__init__()
        hf = config.hf_config
        act = getattr(hf, "hidden_act", "silu")
        routing = Routing.from_config(hf, default_routing)
        self.gate = Router(config.hidden_size, routing)
        self.experts = Experts(config.hidden_size, hf.moe_intermediate_size, routing.num_experts, act)
        shared = getattr(hf, "n_shared_experts", None) or 0
        self.shared_experts = GatedMLP(config.hidden_size, hf.moe_intermediate_size * shared, act) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        out = self.experts(x, weights, ids)
        return out + self.shared_experts(x) if self.shared_experts is not None else out
