"""Every way a checkpoint folder can be wrong ends in a ConfigError that says what and where."""

from __future__ import annotations

import pytest

from kernelbay.errors import ConfigError
from kernelbay_engine.config import ModelConfig

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float32",
}


def tiny(**changes) -> dict:
    """The tiny Llama config with `changes`; another model_type brings transformers' class for it as architectures
    (as a real checkpoint of that family names it), unless the changes name one."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    data = dict(TINY_LLAMA)
    own_class = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(changes.get("model_type"))
    if own_class:
        data["architectures"] = [own_class]
    data.update(changes)
    return {k: v for k, v in data.items() if v is not DROP}


DROP = object()


def test_missing_folder(tmp_path):
    """A path that does not exist is named as such."""
    with pytest.raises(ConfigError, match="does not exist"):
        ModelConfig.from_pretrained(tmp_path / "nope")


def test_file_instead_of_folder(tmp_path):
    """Passing config.json itself asks for its folder."""
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="is a file, not a model folder"):
        ModelConfig.from_pretrained(tmp_path / "config.json")


def test_folder_without_config_json(tmp_path):
    """A folder without config.json lists what it holds instead."""
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"has no config.json \(it holds: model.safetensors\)"):
        ModelConfig.from_pretrained(tmp_path)


def test_malformed_json_reports_line_and_column(write_config):
    """A JSON syntax error is reported with its line and column."""
    folder = write_config('{\n  "model_type": "llama",\n  "hidden_size": 64,,\n}')
    with pytest.raises(ConfigError, match=r"not valid JSON: Expecting property name .* line 3, column 21"):
        ModelConfig.from_pretrained(folder)


def test_json_that_is_not_an_object(write_config):
    """A top-level array is rejected as such."""
    with pytest.raises(ConfigError, match="JSON object at the top level, not list"):
        ModelConfig.from_pretrained(write_config("[1, 2]"))


def test_missing_model_type(write_config):
    """Without model_type nothing can parse the config."""
    with pytest.raises(ConfigError, match="has no 'model_type'"):
        ModelConfig.from_pretrained(write_config(tiny(model_type=DROP)))


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"])
def test_missing_required_field(write_config, key):
    """A dropped core size is named, not replaced by the config class default."""
    with pytest.raises(ConfigError, match=f"(?s)required fields are missing.*- {key}"):
        ModelConfig.from_pretrained(write_config(tiny(**{key: DROP})))


def test_missing_intermediate_size(write_config):
    """LlamaConfig would default intermediate_size to 11008: kernelbay asks for it instead."""
    with pytest.raises(ConfigError, match=r"'intermediate_size' / 'ffn_dim'.* is missing"):
        ModelConfig.from_pretrained(write_config(tiny(intermediate_size=DROP)))


def test_unknown_model_type_without_auto_map(write_config):
    """A model_type nobody provides says what to install."""
    expected = "(?s)'acme_lm' is unknown to transformers.*no auto_map.*'kernelbay.configs' entry point"
    with pytest.raises(ConfigError, match=expected):
        ModelConfig.from_pretrained(write_config(tiny(model_type="acme_lm")))


def test_unknown_model_type_with_auto_map_needs_trust(write_config):
    """Folder code named by auto_map is not run without --trust-remote-code; the error says to pass it."""
    folder = write_config(tiny(model_type="acme_lm", auto_map={"AutoConfig": "configuration_acme.AcmeConfig"}))
    with pytest.raises(ConfigError, match=r"configuration_acme.AcmeConfig.*pass --trust-remote-code"):
        ModelConfig.from_pretrained(folder)


def test_known_model_type_never_runs_auto_map_code_untrusted(write_config):
    """A known model_type with auto_map parses with transformers' own class; the folder's code stays unrun."""
    folder = write_config(tiny(auto_map={"AutoConfig": "configuration_bomb.BombConfig"}))
    (folder / "configuration_bomb.py").write_text("raise RuntimeError('folder code ran')\n")
    cfg = ModelConfig.from_pretrained(folder)
    assert type(cfg.hf_config).__name__ == "LlamaConfig"


def test_trusted_remote_code_runs(write_config, monkeypatch, tmp_path):
    """With trust_remote_code=True the folder's config class is used."""
    from tests._remote_code import isolate_remote_code

    isolate_remote_code(monkeypatch, tmp_path / "hf_modules")
    folder = write_config(
        tiny(
            model_type="acme_lm",
            architectures=["AcmeForCausalLM"],
            auto_map={"AutoConfig": "configuration_acme.AcmeConfig"},
        )
    )
    (folder / "configuration_acme.py").write_text(
        "from transformers import PretrainedConfig\n\n\n"
        "class AcmeConfig(PretrainedConfig):\n    model_type = 'acme_lm'\n    ran = True\n"
    )
    cfg = ModelConfig.from_pretrained(folder, trust_remote_code=True)
    assert type(cfg.hf_config).__name__ == "AcmeConfig" and cfg.hf_config.ran
    assert (cfg.architecture, cfg.head_dim, cfg.num_key_value_heads) == ("AcmeForCausalLM", 16, 2)


@pytest.mark.parametrize("auto_map", [1, ["x"], {"AutoModelForCausalLM": 1}, {"AutoConfig": ""}])
def test_malformed_auto_map_is_a_config_error(write_config, auto_map):
    """An auto_map that is not Auto class -> "module.Class" is refused up front (the fallback would trip on it)."""
    with pytest.raises(ConfigError, match="auto_map must map Auto classes to code references"):
        ModelConfig.from_pretrained(write_config(tiny(auto_map=auto_map)))


