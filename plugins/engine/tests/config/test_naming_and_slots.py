"""Which slot a config resolves to (model, EAGLE-3 draft, vision encoder) and the kernelbay.configs slot."""

from __future__ import annotations

import json

import pytest
from transformers import DeepseekV3Config, LlavaConfig, PretrainedConfig, SiglipVisionConfig

from kernelbay.attention import LayerKind
from kernelbay.errors import ConfigError
from kernelbay.registry import default_registry, register_config, reset_registry
from kernelbay_engine.config import ModelConfig, draft_architecture
from tests._paths import REAL_CONFIGS as SHARED_CONFIGS

from .test_errors import DROP, tiny

ENCODER = LayerKind.ENCODER


class AcmeLmConfig(PretrainedConfig):
    """A plugin's config class for a model_type transformers does not know."""

    model_type = "acme_lm"


class PluginKimiConfig(DeepseekV3Config):
    """A plugin's own class for kimi_k2: it must win over kernelbay's built-in one."""

    model_type = "kimi_k2"


class NotAConfig:
    """What a broken plugin might register in the config slot."""


@pytest.fixture
def fresh_registry():
    previous = default_registry()
    reset_registry()
    yield
    reset_registry(previous)


# ---- drafts --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "written, renamed",
    [
        ("LlamaForCausalLMEagle3", "EAGLE3LlamaForCausalLM"),  # SpecForge / SGLang
        ("Eagle3LlamaForCausalLM", "EAGLE3LlamaForCausalLM"),  # vLLM
        ("LlamaForCausalLM", "EAGLE3LlamaForCausalLM"),  # a plain name plus draft_vocab_size
        ("Qwen3ForCausalLMEagle", "EAGLE3Qwen3ForCausalLM"),
    ],
)
def test_draft_architecture_names(written, renamed):
    """Every EAGLE spelling becomes EAGLE3<TargetArch>."""
    assert draft_architecture(written) == renamed


@pytest.mark.parametrize("name", sorted(p.name for p in SHARED_CONFIGS.glob("eagle3-draft-*")))
def test_shared_eagle3_drafts(name):
    """Every SpecForge draft: draft_model slot, EAGLE3LlamaForCausalLM, one layer, draft vocab 32000."""
    cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / name)
    assert (cfg.model_kind, cfg.is_draft, cfg.architecture) == ("draft_model", True, "EAGLE3LlamaForCausalLM")
    assert (cfg.num_hidden_layers, cfg.draft_vocab_size) == (1, 32000)


def test_non_draft_is_a_model(write_config):
    """Without draft_vocab_size the architecture is architectures[0], slot kind model."""
    cfg = ModelConfig.from_pretrained(write_config(tiny()))
    assert (cfg.architecture, cfg.model_kind, cfg.is_draft, cfg.draft_vocab_size) == (
        "LlamaForCausalLM",
        "model",
        False,
        None,
    )


def test_missing_architectures_falls_back_to_transformers_causal_lm(write_config):
    """No architectures: transformers' causal-LM class for the model_type, with a note."""
    cfg = ModelConfig.from_pretrained(write_config(tiny(architectures=DROP)))
    assert cfg.architecture == "LlamaForCausalLM" and any("no architectures" in n for n in cfg.notes)


def test_bad_architectures(write_config):
    """architectures must be a list of class names."""
    with pytest.raises(ConfigError, match=r"could not parse|architectures must be a list"):
        ModelConfig.from_pretrained(write_config(tiny(architectures="LlamaForCausalLM")))


