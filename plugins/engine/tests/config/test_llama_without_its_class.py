"""A plain Llama config.json is parsed without importing LlamaConfig (kernelbay_engine.config._llama), and every
result is the one LlamaConfig gives: its attributes, the ModelConfig, `explain` (text and --json), the logits."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import io
import json
import types
import typing

import pytest
import transformers
from huggingface_hub.errors import StrictDataclassFieldValidationError

from kernelbay.cli import main
from kernelbay.errors import ConfigError
from kernelbay_engine.config import ModelConfig, _llama, _loading, typed_hf_config
from tests._fresh import run_fresh
from tests._paths import REAL_CONFIGS, load_shared, shared_config_dirs

LLAMA_CONFIGS = [name for name in shared_config_dirs() if load_shared(name).get("model_type") == "llama"]
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 320,
}
# Tiny configs written the ways Llama checkpoints write them: name -> keys over TINY (None: the key removed).
VARIANTS: dict[str, dict] = {
    "tiny": {},
    "only-model-type": {k: None for k in TINY if k != "model_type"},
    "head-dim-written": {"head_dim": 32, "num_key_value_heads": 2},
    "kv-heads-null": {"num_key_value_heads": None, "head_dim": None},
    "rope-llama3": {
        "rope_theta": 500000.0,
        "max_position_embeddings": 4096,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
    },
    "rope-llama3-without-original-length": {
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    },
    "rope-linear": {"rope_scaling": {"type": "linear", "factor": 2.0}},
    "rope-dynamic": {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "rope_theta": 20000},
    "rope-yarn": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}},
    "rope-scaling-null": {"rope_scaling": None, "rope_theta": 10000.0},
    "rope-parameters-written": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}},
    "partial-rotary": {"partial_rotary_factor": 0.5, "rope_theta": 10000.0},
    "tied-biased": {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True, "pretraining_tp": 2},
    "eos-list-dtype": {"eos_token_id": [2, 3], "bos_token_id": None, "pad_token_id": 0, "torch_dtype": "float16"},
    "dtype-key": {"dtype": "bfloat16", "transformers_version": "4.44.0"},
    "generation-keys": {"use_cache": False, "max_length": 64, "temperature": 0.7, "do_sample": True},
    "token-outside-vocabulary": {"bos_token_id": 128000},
    "name-and-extras": {"_name_or_path": "meta/x", "draft_vocab_size": 100, "target_hidden_size": 128},
    "other-fields": {"hidden_act": "gelu", "rms_norm_eps": 1e-5, "initializer_range": 1.0, "attention_dropout": 0},
}
# Configs LlamaConfig judges (a value it refuses or would change, a key it reads at another moment): not plain.
NOT_PLAIN = {
    "vocab-size-text": {"vocab_size": "320"},
    "hidden-size-float": {"hidden_size": 64.0},
    "bias-as-int": {"attention_bias": 1},
    "eps-as-int": {"rms_norm_eps": 1},
    "initializer-out-of-range": {"initializer_range": 2.0},
    "heads-do-not-divide": {"num_attention_heads": 3},
    "eos-list-of-text": {"eos_token_id": ["</s>"]},
    "layer-types": {"layer_types": ["full_attention", "full_attention"]},
    "top-level-original-length": {"original_max_position_embeddings": 64},
    "float-tag": {"rope_scaling": {"rope_type": "linear", "factor": {"__float__": "Infinity"}}},
    "remote-code": {"auto_map": {"AutoConfig": "configuration_x.XConfig"}},
}


def tiny(**changes) -> dict:
    data = dict(TINY, **changes)
    return {k: v for k, v in data.items() if v is not None or (k in changes and k not in TINY)}


@pytest.fixture
def variant_folder(write_config):
    def write(changes: dict):
        return write_config(tiny(**changes))

    return write


@pytest.fixture
def llama_config_class(monkeypatch):
    """Within the test, `plain_llama_config` declines every config: LlamaConfig parses (the reference)."""

    def use_the_class():
        monkeypatch.setattr(_loading, "plain_llama_config", lambda folder, raw: None)

    return use_the_class


def assert_parsed_as_llama_config_parses(folder) -> None:
    raw = json.loads((folder / "config.json").read_text())
    written = copy.deepcopy(raw)
    fast = _llama.plain_llama_config(folder, raw)
    reference = transformers.AutoConfig.from_pretrained(str(folder))
    assert type(reference) is transformers.LlamaConfig
    assert type(fast) is transformers.PretrainedConfig, f"{folder.name}: not parsed without LlamaConfig"
    assert raw == written, "the config as written is left as it was"
    ours, theirs = fast.__dict__, reference.__dict__
    differ = {k: (ours.get(k, "(absent)"), theirs.get(k, "(absent)")) for k in ours.keys() | theirs.keys()}
    assert not {k: pair for k, pair in differ.items() if pair[0] != pair[1]}, folder.name
    assert fast.to_dict() | {"model_type": "llama"} == reference.to_dict()
    typed = typed_hf_config(fast)  # what the transformers fallback builds from
    # but the set of RoPE keys validation skips, which to_dict does not write (transformers' own round trip)
    kept = {k: v for k, v in reference.__dict__.items() if k != "ignore_keys_at_rope_validation"}
    assert type(typed) is transformers.LlamaConfig and typed.__dict__ == kept


@pytest.mark.parametrize("name", LLAMA_CONFIGS)
def test_a_vendored_llama_config_holds_what_llama_config_holds(name):
    """Every attribute of the generic parse equals LlamaConfig's, for each vendored Llama config."""
    assert len(LLAMA_CONFIGS) == 16
    assert_parsed_as_llama_config_parses(REAL_CONFIGS / name)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_tiny_llama_config_holds_what_llama_config_holds(variant, variant_folder):
    """Defaults filled, head_dim and KV heads derived, RoPE variants standardized: as LlamaConfig does."""
    assert_parsed_as_llama_config_parses(variant_folder(VARIANTS[variant]))


