"""Bad config values are one ConfigError naming the field (or MalformedConfig for what is not JSON),
never a traceback, an out-of-memory or a silently accepted value; explain and run read them alike."""

from __future__ import annotations

import json

import pytest

from kernelbay.errors import ConfigError, MalformedConfig
from kernelbay_engine.config import ModelConfig
from tests._paths import REPO

DEMO = REPO / "plugins" / "engine" / "kernelbay_engine" / "demo"


@pytest.fixture
def demo_with(write_config):
    """`demo_with(**changes)` -> a folder with the demo (Llama) config.json changed; "DROP" removes a key."""

    def make(text: str | None = None, **changes):
        data = json.loads((DEMO / "config.json").read_text())
        data.update(changes)
        data = {k: v for k, v in data.items() if v != "DROP"}
        return write_config(text if text is not None else json.dumps(data, allow_nan=True))

    return make


def _error(folder, cls=ConfigError) -> str:
    with pytest.raises(cls) as info:
        ModelConfig.from_pretrained(folder)
    return str(info.value)


@pytest.mark.parametrize("layers", [0, -1])
def test_layer_count_below_one_names_the_field(demo_with, layers):
    """num_hidden_layers 0 or -1 is a ConfigError naming it (0 used to fail in max() of an empty sequence)."""
    assert "num_hidden_layers" in _error(demo_with(num_hidden_layers=layers))


@pytest.mark.parametrize("layers", [10**9, 2**62])
def test_absurd_layer_count_is_refused_before_anything_is_built(demo_with, layers):
    """A billion layers is refused up front with the cap named, instead of running out of memory."""
    message = _error(demo_with(num_hidden_layers=layers))
    assert "num_hidden_layers" in message and "4096" in message


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size", "intermediate_size", "max_position_embeddings"])
def test_sizes_beyond_int32_are_refused(demo_with, field):
    """A size of 2**40 is named as too large rather than accepted (it was, for hidden_size and vocab_size)."""
    assert field in _error(demo_with(**{field: 2**40}))


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_are_malformed_naming_the_key(demo_with, literal):
    """NaN/Infinity (not JSON) and overflowing floats are MalformedConfig (exit 5) naming the key, even nested."""
    text = json.dumps(json.loads((DEMO / "config.json").read_text()))[:-1] + f', "rms_norm_eps": {literal}}}'
    assert "rms_norm_eps" in _error(demo_with(text=text), MalformedConfig)
    nested = '{"model_type": "llama", "rope_parameters": {"rope_theta": ' + literal + "}}"
    assert "rope_parameters.rope_theta" in _error(demo_with(text=nested), MalformedConfig)


@pytest.mark.parametrize("digits", [20, 5000])
def test_integers_beyond_64_bits_are_malformed(demo_with, digits):
    """A 20-digit or 5000-digit integer literal is MalformedConfig, not Python's int-conversion ValueError."""
    text = json.dumps(json.loads((DEMO / "config.json").read_text()))[:-1] + f', "vocab_size": {"9" * digits}}}'
    assert "64 bits" in _error(demo_with(text=text), MalformedConfig)


def test_deep_nesting_is_malformed_not_recursion_error(demo_with):
    """100000 nested lists are MalformedConfig, not a RecursionError; 100 levels are refused as too deep too."""
    for depth in (100000, 100):
        text = '{"model_type": "llama", "x": ' + "[" * depth + "]" * depth + "}"
        assert "deep" in _error(demo_with(text=text), MalformedConfig)


@pytest.mark.parametrize("eps", [0, -1e-5, 1.5])
def test_norm_epsilon_out_of_range_is_refused(demo_with, eps):
    """rms_norm_eps must lie in (0, 1)."""
    assert "rms_norm_eps" in _error(demo_with(rms_norm_eps=eps))


@pytest.mark.parametrize("factor", ["x", -2.0, 0, 0.5, [2]])
def test_bad_rope_factor_names_the_field(demo_with, factor):
    """A string, list, negative or shrinking rope factor is a ConfigError naming rope_scaling.factor."""
    rope = {"rope_theta": 10000.0, "rope_type": "linear", "factor": factor}
    assert "factor" in _error(demo_with(rope_parameters=rope))


@pytest.mark.parametrize("theta", [0, -1.0, "big"])
def test_bad_rope_theta_names_the_field(demo_with, theta):
    """rope_theta must be a positive finite number."""
    assert "rope_theta" in _error(demo_with(rope_parameters={"rope_theta": theta, "rope_type": "default"}))


def test_negative_sliding_window_is_refused(write_config):
    """sliding_window=-5 on a sliding-window family is an error (0 and null still mean no window)."""
    data = json.loads((DEMO / "config.json").read_text())
    data.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=-5)
    data.pop("head_dim")
    assert "sliding_window" in _error(write_config(data))


def test_chunk_size_is_ignored_with_a_note_by_a_class_without_chunked_attention(demo_with):
    """LlamaConfig has no chunked attention: attention_chunk_size is ignored with a note, as `run` builds it."""
    config = ModelConfig.from_pretrained(demo_with(attention_chunk_size=7))
    assert "chunked_attention" not in config.layer_types and config.attention_chunk_size is None
    assert any("attention_chunk_size=7 ignored" in note for note in config.notes)


def test_negative_chunk_size_is_refused(demo_with):
    """attention_chunk_size=-3 is a ConfigError naming it."""
    assert "attention_chunk_size" in _error(demo_with(attention_chunk_size=-3))


def test_non_positive_softcap_is_refused(demo_with):
    """A logit soft-cap of 0 would divide by zero: it must be positive or null."""
    assert "final_logit_softcapping" in _error(demo_with(final_logit_softcapping=0))
