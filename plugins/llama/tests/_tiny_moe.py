"""kernelbay-llama's tiny MoE configs (passed to `loaded(name, tiny)`): several experts, top-k >= 2, a shared expert
for Qwen2-MoE, dense layers between MoE ones via mlp_only_layers."""

from __future__ import annotations

import transformers

from tests.models._tiny import COMMON, Tiny


def _mixtral() -> transformers.MixtralConfig:
    """Every layer MoE (4 experts, top-2), and a sliding window shorter than the longest prompt."""
    return transformers.MixtralConfig(
        **{**COMMON, "intermediate_size": 32}, num_local_experts=4, num_experts_per_tok=2, sliding_window=5
    )


def _qwen2_moe() -> transformers.Qwen2MoeConfig:
    """Layer 1 dense (mlp_only_layers), a gated shared expert wider than the routed ones, weights not renormalised."""
    return transformers.Qwen2MoeConfig(
        **COMMON,
        num_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=40,
        mlp_only_layers=[1],
        norm_topk_prob=False,
    )


def _qwen2_moe_sparse_step() -> transformers.Qwen2MoeConfig:
    """decoder_sparse_step=2: only every second layer (1, 3) is MoE; weights renormalised."""
    return transformers.Qwen2MoeConfig(
        **{**COMMON, "num_hidden_layers": 4},
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
        shared_expert_intermediate_size=32,
        decoder_sparse_step=2,
        norm_topk_prob=True,
    )


def _qwen3_moe() -> transformers.Qwen3MoeConfig:
    """Qwen3-30B-A3B's structure scaled down: q/k norm, head_dim independent of hidden/heads, top-3 of 8
    renormalised, the last layer dense."""
    return transformers.Qwen3MoeConfig(
        **COMMON,
        head_dim=24,
        num_experts=8,
        num_experts_per_tok=3,
        moe_intermediate_size=16,
        mlp_only_layers=[2],
        norm_topk_prob=True,
    )


TINY_MOE: dict[str, Tiny] = {
    "mixtral": Tiny("mixtral-8x7b-v0.1", _mixtral),
    "qwen2_moe": Tiny("qwen1.5-moe-a2.7b", _qwen2_moe),
    "qwen2_moe_sparse_step": Tiny("qwen1.5-moe-a2.7b (decoder_sparse_step=2)", _qwen2_moe_sparse_step),
    "qwen3_moe": Tiny("qwen3-30b-a3b", _qwen3_moe),
}
