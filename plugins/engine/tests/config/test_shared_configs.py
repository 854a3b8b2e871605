"""Every real config in tests/data/configs resolves to a geometry or to a ConfigError naming what is missing."""

from __future__ import annotations

import json

import pytest

from kernelbay.attention import LayerKind
from kernelbay.errors import ConfigError
from kernelbay_engine.config import ModelConfig
from tests._paths import REAL_CONFIGS as SHARED_CONFIGS
from tests._paths import shared_config_dirs

FULL, SLIDING = LayerKind.FULL, LayerKind.SLIDING

# Copies that dropped a key whose absence would silently change the model: a clear error instead.
EXPECTED_ERRORS = {
    # The MLC / llm-engine copies drop `"q_lora_rank": null`; transformers would default it to 1536.
    "deepseek-v2-lite-chat": "'q_lora_rank' is missing",
    "deepseek-coder-v2-lite-instruct": "'q_lora_rank' is missing",
}

# Quirks of the copies (see tests/data/configs/SOURCES.md) and the answer kernelbay gives, as a note it records.
EXPECTED_NOTES = {
    "mistral-7b-v0.1": "sliding_window_size=4096 read as sliding_window",  # MLC renamed the key
    "falcon-7b-legacy-rw": "legacy architecture RWForCausalLM resolves as FalconForCausalLM",
    "qwen3-32b-fp8-static-pertensor": "no quant_method: modelopt inferred",  # ModelOpt export without it
    "gpt-oss-20b": "float32 assumed",  # the copy has no torch_dtype
    "gpt-oss-120b": "float32 assumed",
    "gpt2": "float32 assumed",  # GPT-2 really has none: fp32 weights
    "opt-125m": "LayerNorm's default 1e-05",  # OPT never writes its epsilon
    "ministral-8b-instruct-2410": "sliding_window=32768 >= max_position_embeddings=32768: full attention",
    "phi-3.5-mini-instruct": "sliding_window=262144 >= max_position_embeddings=131072: full attention",
    "phi-4-mini-instruct": "longrope factor = max_position_embeddings / original = 131072/4096",
}

# model_types transformers does not ship: parsed by kernelbay's built-in kernelbay.configs classes.
BUILTIN_CONFIG_CLASSES = {
    "falcon-7b-legacy-rw": "RefinedWebModelConfig",
    "kimi-k2-instruct": "KimiK2Config",
    "llama-3-3-nemotron-super-49b-v1": "NemotronNasConfig",
    "phi-3-small-8k-instruct": "Phi3SmallConfig",  # this copy also lost its auto_map
}


def test_shared_configs_are_present():
    """Every folder SOURCES.md lists is here (else the parametrized tests below would be empty)."""
    rows = (SHARED_CONFIGS / "SOURCES.md").read_text().splitlines()
    listed = {row.split("|")[1].strip() for row in rows if row.startswith("| ") and not row.startswith("| folder")}
    assert set(shared_config_dirs()) == listed and len(listed) == 74


@pytest.mark.parametrize("name", shared_config_dirs())
def test_folder_yields_geometry_or_named_error(name):
    """Each folder resolves, or fails with a ConfigError that names the missing key; nothing else escapes."""
    if name in EXPECTED_ERRORS:
        with pytest.raises(ConfigError, match=EXPECTED_ERRORS[name]):
            ModelConfig.from_pretrained(SHARED_CONFIGS / name)
        return
    cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / name)
    assert len(cfg.layer_types) == cfg.num_hidden_layers, name
    assert cfg.num_attention_heads % cfg.num_key_value_heads == 0, name
    assert cfg.kv_bytes_per_token() == sum(cfg.layer_kv_bytes_per_token()), name
    assert json.loads(json.dumps(cfg.to_dict()))["architecture"] == cfg.architecture, name


@pytest.mark.parametrize("name", sorted(EXPECTED_NOTES))
def test_quirk_is_resolved_with_a_note(name):
    """A copy's quirk gets the right answer and says how it got it."""
    cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / name)
    assert any(EXPECTED_NOTES[name] in note for note in cfg.notes), cfg.notes


@pytest.mark.parametrize("name", sorted(BUILTIN_CONFIG_CLASSES))
def test_model_types_unknown_to_transformers_use_builtin_classes(name):
    """Kimi K2, Nemotron-NAS, Phi-3-small and RefinedWebModel parse without running folder code."""
    cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / name)
    assert type(cfg.hf_config).__name__ == BUILTIN_CONFIG_CLASSES[name]


