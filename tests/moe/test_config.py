"""MoE geometry from the real configs in tests/data/configs: experts, top-k, widths, MoE layers, parameter counts."""

from __future__ import annotations

import pytest

from kernelbay.errors import ConfigError
from kernelbay_engine.config import ModelConfig
from tests._paths import REAL_CONFIGS as CONFIGS

# (folder, experts, top-k, expert width, MoE layers, shared width, routing, renormalised, activation,
#  published total / active parameters in billions)
REAL = [
    ("mixtral-8x7b-v0.1", 8, 2, 14336, 32, 0, "softmax_topk", True, "silu", 46.7, 12.9),
    ("mixtral-8x22b-v0.1", 8, 2, 16384, 56, 0, "softmax_topk", True, "silu", 141, 39),
    ("qwen1.5-moe-a2.7b", 60, 4, 1408, 24, 5632, "softmax_topk", False, "silu", 14.3, 2.7),
    ("qwen3-30b-a3b", 128, 8, 768, 48, 0, "softmax_topk", True, "silu", 30.5, 3.3),
    ("qwen3-235b-a22b", 128, 8, 1536, 94, 0, "softmax_topk", True, "silu", 235, 22),
    ("deepseek-v3", 256, 8, 2048, 58, 2048, "noaux_tc", True, "silu", 671, 37),
    ("gpt-oss-20b", 32, 4, 2880, 24, 0, "softmax_topk", True, "swigluoai", 20.9, None),
]


@pytest.mark.parametrize("case", REAL, ids=[c[0] for c in REAL])
def test_real_moe_configs_resolve_to_their_published_geometry(case):
    folder, experts, top_k, width, n_moe, shared, routing, normalize, act, total, active = case
    config = ModelConfig.from_pretrained(CONFIGS / folder)
    moe = config.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.num_moe_layers) == (experts, top_k, width, n_moe)
    assert (moe.shared_intermediate_size, moe.routing, moe.normalize, moe.activation) == (
        shared,
        routing,
        normalize,
        act,
    )
    counts = config.parameter_counts()
    assert counts["total"] / 1e9 == pytest.approx(total, rel=0.02)
    if active is not None:  # what the model card calls active; GPT-OSS's card does not count its 1.2B embeddings
        assert counts["active_per_token"] / 1e9 == pytest.approx(active, rel=0.05)


def test_dense_layers_between_moe_layers():
    """DeepSeek-V3's first three layers are dense; GPT-OSS's swiglu clamp and slope are read."""
    v3 = ModelConfig.from_pretrained(CONFIGS / "deepseek-v3").moe
    assert v3.layers[:4] == (False, False, False, True) and (v3.num_groups, v3.top_groups) == (8, 4)
    oss = ModelConfig.from_pretrained(CONFIGS / "gpt-oss-20b").moe
    assert (oss.alpha, oss.limit) == (1.702, 7.0)


def test_a_dense_model_has_no_moe_and_its_active_parameters_are_all_of_them():
    config = ModelConfig.from_pretrained(CONFIGS / "llama-3.1-8b")
    counts = config.parameter_counts()
    assert config.moe is None and counts["total"] == counts["active_per_token"]
    assert counts["total"] / 1e9 == pytest.approx(8.03, rel=0.01)


def _write(tmp_path, **fields):
    import json

    base = {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    }
    (tmp_path / "config.json").write_text(json.dumps({**base, **fields}))
    return tmp_path


def test_more_experts_per_token_than_experts_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"num_experts_per_tok=5 must be in 1..4"):
        ModelConfig.from_pretrained(_write(tmp_path, num_experts_per_tok=5))


def test_a_model_whose_every_layer_is_dense_is_a_config_error(tmp_path):
    """Qwen2-MoE with mlp_only_layers covering every layer: the config contradicts itself, said in words."""
    folder = _write(
        tmp_path, model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], num_experts=4, mlp_only_layers=[0, 1]
    )
    with pytest.raises(ConfigError, match="no layer is an MoE layer"):
        ModelConfig.from_pretrained(folder)
