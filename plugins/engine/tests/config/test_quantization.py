"""quantization_config in its real shapes (FP8 block/per-tensor, ModelOpt, compressed-tensors) parsed as written."""

from __future__ import annotations

import json

import pytest

from kernelbay.errors import ConfigError
from kernelbay_engine.config import ModelConfig

from .test_errors import tiny


def quant(write_config, quantization_config) -> object:
    return ModelConfig.from_pretrained(write_config(tiny(quantization_config=quantization_config))).quantization


def test_no_quantization(write_config):
    """A plain checkpoint has quantization None."""
    assert quant(write_config, None) is None


def test_fp8_per_tensor_dynamic(write_config):
    """transformers' fp8 without weight_block_size: per-tensor scales, e4m3 by default."""
    q = quant(write_config, {"quant_method": "fp8", "activation_scheme": "dynamic"})
    assert (q.quant_method, q.element_type, q.weight_block_size, q.weight_granularity, q.activation_scheme) == (
        "fp8",
        "e4m3",
        None,
        "tensor",
        "dynamic",
    )


def test_compressed_tensors_channel_fp8(write_config):
    """compressed-tensors: format, strategy, dynamic flag and ignore list come from its config group."""
    q = quant(
        write_config,
        {
            "quant_method": "compressed-tensors",
            "ignore": ["lm_head"],
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False},
                    "input_activations": {"num_bits": 8, "type": "float", "dynamic": True},
                }
            },
            "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"},
        },
    )
    assert (q.quant_method, q.element_type, q.weight_granularity, q.activation_scheme) == (
        "compressed-tensors",
        "e4m3",
        "channel",
        "dynamic",
    )
    assert q.modules_to_not_convert == ("lm_head",) and q.kv_cache_dtype == "fp8_e4m3"


def test_compressed_tensors_block_structure_string(write_config):
    """compressed-tensors writes block sizes as "128x128"."""
    q = quant(
        write_config,
        {
            "quant_method": "compressed-tensors",
            "config_groups": {
                "g": {"weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": "128x128"}}
            },
        },
    )
    assert (q.weight_block_size, q.weight_granularity) == ((128, 128), "block")


def test_unsupported_method_is_recorded_not_judged(write_config):
    """GPTQ is recorded as written (group size -> group granularity); loading decides what it supports."""
    q = quant(write_config, {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False})
    assert (q.quant_method, q.weight_granularity, q.raw["bits"]) == ("gptq", "group", 4)


def test_modelopt_hf_quant_config_file(write_config):
    """A ModelOpt checkpoint whose quantization lives in hf_quant_config.json next to config.json."""
    folder = write_config(tiny())
    (folder / "hf_quant_config.json").write_text(
        json.dumps(
            {
                "producer": {"name": "modelopt", "version": "0.19.0"},
                "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]},
            }
        )
    )
    q = ModelConfig.from_pretrained(folder).quantization
    assert (q.quant_method, q.element_type, q.kv_cache_dtype, q.modules_to_not_convert) == (
        "modelopt",
        "e4m3",
        "fp8_e4m3",
        ("lm_head",),
    )


def test_malformed_hf_quant_config_file(write_config):
    """A broken hf_quant_config.json is reported with line and column like config.json."""
    folder = write_config(tiny())
    (folder / "hf_quant_config.json").write_text('{"quantization": [}')
    with pytest.raises(ConfigError, match=r"hf_quant_config.json is not valid JSON: .* line 1, column 19"):
        ModelConfig.from_pretrained(folder)


def test_bad_block_size(write_config):
    """weight_block_size must be two positive integers."""
    with pytest.raises(ConfigError, match=r"could not parse|weight_block_size"):
        quant(write_config, {"quant_method": "fp8", "weight_block_size": [128]})
