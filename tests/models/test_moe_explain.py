"""`kernelbay explain` on every MoE config in tests/data/configs: experts, top-k, active parameters, the MoE kernel,
and the native family that serves it."""

from __future__ import annotations

import json

import pytest

from kernelbay.errors import ConfigError
from kernelbay_engine.explain import explain_model
from tests._paths import REAL_CONFIGS as CONFIGS

PATTERNS = ("mixtral*", "qwen1.5-moe*", "qwen3-*a3b*", "qwen3-235b*", "deepseek*", "gpt-oss*")
MOE_CONFIGS = sorted({p.name for pattern in PATTERNS for p in CONFIGS.glob(pattern) if (p / "config.json").exists()})
EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")
# Copies written without `q_lora_rank` on purpose: the config cannot say how queries are projected.
REFUSED = {"deepseek-v2-lite-chat": "'q_lora_rank' is missing", "deepseek-coder-v2-lite-instruct": "'q_lora_rank'"}


def test_the_folders_cover_every_moe_family():
    assert len(MOE_CONFIGS) >= 15 and {"qwen3-30b-a3b-fp8", "qwen3-235b-a22b-fp8", "mixtral-8x7b-v0.1"} <= set(
        MOE_CONFIGS
    )


@pytest.mark.parametrize("name", MOE_CONFIGS)
def test_explain_gives_experts_top_k_active_parameters_and_a_kernel(name):
    from kernelbay.registry import names

    raw = json.loads((CONFIGS / name / "config.json").read_text())
    if raw["architectures"][0] not in names("model"):
        pytest.skip(f"{raw['architectures'][0]} has no native kernelbay family installed")
    if name in REFUSED:
        with pytest.raises(ConfigError, match=REFUSED[name]):
            explain_model(CONFIGS / name)
        return
    doc = explain_model(CONFIGS / name)
    moe, params = doc["moe"], doc["config"]["parameters"]
    assert moe["num_experts"] == next(raw[k] for k in EXPERTS if k in raw)
    assert moe["top_k"] == raw["num_experts_per_tok"]
    assert 0 < params["active_per_token"] < params["total"]
    assert moe["runnable"] and moe["error"] is None
    assert moe["backend"] in {"TORCH_GROUPED_MOE", "TORCH_MOE"}
    assert [c["name"] for c in moe["candidates"] if c["chosen"]] == [moe["backend"]]
    assert doc["provider"]["origin"] == "built-in" and doc["provider"]["distribution"] != "kernelbay-transformers"


@pytest.mark.parametrize("name", ["qwen3-30b-a3b-fp8", "qwen3-235b-a22b-fp8"])
def test_fp8_qwen3_moe_keeps_its_experts_fp8_block(name):
    """The CPU kernels declare fp8_block: the experts are read as stored (dequantized once in prepare_weights)."""
    moe = explain_model(CONFIGS / name)["moe"]
    assert (moe["stored_format"], moe["dequantized"], moe["requirements"]["expert_format"]) == (
        "fp8_block",
        False,
        "fp8_block",
    )


def test_kernelbay_explain_names_kernelbay_llama_for_qwen3_moe():
    """The native family wins over the transformers fallback, through the CLI as users run it."""
    from tests.cli.test_explain import explain_in_process

    code, out, _ = explain_in_process(str(CONFIGS / "qwen3-30b-a3b"), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["provider"]["module"] == "kernelbay_llama.moe" and doc["provider"]["displaced"] == []