# ---- encoder-only ------------------------------------------------------------------------------
def test_standalone_vision_tower_is_encoder_only(tmp_path):
    """A SigLIP vision tower resolves the vision-encoder slot: no KV cache, one position per patch."""
    SiglipVisionConfig(architectures=["SiglipVisionModel"], torch_dtype="bfloat16").save_pretrained(tmp_path)
    cfg = ModelConfig.from_pretrained(tmp_path)
    assert (cfg.model_kind, cfg.is_encoder_only, cfg.architecture) == ("vision_encoder", True, "SiglipVisionModel")
    assert set(cfg.layer_types) == {ENCODER} and cfg.kv_bytes_per_token() == 0
    assert (cfg.head_dim, cfg.max_position_embeddings, cfg.vocab_size) == (768 // 12, (224 // 16) ** 2, 0)


def test_vlm_decoder_geometry_comes_from_text_config(tmp_path):
    """A Llava checkpoint runs as a language model with its text_config's geometry."""
    LlavaConfig(architectures=["LlavaForConditionalGeneration"], torch_dtype="float16").save_pretrained(tmp_path)
    cfg = ModelConfig.from_pretrained(tmp_path)
    assert (cfg.model_kind, cfg.hidden_size, cfg.head_dim, cfg.dtype) == ("model", 4096, 128, "float16")


def test_vlm_encoder_only_deployment(tmp_path):
    """encoder_only=True: the same checkpoint resolves its vision tower into the vision-encoder slot."""
    LlavaConfig(architectures=["LlavaForConditionalGeneration"], torch_dtype="float16").save_pretrained(tmp_path)
    cfg = ModelConfig.from_pretrained(tmp_path, encoder_only=True)
    assert (cfg.model_kind, cfg.architecture) == ("vision_encoder", "LlavaForConditionalGeneration")
    assert (cfg.hidden_size, cfg.head_dim, cfg.dtype, cfg.kv_bytes_per_token()) == (1024, 64, "float16", 0)


# ---- the kernelbay.configs slot ----------------------------------------------------------------
def test_plugin_config_class_resolves_unknown_model_type(write_config, fresh_registry):
    """A model_type transformers does not know is parsed by the class a plugin registered for it."""
    register_config("acme_lm", target=AcmeLmConfig)
    cfg = ModelConfig.from_pretrained(write_config(tiny(model_type="acme_lm", architectures=["AcmeForCausalLM"])))
    assert type(cfg.hf_config) is AcmeLmConfig and cfg.head_dim == 16


def test_plugin_wins_over_builtin_config_class(fresh_registry):
    """Built-in config classes only fill an empty slot: a plugin's kimi_k2 class takes it."""
    register_config("kimi_k2", target=PluginKimiConfig)
    cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / "kimi-k2-instruct")
    assert type(cfg.hf_config) is PluginKimiConfig


def test_slot_holding_a_non_config_is_reported(write_config, fresh_registry):
    """A plugin that registers something other than a PretrainedConfig is named as broken."""
    register_config("acme_lm", target=NotAConfig)
    with pytest.raises(ConfigError, match="not a transformers PretrainedConfig subclass; fix the plugin"):
        ModelConfig.from_pretrained(write_config(tiny(model_type="acme_lm")))


def test_unknown_model_type_lists_what_is_known(write_config, fresh_registry):
    """The error lists the model types kernelbay.configs can provide (built-ins and plugins)."""
    register_config("acme_lm", target=AcmeLmConfig)
    with pytest.raises(ConfigError, match=r"kernelbay.configs knows: RefinedWebModel, acme_lm, kimi_k2"):
        ModelConfig.from_pretrained(write_config(tiny(model_type="zeta_lm")))


# ---- explain --json ------------------------------------------------------------------------------
def test_to_dict_is_json_safe_and_complete():
    """to_dict() round-trips through JSON and carries groups, MLA, RoPE, quantization and KV bytes."""
    cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / "deepseek-v3")
    summary = json.loads(json.dumps(cfg.to_dict()))
    assert summary["layer_groups"] == [{"kind": "full_attention", "layers": list(range(61))}]
    assert summary["mla"]["cache_width"] == 576 and summary["rope"]["scaling"]["factor"] == 40
    assert summary["quantization"]["weight_block_size"] == [128, 128]
    assert summary["kv_bytes_per_token"] == 61 * 576 * 2
