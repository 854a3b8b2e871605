"""A Llama config.json as transformers' `LlamaConfig` parses it, held in the generic `PretrainedConfig`.

Importing `LlamaConfig` imports `transformers.utils.type_validators` (for the range of `initializer_range`), which
imports `transformers.activations` -> `integrations.hub_kernels` -> ... -> `torch.distributed.tensor`: ~0.9 s and
~57 MiB, more than the rest of `kernelbay explain` together. `LlamaConfig` is a strict dataclass of plain fields over
`PretrainedConfig`: its fields, defaults, two derived values and checks are written down here (`LLAMA_FIELDS`,
`_derived`, `_plain`), and the generic class runs everything the two share (dtype, name_or_path, generation keys,
RoPE standardization and validation, token ids) on the same inputs: the RoPE step once the fields are set, as
`LlamaConfig`'s init runs it, and the validators last.

A config with anything else is `LlamaConfig`'s to parse, never guessed: `plain_llama_config` answers None for a
value of a type the class would refuse, keys that change how RoPE or the class is read, remote code, or a
transformers release other than the one this module was checked against, and the caller parses the folder with
the class (its answer or its error). The tests (plugins/engine/tests/config/test_llama_without_its_class.py)
compare the result with `LlamaConfig`'s, attribute by attribute, for every vendored Llama config and tiny variants.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from ._file_config import WeightFileConfig
from ._transformers import transformers_names

# The transformers release whose LlamaConfig this module reproduces; the tests fail on any other, so that an upgrade
# is checked again (field by field) before the generic parse is trusted for it. Others get LlamaConfig itself.
CHECKED_TRANSFORMERS = "5.24.0"

NONE = type(None)
# LlamaConfig's own dataclass fields (not PretrainedConfig's): name -> (default, the exact value types it accepts).
# Exact types: a bool is no int and an int no float here, whatever the class would make of them (it decides those).
LLAMA_FIELDS: dict[str, tuple[Any, tuple[type, ...]]] = {
    "vocab_size": (32000, (int,)),
    "hidden_size": (4096, (int,)),
    "intermediate_size": (11008, (int,)),
    "num_hidden_layers": (32, (int,)),
    "num_attention_heads": (32, (int,)),
    "num_key_value_heads": (None, (int, NONE)),
    "hidden_act": ("silu", (str,)),
    "max_position_embeddings": (2048, (int,)),
    "initializer_range": (0.02, (float,)),  # within [0, 1] (transformers' `interval` validator)
    "rms_norm_eps": (1e-6, (float,)),
    "use_cache": (True, (bool,)),
    "pad_token_id": (None, (int, NONE)),
    "bos_token_id": (1, (int, NONE)),
    "eos_token_id": (2, (int, list, NONE)),  # a list of ints
    "pretraining_tp": (1, (int, NONE)),
    "tie_word_embeddings": (False, (bool,)),
    "rope_parameters": (None, (dict, NONE)),
    "attention_bias": (False, (bool,)),
    "attention_dropout": (0.0, (int, float, NONE)),
    "mlp_bias": (False, (bool,)),
    "head_dim": (None, (int, NONE)),
}
# What PretrainedConfig's RoPE standardization takes from the keyword arguments (it pops them).
ROPE_KEYWORDS = ("rope_scaling", "rope_theta", "partial_rotary_factor")
# Keys that LlamaConfig reads at another moment than the generic class would, or that choose another class or file:
# RoPE reads layer_types / original_max_position_embeddings / its class attributes before the other keys are set;
# num_heads + embed_dim are checked by PretrainedConfig's architecture check, which LlamaConfig's replaces;
# per_layer_config makes a heterogeneous config; auto_map, configuration_files and revision steer AutoConfig.
CLASS_KEYS = frozenset(
    {
        "layer_types",
        "_rope_type_labels",
        "original_max_position_embeddings",
        "default_rope_type",
        "default_theta",
        "ignore_keys_at_rope_validation",
        "num_heads",
        "embed_dim",
        "per_layer_config",
        "auto_map",
        "configuration_files",
        "revision",
    }
)
FLOAT_TAG = "__float__"  # transformers' JSON spelling of NaN / Infinity, decoded by its own reader


def plain_llama_config(folder: Path, raw: dict[str, Any]):
    """What `AutoConfig.from_pretrained(folder)` gives for this llama config.json, as a `PretrainedConfig` holding
    the same attributes; None when the config is not one this module reproduces (parse it with LlamaConfig)."""
    (version,) = transformers_names("__version__")
    if version != CHECKED_TRANSFORMERS or not _plain(raw):
        return None
    kwargs = copy.deepcopy(raw)  # transformers fills the RoPE dict in place; `raw` stays as written
    fields = {name: kwargs.pop(name, default) for name, (default, _) in LLAMA_FIELDS.items()}
    fields.update(_derived(fields))
    rope = {key: kwargs.pop(key) for key in ROPE_KEYWORDS if key in kwargs}
    (PretrainedConfig,) = transformers_names("PretrainedConfig")
    try:
        config = PretrainedConfig.from_dict(kwargs, name_or_path=str(folder))
        for name, value in fields.items():  # LlamaConfig holds them as fields: the generic init would drop use_cache
            setattr(config, name, value)
        config.convert_rope_params_to_dict(**rope)  # LlamaConfig.__post_init__'s step, on the same attributes
        config.validate()
    except Exception:  # noqa: BLE001 - any refusal is LlamaConfig's to word: the caller parses with the class
        return None
    return config


def _derived(fields: dict[str, Any]) -> dict[str, Any]:
    """LlamaConfig.__post_init__'s defaults that depend on other fields."""
    heads = fields["num_attention_heads"]
    return {
        "head_dim": fields["head_dim"] if fields["head_dim"] is not None else fields["hidden_size"] // heads,
        "num_key_value_heads": fields["num_key_value_heads"] if fields["num_key_value_heads"] is not None else heads,
    }