@pytest.mark.parametrize("variant", sorted(NOT_PLAIN))
def test_a_config_llama_config_judges_is_parsed_by_llama_config(variant, variant_folder):
    """A value LlamaConfig refuses or reads its own way is not guessed: the class parses it (its answer or error)."""
    folder = variant_folder(NOT_PLAIN[variant])
    raw = json.loads((folder / "config.json").read_text())
    assert _llama.plain_llama_config(folder, raw) is None
    try:
        config = ModelConfig.from_pretrained(folder)
    except ConfigError:
        return  # refused as before: LlamaConfig's error, or kernelbay's own check of the class's parse
    assert type(config.hf_config) is transformers.LlamaConfig


def test_another_transformers_release_gets_llama_config(monkeypatch, variant_folder):
    """Only the release the fields were checked against is parsed without the class."""
    folder = variant_folder({})
    monkeypatch.setattr(_llama, "CHECKED_TRANSFORMERS", "0.0.0")
    assert _llama.plain_llama_config(folder, tiny()) is None
    assert type(ModelConfig.from_pretrained(folder).hf_config) is transformers.LlamaConfig


def test_the_fields_are_llama_configs_own():
    """LLAMA_FIELDS names LlamaConfig's fields with their defaults, and accepts only types their annotations allow;
    CHECKED_TRANSFORMERS is the installed release (after an upgrade: compare again, then update it)."""
    assert transformers.__version__ == _llama.CHECKED_TRANSFORMERS, (
        f"transformers {transformers.__version__}: set _llama.CHECKED_TRANSFORMERS to it and run this file; every "
        "Llama config takes LlamaConfig's slow import until then"
    )
    base = {f.name for f in dataclasses.fields(transformers.PretrainedConfig)}
    own = [f for f in dataclasses.fields(transformers.LlamaConfig) if f.name not in base]
    assert [f.name for f in own] == list(_llama.LLAMA_FIELDS)
    for f in own:
        default, accepted = _llama.LLAMA_FIELDS[f.name]
        assert f.default == default and type(f.default) is type(default), f.name
        allowed = {typing.get_origin(t) or t for t in _union(f.type)}
        assert set(accepted) <= allowed, (f.name, accepted, f.type)
        validators = f.metadata.get("validator")
        assert (validators is not None) == (f.name == "initializer_range"), f.name
    assert _llama.llama_config_parameters() == set(inspect.signature(transformers.LlamaConfig).parameters)


