"""Mutated real configs: every one explains to a valid document or fails with a documented, exit-coded error.

A few hundred examples in CI; set KERNELBAY_FUZZ_EXAMPLES=5000 for a longer run.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelbay.errors import EXIT_CODES, ConfigError, InputError
from kernelbay_engine.explain import explain_model
from tests._explain_schema import validate
from tests._paths import load_shared, shared_config_dirs

EXAMPLES = int(os.environ.get("KERNELBAY_FUZZ_EXAMPLES", "300"))
CONFIGS = shared_config_dirs()

# What a mutated field's value becomes: the classic troublemakers, each as config.json can spell it.
BAD_VALUES = st.sampled_from(
    [0, -1, 1, float("nan"), float("inf"), -float("inf"), 2**31, 10**9, 10**12, 2**63, 2**70, 1e308, -2048, "", "x",
     "32", "gpt2", "llama", [], [1, 2], None, True, {}, {"a": {"b": [1]}}, 0.5, -0.0]
)  # fmt: skip
MAX_SIZE = 2**31 - 1  # docs/engine.md: sizes are integers from 1 to 2**31 - 1


def _paths(data: dict, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a config, nested objects and first list items included (architectures.0, ...)."""
    out = []
    for key, value in data.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out += _paths(value, (*prefix, key))
        elif isinstance(value, list) and value:
            out.append((*prefix, key, 0))
    return out


def _mutate(data: dict, path: tuple, value) -> dict:
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


@st.composite
def mutated_configs(draw):
    """(config name, key path, new value, the mutated config)."""
    name = draw(st.sampled_from(CONFIGS))
    data = load_shared(name)
    path = draw(st.sampled_from(_paths(data)))
    value = draw(BAD_VALUES)
    return name, path, value, _mutate(data, path, value)


def _explain(data: dict):
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(data, allow_nan=True))
        return explain_model(folder)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_configs())
def test_mutated_real_config_explains_or_fails_with_a_documented_error(case):
    """Any bad value anywhere in a real config: a schema-valid document or a documented error, nothing else."""
    name, path, value, data = case
    try:
        doc = _explain(data)
    except InputError as err:
        assert type(err).__name__ in EXIT_CODES or err.exit_code in EXIT_CODES.values(), (name, path, value, err)
        return
    except ConfigError:
        return  # exit code 1, as for any kernelbay error
    assert validate(doc) == [], (name, path, value)
    assert _out_of_bounds(doc) == [], (name, path, value)


def _out_of_bounds(doc: dict) -> list[str]:
    """The sizes an explained document shows outside the documented ranges (an MoE section's included)."""
    moe = doc.get("moe") or {}
    sizes = {key: moe[key] for key in ("num_experts", "top_k", "intermediate_size") if key in moe}
    wrong = [f"{key}={value}" for key, value in sizes.items() if not 1 <= value <= MAX_SIZE]
    shared = moe.get("shared_intermediate_size", 0)
    return wrong + ([f"shared_intermediate_size={shared}"] if not 0 <= shared <= MAX_SIZE else [])


# What explain used to accept although the model cannot be what it says (issue 28): a documented error naming the
# field, from the one resolution explain and run share. name -> (config, changes, what the message names).
MUST_REFUSE = {
    "a trillion experts": ("mixtral-8x7b-v0.1", {"num_local_experts": 10**12}, "num_local_experts=1000000000000"),
    "2**31 experts": ("qwen3-30b-a3b", {"num_experts": 2**31}, "num_experts=2147483648"),
    "zero experts (silently dense)": ("mixtral-8x7b-v0.1", {"num_local_experts": 0}, "num_local_experts=0"),
    "zero routed experts": ("deepseek-v3", {"n_routed_experts": 0}, "n_routed_experts=0"),
    "negative shared experts": ("deepseek-v3", {"n_shared_experts": -1}, "n_shared_experts=-1"),
    "negative shared expert width": ("qwen1.5-moe-a2.7b", {"shared_expert_intermediate_size": -2048}, "-2048"),
    "expert width beyond int32": ("mixtral-8x7b-v0.1", {"intermediate_size": 2**31}, "2147483648"),
    "MLA latent beyond int32": ("deepseek-v3", {"kv_lora_rank": 10**12}, "kv_lora_rank=1000000000000"),
    "MLA query rank beyond int32": ("deepseek-v3", {"q_lora_rank": 2**31}, "q_lora_rank=2147483648"),
    "sparse step 0 (every layer MoE)": ("qwen1.5-moe-a2.7b", {"decoder_sparse_step": 0}, "decoder_sparse_step=0"),
    "sparse step -1": ("qwen3-30b-a3b", {"decoder_sparse_step": -1}, "decoder_sparse_step=-1"),
    "MoE layer frequency 0": ("deepseek-v3", {"moe_layer_freq": 0}, "moe_layer_freq=0"),
    "negative dense prefix": ("deepseek-v3", {"first_k_dense_replace": -1}, "first_k_dense_replace=-1"),
    "zero expert groups used": ("deepseek-v3", {"topk_group": 0}, "topk_group=0"),
    "a quant_method nothing runs": ("llama-3.1-8b", {"quantization_config": {"quant_method": "zzz"}}, "'zzz'"),
    "Llama with GPT-2's model_type": ("llama-3.1-8b", {"model_type": "gpt2"}, "'LlamaForCausalLM' belongs to"),
    "Mixtral with Llama's model_type": ("mixtral-8x7b-v0.1", {"model_type": "llama"}, "'MixtralForCausalLM'"),
    "Qwen3 with Mistral's model_type": ("qwen3-8b", {"model_type": "mistral"}, "set model_type to 'qwen3'"),
}


@pytest.mark.parametrize("case", MUST_REFUSE)
def test_hostile_config_is_a_config_error_naming_the_field(case):
    """Each of these explained as a valid document before; now a ConfigError (exit 1) that names what is wrong."""
    name, changes, fragment = MUST_REFUSE[case]
    with pytest.raises(ConfigError) as err:
        _explain({**load_shared(name), **changes})
    assert fragment in str(err.value), str(err.value)
    assert not isinstance(err.value, InputError) or type(err.value).__name__ in EXIT_CODES


@pytest.mark.parametrize("name", ["llama-3.1-8b", "mixtral-8x7b-v0.1", "qwen3-8b", "gemma-2-2b", "gpt2"])
def test_any_other_familys_model_type_is_refused(name):
    """architectures[0] decides the family: every model_type transformers pairs with another class is refused."""
    data = load_shared(name)
    from transformers import CONFIG_MAPPING  # the model_types transformers ships (a plugin's pairs its own class)

    known = {load_shared(n)["model_type"] for n in CONFIGS} & set(CONFIG_MAPPING)
    others = sorted(known - {data["model_type"]})
    accepted = []
    for model_type in others:
        try:
            _explain({**data, "model_type": model_type})
            accepted.append(model_type)
        except ConfigError:
            pass
    assert accepted == [], f"{name} explained as {accepted}"