def _plain(raw: dict[str, Any]) -> bool:
    """True when every LlamaConfig field `raw` writes has a value the class keeps as it is, LlamaConfig's own checks
    pass, and no key is read differently by the class (CLASS_KEYS) or by transformers' JSON reader."""
    if raw.get("model_type") != "llama" or not CLASS_KEYS.isdisjoint(raw) or _has_float_tag(raw):
        return False
    for name, (_, types) in LLAMA_FIELDS.items():
        if name in raw and type(raw[name]) not in types:
            return False
    eos = raw.get("eos_token_id")
    if isinstance(eos, list) and not all(type(token) is int for token in eos):
        return False
    if not 0.0 <= raw.get("initializer_range", 0.0) <= 1.0:
        return False
    hidden = raw.get("hidden_size", LLAMA_FIELDS["hidden_size"][0])
    heads = raw.get("num_attention_heads", LLAMA_FIELDS["num_attention_heads"][0])
    return hidden > 0 and heads > 0 and hidden % heads == 0  # LlamaConfig.validate_architecture


def _has_float_tag(value: Any) -> bool:
    """True when a dict anywhere in `value` is keyed FLOAT_TAG ({"__float__": "NaN"}), without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if FLOAT_TAG in item:
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def is_llama_parse(config) -> bool:
    """True for a Llama config held in the generic PretrainedConfig (`plain_llama_config`'s, or a weight file's
    complete one, `WeightFileConfig`): LlamaConfig is the class it is a parse of."""
    if getattr(config, "model_type", None) != "llama":
        return False
    if isinstance(config, WeightFileConfig):
        return True
    (PretrainedConfig,) = transformers_names("PretrainedConfig")
    return type(config) is PretrainedConfig


def llama_config_parameters() -> frozenset[str]:
    """The parameters `LlamaConfig(...)` takes: PretrainedConfig's fields and LLAMA_FIELDS."""
    (PretrainedConfig,) = transformers_names("PretrainedConfig")
    return frozenset(f.name for f in dataclasses.fields(PretrainedConfig)) | frozenset(LLAMA_FIELDS)
