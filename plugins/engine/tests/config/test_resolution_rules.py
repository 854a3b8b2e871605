"""Each resolution rule on a small synthetic config: KV heads, layer kinds, RoPE spellings, dtype, notes."""

from __future__ import annotations

import pytest

from kernelbay.attention import LayerKind
from kernelbay.errors import ConfigError
from kernelbay_engine.config import ModelConfig

from .test_errors import DROP, tiny

CHUNKED, FULL, NO_ATTENTION, SLIDING = LayerKind.CHUNKED, LayerKind.FULL, LayerKind.NO_ATTENTION, LayerKind.SLIDING


def resolve(write_config, **changes) -> ModelConfig:
    return ModelConfig.from_pretrained(write_config(tiny(**changes)))


# ---- KV heads ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "changes, kv",
    [
        ({"num_key_value_heads": DROP}, 4),  # absent: multi-head attention
        ({"num_key_value_heads": None}, 4),  # null: the same
        ({"num_key_value_heads": 1}, 1),
    ],
)
def test_kv_heads_spellings(write_config, changes, kv):
    """num_key_value_heads absent or null means MHA; a value is taken as is."""
    assert resolve(write_config, **changes).num_key_value_heads == kv


def test_falcon_kv_heads(write_config):
    """Falcon: multi_query -> 1 KV head, unless new_decoder_architecture, which uses num_kv_heads."""
    falcon = dict(
        model_type="falcon", architectures=["FalconForCausalLM"], num_key_value_heads=DROP, intermediate_size=DROP
    )
    assert resolve(write_config, multi_query=True, **falcon).num_key_value_heads == 1
    both = resolve(write_config, multi_query=True, new_decoder_architecture=True, num_kv_heads=2, **falcon)
    assert both.num_key_value_heads == 2 and both.intermediate_size == 4 * 64  # Falcon's 4 x hidden FFN
    assert resolve(write_config, multi_query=False, **falcon).num_key_value_heads == 4


def test_gpt_bigcode_multi_query(write_config):
    """GPT-BigCode's legacy multi_query flag means a single KV head."""
    cfg = resolve(
        write_config,
        model_type="gpt_bigcode",
        architectures=["GPTBigCodeForCausalLM"],
        multi_query=True,
        num_key_value_heads=DROP,
        intermediate_size=DROP,
    )
    assert (cfg.num_key_value_heads, cfg.position_embedding) == (1, "learned")


# ---- layer kinds ------------------------------------------------------------------------------
def test_qwen2_sliding_from_max_window_layers(write_config):
    """Qwen2 with use_sliding_window: layers from max_window_layers on slide (transformers' rule)."""
    cfg = resolve(
        write_config,
        model_type="qwen2",
        num_hidden_layers=4,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=2,
    )
    assert cfg.layer_types == (FULL, FULL, SLIDING, SLIDING) and cfg.sliding_window == 8
    assert list(cfg.layer_types) == cfg.hf_config.layer_types


def test_qwen2_sliding_off(write_config):
    """use_sliding_window false: a written sliding_window changes nothing."""
    cfg = resolve(write_config, model_type="qwen2", use_sliding_window=False, sliding_window=8)
    assert cfg.layer_types == (FULL, FULL) and cfg.sliding_window is None


def test_mistral_null_window_is_full_attention(write_config):
    """Mistral v0.3's sliding_window null: every layer is full attention."""
    cfg = resolve(write_config, model_type="mistral", sliding_window=None)
    assert cfg.layer_types == (FULL, FULL)


def test_mistral_missing_window_uses_the_class_default_and_says_so(write_config):
    """A Mistral config without sliding_window gets MistralConfig's default 4096, with a note."""
    cfg = resolve(write_config, model_type="mistral", max_position_embeddings=32768)
    assert cfg.sliding_window == 4096 and any("class default 4096" in n for n in cfg.notes)


def test_llama_ignores_sliding_window(write_config):
    """LlamaConfig has no sliding-window attention: a stray key is ignored with a note."""
    cfg = resolve(write_config, sliding_window=8)
    assert cfg.layer_types == (FULL, FULL) and any("sliding_window=8 ignored" in n for n in cfg.notes)


