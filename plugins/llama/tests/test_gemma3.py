"""Gemma 3 (text): parity with transformers on every capable backend, and what `kernelbay explain` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelbay.attention import LayerKind
from kernelbay.cli import main
from kernelbay.errors import ConfigError
from kernelbay_engine import AutoModelForCausalLM
from kernelbay_engine.config import ModelConfig
from plugins.llama.tests._tiny_gemma3 import TINY_GEMMA3
from tests.models._parity import BACKENDS, compare_generation, runner

FULL, SLIDING = LayerKind.FULL, LayerKind.SLIDING

GEMMA3_1B = Path(__file__).resolve().parents[3] / "tests" / "data" / "configs" / "gemma-3-1b-it"


@pytest.mark.parametrize("backend", BACKENDS)
def test_gemma3_logits_and_greedy_tokens_match_transformers(loaded, backend):
    """Mixed-length prefill past the window plus 8 decode steps: logits within 1e-4, same greedy tokens."""
    hf_model, model = loaded("gemma3", TINY_GEMMA3["gemma3"])
    compare_generation(hf_model, runner(model, backend), f"gemma3 {backend}")


def test_gemma3_layers_rotate_with_their_kind_of_rope(loaded):
    """Sliding layers get the local base unscaled; the global layer gets the main base with linear scaling."""
    _, model = loaded("gemma3", TINY_GEMMA3["gemma3"])
    layers = model.model.layers
    kinds = [model.config.layer_types[i] for i in range(len(layers))]
    assert kinds == [SLIDING] * 5 + [FULL] + [SLIDING] * 2
    local, main = layers[0].self_attn.rotary.params, layers[5].self_attn.rotary.params
    assert (local.theta, local.rope_type, dict(local.scaling)) == (100.0, "default", {})
    assert (main.theta, main.rope_type, main.get("factor")) == (50_000.0, "linear", 4.0)


def test_explain_reads_the_real_gemma3_1b_geometry(capsys):
    """gemma-3-1b-it: 4 heads, 1 KV head of 256, layers 5/11/17/23 global, 26 x 2 x 256 x 2 bytes of KV per token."""
    assert main(["explain", str(GEMMA3_1B), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    config = doc["config"]
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 1, 256)
    assert config["sliding_window"] == 512
    assert doc["provider"]["module"] == "kernelbay_llama.modeling"
    groups = {g["kind"]: g["layers"] for g in doc["attention"]["layer_groups"]}
    assert groups[FULL] == [5, 11, 17, 23]
    assert groups[SLIDING] == [i for i in range(26) if (i + 1) % 6]
    assert doc["kv_cache"]["bytes_per_token"] == 26 * 2 * 1 * 256 * 2


def _gemma3_folder(tmp_path: Path, **changes) -> Path:
    config = {**json.loads((GEMMA3_1B / "config.json").read_text()), **changes}
    config = {key: value for key, value in config.items() if value is not None}  # None: leave the key out
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_old_style_rope_scaling_leaves_sliding_layers_on_the_default_local_base(tmp_path):
    """gemma-3-4b's config.json spelling (top-level rope_scaling, no rope_local_base_freq): the scaling is the
    global layers', and sliding layers take Gemma3TextConfig's local base 10000, unscaled, as in transformers."""
    folder = _gemma3_folder(tmp_path, rope_scaling={"rope_type": "linear", "factor": 8.0}, rope_local_base_freq=None)
    rope = ModelConfig.from_pretrained(folder).rope
    assert (rope.theta, rope.rope_type, rope.factor, rope.local_theta) == (1e6, "linear", 8.0, 10_000.0)


def test_scaled_rope_on_sliding_layers_is_refused(tmp_path):
    """Sliding layers rotate with a plain base: a scaling written for them is an error naming where it belongs."""
    rope = {FULL: {"rope_type": "default", "rope_theta": 1e6}, SLIDING: {"rope_type": "linear", "factor": 8.0}}
    folder = _gemma3_folder(tmp_path, rope_parameters=rope)
    with pytest.raises(ConfigError, match=r"rope_parameters.sliding_attention has rope_type 'linear'.*full_attention"):
        ModelConfig.from_pretrained(folder)


def test_bidirectional_gemma3_is_refused_before_any_weight(tmp_path):
    """EmbeddingGemma's bidirectional attention is not a causal LM: refused by name, not run causally."""
    folder = _gemma3_folder(tmp_path, use_bidirectional_attention=True, num_hidden_layers=2, vocab_size=64)
    with pytest.raises(ConfigError, match="use_bidirectional_attention=true"):
        AutoModelForCausalLM.from_pretrained(folder, progress=False)
