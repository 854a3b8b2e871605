"""DeepSeek's mixture of experts on the engine's shared MoE layer (kernelbay_engine.layers.moe): what its
config.json says about routing, read into the shared `Routing`.

- V2 `softmax` scores, `greedy` top-k or `group_limited_greedy` (best experts of the best groups), never
  renormalised (transformers ignores `norm_topk_prob` there);
- V3 `sigmoid` scores with `noaux_tc`: groups ranked by the sum of their top-2 biased scores, experts chosen by
  biased score (`e_score_correction_bias`), weighted by their unbiased score, optionally renormalised
  (`norm_topk_prob`); both scaled by `routed_scaling_factor`. The router is kept in float32, like the reference.
"""

from __future__ import annotations

import torch

from kernelbay_engine.layers.moe import Routing, SparseMoE


def routing(hf, default: tuple[str, str]) -> Routing:
    """`default`: (scoring, method) when config.json leaves them out (transformers' V3 config does)."""
    method = getattr(hf, "topk_method", None) or default[1]
    return Routing(
        num_experts=hf.n_routed_experts,
        top_k=hf.num_experts_per_tok,
        scoring=getattr(hf, "scoring_func", None) or default[0],
        method=method,
        num_groups=getattr(hf, "n_group", None) or 1,
        top_groups=getattr(hf, "topk_group", None) or 1,
        normalize=method == "noaux_tc" and bool(getattr(hf, "norm_topk_prob", False)),
        scaling=float(getattr(hf, "routed_scaling_factor", None) or 1.0),
    )


def deepseek_moe(config, default_routing: tuple[str, str]) -> SparseMoE:
    """Routed experts plus the shared experts (one wider MLP, `shared_experts`), summed."""
    hf = config.hf_config
    act = getattr(hf, "hidden_act", "silu")
    shared = getattr(hf, "n_shared_experts", None) or 0
    return SparseMoE(
        config.moe.geometry(config.hidden_size),
        routing(hf, default_routing),
        router_dtype=torch.float32,
        shared_size=hf.moe_intermediate_size * shared,
        shared_name="shared_experts",
        shared_activation=act,
    )