def test_gemma3_sliding_window_pattern(write_config):
    """sliding_window_pattern 3 over 6 layers: layers 2 and 5 are global."""
    cfg = resolve(
        write_config,
        model_type="gemma3_text",
        architectures=["Gemma3ForCausalLM"],
        num_hidden_layers=6,
        head_dim=16,
        sliding_window=8,
        sliding_window_pattern=3,
        num_key_value_heads=1,
    )
    assert cfg.layer_types == (SLIDING, SLIDING, FULL, SLIDING, SLIDING, FULL)
    assert list(cfg.layer_types) == cfg.hf_config.layer_types


def test_explicit_layer_types_win(write_config):
    """layer_types written in config.json are taken as they are."""
    cfg = resolve(
        write_config,
        model_type="gpt_oss",
        architectures=["GptOssForCausalLM"],
        head_dim=16,
        sliding_window=4,
        layer_types=[FULL, SLIDING],
        num_local_experts=2,
        num_experts_per_tok=1,
    )
    assert cfg.layer_types == (FULL, SLIDING) and cfg.sliding_window == 4


def test_llama4_chunked_attention(write_config):
    """Llama 4: attention_chunk_size on RoPE layers, every 4th (NoPE) layer full, as transformers computes."""
    cfg = resolve(
        write_config,
        model_type="llama4_text",
        architectures=["Llama4ForCausalLM"],
        num_hidden_layers=8,
        head_dim=16,
        attention_chunk_size=32,
        intermediate_size_mlp=256,
    )
    assert cfg.attention_chunk_size == 32
    assert cfg.layer_types == (CHUNKED, CHUNKED, CHUNKED, FULL) * 2
    assert list(cfg.layer_types) == cfg.hf_config.layer_types


def test_nemotron_block_configs(write_config):
    """Nemotron-NAS: per-layer grouped heads, a no-op layer with no cache, a windowed layer."""
    attention = {"n_heads_in_group": 2, "no_op": False, "replace_with_linear": False, "window_length": None}
    blocks = [
        {"attention": attention, "ffn": {"ffn_mult": 1.0}},
        {"attention": {"no_op": True}, "ffn": {"ffn_mult": 1.0}},
        {"attention": {**attention, "n_heads_in_group": 4, "window_length": 16}, "ffn": {"ffn_mult": 3.0}},
    ]
    cfg = resolve(
        write_config,
        model_type="nemotron-nas",
        architectures=["DeciLMForCausalLM"],
        num_hidden_layers=3,
        block_configs=blocks,
        num_key_value_heads=None,
        intermediate_size=None,
    )
    assert cfg.layer_types == (FULL, NO_ATTENTION, SLIDING) and cfg.sliding_window == 16
    assert cfg.layer_num_kv_heads == (2, 0, 1)  # 4 heads / 2, nothing, 4 heads / 4
    assert cfg.kv_bytes_per_token() == (2 * 2 * 16 + 0 + 2 * 1 * 16) * 4  # fp32, head_dim 64 / 4 = 16
    assert cfg.intermediate_size == 256  # 3.0 x 2/3 x 64 = 128, rounded up to a multiple of 256


# ---- RoPE --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "key, params",
    [
        ("rope_scaling", {"type": "linear", "factor": 2.0}),  # the old spelling
        ("rope_scaling", {"rope_type": "linear", "factor": 2.0}),
        ("rope_parameters", {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}),  # transformers 5
    ],
)
def test_rope_spellings(write_config, key, params):
    """type / rope_type and rope_scaling / rope_parameters all resolve to one RopeConfig."""
    cfg = resolve(write_config, rope_theta=5000.0, **{key: params})
    assert (cfg.rope.rope_type, cfg.rope.factor, cfg.rope.theta) == ("linear", 2.0, 5000.0)
    assert cfg.rope.scaling["rope_type"] == "linear" and "type" not in cfg.rope.scaling


