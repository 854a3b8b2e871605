"""`kernelbay explain` serves the real GPT-family configs with their heads, KV heads, head_dim and KV cache; the
positional kind (not in explain's JSON schema) is checked on the `ModelConfig` explain reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelbay.cli import main
from kernelbay_engine.config import ModelConfig

CONFIGS = Path(__file__).resolve().parents[3] / "tests" / "data" / "configs"
# folder -> (provider module, heads, KV heads, head_dim, position embedding, rotary dims or None, KV bytes/token)
REAL = {
    "gpt2": ("kernelbay_gpt.gpt2", 12, 12, 64, "learned", None, 12 * 2 * 12 * 64 * 4),
    "gpt2-medium": ("kernelbay_gpt.gpt2", 16, 16, 64, "learned", None, 24 * 2 * 16 * 64 * 4),
    "opt-125m": ("kernelbay_gpt.opt", 12, 12, 64, "learned", None, 12 * 2 * 12 * 64 * 2),
    "opt-350m": ("kernelbay_gpt.opt", 16, 16, 64, "learned", None, 24 * 2 * 16 * 64 * 2),
    "redpajama-incite-3b-v1": ("kernelbay_gpt.neox", 32, 32, 80, "rope", 80, 32 * 2 * 32 * 80 * 2),
    "falcon-7b-legacy-rw": ("kernelbay_gpt.falcon", 71, 1, 64, "rope", 64, 32 * 2 * 1 * 64 * 2),
    "falcon-40b-instruct": ("kernelbay_gpt.falcon", 128, 8, 64, "rope", 64, 60 * 2 * 8 * 64 * 2),
}


@pytest.mark.parametrize("folder", sorted(REAL))
def test_explain_serves_the_real_config(folder, capsys):
    """The architecture resolves to kernelbay-gpt, with the geometry the published model has."""
    module, heads, kv_heads, head_dim, positions, rotary, kv_bytes = REAL[folder]
    assert main(["explain", str(CONFIGS / folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    config = doc["config"]
    assert doc["provider"]["module"] == module
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (
        heads,
        kv_heads,
        head_dim,
    )
    assert doc["kv_cache"]["bytes_per_token"] == kv_bytes
    resolved = ModelConfig.from_pretrained(CONFIGS / folder)
    assert resolved.position_embedding == positions
    assert (resolved.rope.rotary_dim if resolved.rope else None) == rotary


def test_legacy_falcon_is_read_by_kernelbay_gpt(capsys):
    """Falcon-7B's RWForCausalLM / RefinedWebModel: parsed by kernelbay-gpt's config class, renamed by its rule."""
    assert main(["explain", str(CONFIGS / "falcon-7b-legacy-rw")]) == 0
    out = capsys.readouterr().out
    assert "legacy architecture RWForCausalLM resolves as FalconForCausalLM" in out
    assert "the 'RefinedWebModel' rule of kernelbay_gpt.config_rules (kernelbay-gpt" in out