def _union(annotation) -> tuple:
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return typing.get_args(annotation)
    return (annotation,)


def test_the_bounds_of_initializer_range_are_llama_configs():
    """[0, 1], LlamaConfig's `interval` validator: inside passes, outside the class refuses."""
    for value in (0.0, 1.0):
        transformers.LlamaConfig(initializer_range=value)
    for value in (-0.01, 1.01):
        with pytest.raises(StrictDataclassFieldValidationError, match="initializer_range"):
            transformers.LlamaConfig(initializer_range=value)


@pytest.mark.parametrize("name", LLAMA_CONFIGS)
def test_the_model_config_and_explain_are_those_of_llama_config(name, llama_config_class):
    """ModelConfig, `explain` text and `explain --json` on a vendored Llama config: the same with either parse."""
    folder = REAL_CONFIGS / name
    results = []
    for _ in range(2):
        config = ModelConfig.from_pretrained(folder)
        results.append(
            (config, config.to_dict(), config.hf_config.__dict__, explain(folder), explain(folder, "--json"))
        )
        llama_config_class()
    (fast, *fast_views), (reference, *reference_views) = results
    assert type(fast.hf_config) is transformers.PretrainedConfig
    assert type(reference.hf_config) is transformers.LlamaConfig
    assert fast == reference
    assert fast_views == reference_views


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_model_config_of_a_tiny_variant_is_that_of_llama_config(variant, variant_folder, llama_config_class):
    """The same ModelConfig (or the same error) from either parse, for each tiny variant."""
    folder = variant_folder(VARIANTS[variant])
    fast = outcome(folder)
    llama_config_class()
    assert fast == outcome(folder)


def outcome(folder):
    try:
        config = ModelConfig.from_pretrained(folder)
    except ConfigError as err:
        return str(err)
    return config, config.to_dict(), config.hf_config.__dict__


def explain(folder, *options: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["explain", str(folder), *options]) == 0
    return out.getvalue()


@pytest.mark.parametrize("model_impl", ["native", "transformers"])
def test_a_tiny_llama_runs_with_the_logits_of_llama_config(model_impl, tiny_llama, llama_config_class):
    """LLM on a Llama safetensors folder, kernelbay's model or the transformers fallback (which rebuilds LlamaConfig
    from the generic parse): the same greedy tokens and log-probabilities with either parse."""
    from kernelbay_engine import LLM, SamplingParams

    params = SamplingParams(max_tokens=6, temperature=0, logprobs=4, prompt_logprobs=4)
    runs = []
    for _ in range(2):
        llm = LLM(tiny_llama, progress=False, max_num_seqs=1, model_impl=model_impl)
        out = llm.generate([[1, 5, 9, 30, 7]], params)[0]
        runs.append((type(llm.config.hf_config), out.token_ids, out.logprobs, out.prompt_logprobs))
        del llm
        llama_config_class()
    (fast_class, *fast), (reference_class, *reference) = runs
    assert (fast_class, reference_class) == (transformers.PretrainedConfig, transformers.LlamaConfig)
    assert fast == reference


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-2-7b-hf"])
def test_explain_on_a_llama_config_imports_no_llama_config_class(name):
    """`kernelbay explain` on a vendored Llama config: neither LlamaConfig's module nor torch.distributed.tensor
    (its import chain: type validators -> activations -> hub kernels -> ..., ~0.9 s) is imported (subprocess)."""
    code = f"from kernelbay.cli import main; assert main(['explain', {str(REAL_CONFIGS / name)!r}]) == 0"
    result = run_fresh(code, absent=["transformers.models.llama.configuration_llama", "torch.distributed.tensor"])
    assert "resolves to  model slot 'LlamaForCausalLM'" in result.stdout


def test_the_tiny_llama_fixture_is_plain(tiny_llama):
    """The config.json transformers saves for a Llama (rope_parameters and dtype written) is a plain one."""
    assert_parsed_as_llama_config_parses(tiny_llama)