def test_dynamic_and_yarn_rope(write_config):
    """dynamic NTK and YaRN keep their factor and original context."""
    dyn = resolve(write_config, rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    assert (dyn.rope.rope_type, dyn.rope.factor) == ("dynamic", 4.0)
    yarn = resolve(
        write_config, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    )
    assert (yarn.rope.rope_type, yarn.rope.original_max_position_embeddings) == ("yarn", 64)


def test_legacy_su_rope_is_longrope(write_config):
    """Early Phi-3 128k checkpoints call LongRoPE "su"."""
    short = [1.0] * 8
    cfg = resolve(
        write_config,
        model_type="phi3",
        architectures=["Phi3ForCausalLM"],
        rope_scaling={
            "type": "su",
            "short_factor": short,
            "long_factor": short,
            "original_max_position_embeddings": 64,
        },
    )
    assert (cfg.rope.rope_type, cfg.rope.factor) == ("longrope", 256 / 64)


def test_partial_rotary_factor(write_config):
    """partial_rotary_factor 0.5 of head_dim 16 rotates 8 channels."""
    cfg = resolve(write_config, model_type="phi3", architectures=["Phi3ForCausalLM"], partial_rotary_factor=0.5)
    assert (cfg.head_dim, cfg.rope.rotary_dim) == (16, 8)


def test_missing_rope_theta_uses_the_default(write_config):
    """No rope_theta (Llama 2): the RoPE default base 10000."""
    assert resolve(write_config).rope.theta == 10000.0


# ---- dtype -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "changes, dtype",
    [
        ({"torch_dtype": "bfloat16"}, "bfloat16"),
        ({"torch_dtype": DROP, "dtype": "float16"}, "float16"),  # transformers 5 spelling
        ({"torch_dtype": DROP}, "float32"),
    ],
)
def test_dtype_spellings(write_config, changes, dtype):
    """torch_dtype or dtype; absent means float32 (and KV bytes follow the dtype)."""
    cfg = resolve(write_config, **changes)
    assert cfg.dtype == dtype
    element = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    assert cfg.kv_bytes_per_token() == 2 * (2 * 2 * 16) * element


@pytest.mark.parametrize(
    "kv_dtype, element",
    [("auto", 4), (None, 4), ("bfloat16", 2), ("fp8", 1), ("fp8_e4m3", 1), ("torch.float8_e4m3fn", 1), ("bf16", 2)],
)
def test_kv_cache_dtypes(write_config, kv_dtype, element):
    """kv_cache_dtype sizes the cache: auto follows the checkpoint, fp8 spellings take one byte."""
    assert resolve(write_config).kv_bytes_per_token(kv_dtype) == 2 * (2 * 2 * 16) * element


@pytest.mark.parametrize("kv_dtype", ["fp8_e5m2", "int8", "float64"])
def test_kv_cache_dtype_outside_the_vocabulary_is_refused(write_config, kv_dtype):
    """The config speaks kernelbay.dtypes' vocabulary: what the cache cannot store is an error naming the choices."""
    with pytest.raises(ConfigError, match=r"unknown KV-cache dtype .*use one of: auto, float32, bfloat16"):
        resolve(write_config).kv_bytes_per_token(kv_dtype)


# ---- record behaviour --------------------------------------------------------------------------
def test_record_is_frozen_hashable_and_comparable(write_config):
    """Two reads of one folder are equal and hash alike; fields cannot be assigned."""
    folder = write_config(tiny(rope_scaling={"rope_type": "linear", "factor": 2.0}))
    a, b = ModelConfig.from_pretrained(folder), ModelConfig.from_pretrained(folder)
    assert a == b and hash(a) == hash(b)
    with pytest.raises(AttributeError):
        a.head_dim = 1  # type: ignore[misc]


def test_layer_groups_keep_first_appearance_order(write_config):
    """layer_groups: kind -> indices, kinds in the order they first appear."""
    cfg = resolve(
        write_config,
        model_type="qwen2",
        num_hidden_layers=3,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=1,
    )
    assert cfg.layer_groups() == [(FULL, (0,)), (SLIDING, (1, 2))]


def test_record_pickles_for_worker_processes(write_config):
    """A resolved config (RoPE scaling and quantization included) survives pickling; its dicts stay read-only."""
    import pickle

    folder = write_config(
        tiny(
            rope_scaling={"rope_type": "linear", "factor": 2.0},
            quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]},
        )
    )
    cfg = ModelConfig.from_pretrained(folder)
    clone = pickle.loads(pickle.dumps(cfg))
    assert clone == cfg and clone.rope.scaling["factor"] == 2.0
    with pytest.raises(TypeError, match="frozen config"):
        clone.rope.scaling["factor"] = 3.0


def test_theta_inside_rope_parameters_wins_over_class_default(write_config):
    """A transformers-5 style config keeps rope_theta inside rope_parameters; that value is used."""
    cfg = resolve(write_config, rope_parameters={"rope_type": "default", "rope_theta": 123456.0})
    assert cfg.rope.theta == 123456.0


def test_legacy_layer_kind_spellings(write_config):
    """Older layer_types spellings ("attention") mean today's kinds."""
    cfg = resolve(write_config, model_type="mistral", sliding_window=None, layer_types=["attention", FULL])
    assert cfg.layer_types == (FULL, FULL)