def test_trusted_remote_code_missing_file(write_config):
    """Trusting code the folder does not contain fails as a ConfigError naming the file."""
    folder = write_config(tiny(auto_map={"AutoConfig": "configuration_gone.GoneConfig"}))
    with pytest.raises(ConfigError, match=r"configuration_gone.py"):
        ModelConfig.from_pretrained(folder, trust_remote_code=True)


def test_transformers_rejecting_a_value_is_a_config_error(write_config):
    """A value transformers' strict config refuses surfaces as a ConfigError, not its own exception."""
    with pytest.raises(ConfigError, match="transformers could not parse"):
        ModelConfig.from_pretrained(write_config(tiny(num_attention_heads="four")))


def test_head_dim_not_derivable(write_config):
    """hidden_size not divisible by heads, and no head_dim: say to add one."""
    folder = write_config(tiny(model_type="gpt2", num_attention_heads=5, num_key_value_heads=5))
    with pytest.raises(ConfigError, match="not divisible by num_attention_heads 5; add an explicit head_dim"):
        ModelConfig.from_pretrained(folder)


def test_kv_heads_must_divide_heads(write_config):
    """3 KV heads cannot serve 4 query heads."""
    with pytest.raises(ConfigError, match="num_key_value_heads=3 must divide num_attention_heads=4"):
        ModelConfig.from_pretrained(write_config(tiny(num_key_value_heads=3)))


def test_incomplete_mla(write_config):
    """kv_lora_rank without the head widths lists what is missing (DeepseekV3Config would default them)."""
    folder = write_config(tiny(model_type="deepseek_v3", kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8))
    with pytest.raises(ConfigError, match=r"MLA config .* lacks required fields\n  - qk_nope_head_dim\n  - v_head_dim"):
        ModelConfig.from_pretrained(folder)


def test_sliding_window_spellings_must_agree(write_config):
    """sliding_window and sliding_window_size with different values is an error, not a pick."""
    folder = write_config(tiny(model_type="mistral", sliding_window=64, sliding_window_size=128))
    with pytest.raises(ConfigError, match="sliding_window=64 and sliding_window_size=128 disagree"):
        ModelConfig.from_pretrained(folder)


def test_layer_types_of_wrong_length(write_config):
    """layer_types must cover every layer (transformers' validator or kernelbay's, whichever sees it first)."""
    with pytest.raises(ConfigError, match=r"layer_types"):
        ModelConfig.from_pretrained(write_config(tiny(layer_types=["full_attention"])))


def test_layer_types_with_unknown_kind(write_config):
    """An attention kind kernelbay does not know is listed with the known ones."""
    folder = write_config(tiny(layer_types=["full_attention", "linear_attention"]))
    with pytest.raises(ConfigError, match="kinds kernelbay does not know: linear_attention; known: full_attention"):
        ModelConfig.from_pretrained(folder)


def test_sliding_layers_need_a_window(write_config):
    """layer_types that slide without a sliding_window cannot be built."""
    folder = write_config(tiny(layer_types=["sliding_attention", "full_attention"]))
    with pytest.raises(ConfigError, match="sliding_window must be set exactly when a layer is sliding_attention"):
        ModelConfig.from_pretrained(folder)


def test_unknown_rope_type(write_config):
    """A RoPE type kernelbay does not implement is named with the known ones."""
    folder = write_config(tiny(rope_scaling={"rope_type": "spiral", "factor": 2.0}))
    with pytest.raises(ConfigError, match="rope_type 'spiral'"):
        ModelConfig.from_pretrained(folder)


def test_unknown_dtype(write_config):
    """torch_dtype must be a floating checkpoint dtype."""
    with pytest.raises(ConfigError, match=r"could not parse|torch_dtype: unknown dtype 'int3'; use one of: float32"):
        ModelConfig.from_pretrained(write_config(tiny(torch_dtype="int3")))


def test_unknown_kv_cache_dtype(write_config):
    """kv_bytes_per_token refuses a KV dtype it cannot size, listing the known ones."""
    cfg = ModelConfig.from_pretrained(write_config(tiny()))
    with pytest.raises(ConfigError, match=r"unknown KV-cache dtype 'fp3'; use one of: auto, .*fp8_e4m3"):
        cfg.kv_bytes_per_token("fp3")


def test_quantization_without_method(write_config):
    """A quantization_config that names no method and has nothing to infer it from is an error."""
    with pytest.raises(ConfigError, match=r"could not parse|no quant_method"):
        ModelConfig.from_pretrained(write_config(tiny(quantization_config={"bits": 4})))


def test_record_validates_itself():
    """The frozen record rejects an inconsistent hand-built instance with every problem listed."""
    with pytest.raises(ConfigError, match="num_key_value_heads=3 must divide num_attention_heads=4"):
        ModelConfig(
            architecture="X",
            architectures=("X",),
            model_type="llama",
            hidden_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=3,
            head_dim=16,
            vocab_size=10,
            intermediate_size=8,
            max_position_embeddings=8,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            dtype="float32",
            layer_types=("full_attention",),
            layer_num_kv_heads=(3,),
            position_embedding="learned",
            attention_scale=0.25,
            v_head_dim=16,
        )


def test_a_config_the_fallback_refuses_anyway_says_why(write_config):
    """An architecture transformers implements but kernelbay cannot resolve: the fallback's refusal alone, not the
    fields no family reads (a name nobody serves keeps the config error: test_family_rules)."""
    import transformers

    from kernelbay.errors import UnsupportedArchitecture

    data = transformers.BartConfig(d_model=64, vocab_size=96).to_dict() | {"architectures": ["BartForCausalLM"]}
    with pytest.raises(UnsupportedArchitecture, match=r"encoder-decoder") as err:
        ModelConfig.from_pretrained(write_config(data))
    assert "num_hidden_layers" not in str(err.value)