def test_fp8_named_folder_without_quantization_keys_is_not_guessed_quantized():
    """llama-3.1-70b-instruct-fp8's copy has no quantization_config: the folder name is not evidence."""
    cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / "llama-3.1-70b-instruct-fp8")
    assert cfg.quantization is None and cfg.dtype == "bfloat16"


def test_copy_without_rope_scaling_keeps_what_it_says():
    """deepseek-coder-v2-instruct's copy lost rope_scaling: nothing in the file says YaRN, so none is invented."""
    cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / "deepseek-coder-v2-instruct")
    assert cfg.rope.rope_type == "default" and cfg.rope.factor is None


def test_layer_kinds_agree_with_transformers():
    """Where transformers computes layer_types itself, kernelbay's own derivation matches it."""
    compared, disagreements = [], {}
    for name in shared_config_dirs():
        if name in EXPECTED_ERRORS:
            continue
        cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / name)
        theirs = getattr(cfg.hf_config, "layer_types", None)
        if theirs is None:
            continue
        window = getattr(cfg.hf_config, "sliding_window", None)
        beyond_context = window is not None and window >= cfg.max_position_embeddings
        expected = [FULL if (k == SLIDING and beyond_context) else k for k in theirs]
        compared.append(name)
        if list(cfg.layer_types) != expected:
            disagreements[name] = (cfg.layer_groups(), expected)
    assert not disagreements
    assert len(compared) >= 20, compared  # Gemma 2/3, Qwen2/3, gpt-oss, DeepSeek V3.2 at least


@pytest.mark.parametrize("name", [n for n in shared_config_dirs() if n not in EXPECTED_ERRORS])
def test_from_hf_config_agrees_with_from_pretrained(name):
    """The in-memory door gives the same geometry as reading the folder."""
    from_folder = ModelConfig.from_pretrained(SHARED_CONFIGS / name)
    in_memory = ModelConfig.from_hf_config(from_folder.hf_config)
    assert _geometry(in_memory) == _geometry(from_folder)


def _geometry(cfg: ModelConfig) -> dict:
    summary = cfg.to_dict()
    for key in ("notes", "source"):
        summary.pop(key)
    return summary


# The same checkpoint taken from two sources: keys dropped or added by a copy must not change the geometry.
SAME_CHECKPOINT = [
    ("mixtral-8x7b-v0.1", "mixtral-8x7b-v0.1-copy2"),  # copy2 lacks sliding_window, tie_word_embeddings
    ("mixtral-8x22b-v0.1", "mixtral-8x22b-v0.1-copy2"),
    ("phi-3-mini-4k-instruct", "phi-3-mini-4k-instruct-copy2"),  # copy2 lacks rope_scaling null, auto_map
    ("qwen2.5-3b", "qwen2.5-3b-copy2"),  # max_window_layers 70 vs 36, irrelevant with use_sliding_window off
    ("qwen3-8b", "qwen3-8b-copy2"),
    ("qwen3-32b", "qwen3-32b-copy2"),
    ("qwen3-30b-a3b", "qwen3-30b-a3b-copy2"),
    ("meta-llama-3.1-8b", "llama-3.1-8b"),
    ("deepseek-v3", "deepseek-r1"),  # R1 is V3's architecture
]


@pytest.mark.parametrize("first, second", SAME_CHECKPOINT)
def test_copies_of_one_checkpoint_agree(first, second):
    """Two sources of one checkpoint resolve to the same geometry."""
    a = ModelConfig.from_pretrained(SHARED_CONFIGS / first)
    b = ModelConfig.from_pretrained(SHARED_CONFIGS / second)
    assert _geometry(a) == _geometry(b)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_kv_bytes_are_the_backends_cache_spec(kv_cache_dtype):
    """The config prices each layer's KV cache with the same `KVCacheSpec` a backend builds from the layer's
    geometry (one home of the arithmetic), on every real config whose geometry a backend accepts."""
    from kernelbay.attention import AttentionBackend

    compared = 0
    for name in shared_config_dirs():
        try:
            cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / name)
        except ConfigError:
            continue
        for i in range(cfg.num_hidden_layers):
            spec = cfg.layer_kv_cache_spec(i, kv_cache_dtype)
            if spec is None:
                continue
            try:
                geometry = cfg.layer_geometry(i, scale=1.0)
            except ValueError:  # a geometry AttentionGeometry refuses: only the config can price it
                continue
            assert spec == AttentionBackend.get_kv_cache_spec(geometry, cfg.dtype, kv_cache_dtype, 16), name
            compared += 1
    assert compared > 1000
