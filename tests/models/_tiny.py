"""Tiny transformers configs with the structural features of real checkpoints in tests/data/configs/."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import transformers

COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
MLA = dict(
    num_key_value_heads=4,
    moe_intermediate_size=16,
    n_routed_experts=8,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=8,
)
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "beta_fast": 32,
    "beta_slow": 1,
}


@dataclass(frozen=True)
class Tiny:
    """A tiny config and the real checkpoint whose structure it reproduces."""

    mirrors: str
    build: Callable[[], transformers.PretrainedConfig]


def _phi3_longrope():
    half = 8  # one factor per rotated pair: head_dim 32 x partial_rotary_factor 0.5 = 16 rotary dims
    return transformers.Phi3Config(
        **{**COMMON, "num_attention_heads": 2, "num_key_value_heads": 2},
        partial_rotary_factor=0.5,
        sliding_window=7,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "original_max_position_embeddings": 64,
            "factor": 8.0,
            "short_factor": [1.0 + 0.1 * i for i in range(half)],
            "long_factor": [2.0 + 0.5 * i for i in range(half)],
        },
    )


# kernelbay-llama's architectures (plugins/llama/tests/test_parity.py)
TINY_LLAMA: dict[str, Tiny] = {
    "llama3": Tiny(
        "meta-llama-3.1-8b",
        lambda: transformers.LlamaConfig(
            **COMMON,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
    "llama2_bias": Tiny(
        "llama-2-7b-hf",
        lambda: transformers.LlamaConfig(**{**COMMON, "num_key_value_heads": 4}, attention_bias=True, mlp_bias=True),
    ),
    "mistral": Tiny("mistral-7b-v0.3", lambda: transformers.MistralConfig(**COMMON, sliding_window=5)),
    "qwen2": Tiny(
        "qwen2-0.5b",
        lambda: transformers.Qwen2Config(
            **COMMON, tie_word_embeddings=True, use_sliding_window=True, sliding_window=6, max_window_layers=1
        ),
    ),
    "qwen3": Tiny("qwen3-0.6b", lambda: transformers.Qwen3Config(**COMMON, head_dim=24, tie_word_embeddings=True)),
    "phi3": Tiny("phi-3.5-mini-instruct (partial rotary as phi-4-mini)", _phi3_longrope),
    "gemma2": Tiny(
        "gemma-2-2b",
        lambda: transformers.Gemma2Config(
            **COMMON,
            head_dim=24,
            sliding_window=5,
            query_pre_attn_scalar=20,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
        ),
    ),
}

# kernelbay-deepseek's (plugins/deepseek/tests/test_parity.py)
TINY_DEEPSEEK: dict[str, Tiny] = {
    "deepseek_v2_lite": Tiny(
        "deepseek-v2-lite-chat",
        lambda: transformers.DeepseekV2Config(
            **COMMON | MLA,
            q_lora_rank=None,
            n_shared_experts=2,
            topk_method="greedy",
            rope_parameters={**YARN, "mscale": 0.707, "mscale_all_dim": 0.707},
        ),
    ),
    "deepseek_v2_grouped": Tiny(
        "deepseek-coder-v2-instruct",
        lambda: transformers.DeepseekV2Config(
            **COMMON | MLA,
            q_lora_rank=24,
            n_shared_experts=1,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
        ),
    ),
    "deepseek_v3": Tiny(
        "deepseek-v3",
        lambda: transformers.DeepseekV3Config(
            **COMMON | MLA,
            q_lora_rank=24,
            n_shared_experts=1,
            n_group=4,
            topk_group=2,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            rope_parameters={**YARN, "mscale": 1.0, "mscale_all_dim": 1.0},
        ),
    ),
}

# Every family: what the tiny_checkpoints fixture (conftest.py) can build, and the engine's tests use.
TINY: dict[str, Tiny] = {**TINY_LLAMA, **TINY_DEEPSEEK}
