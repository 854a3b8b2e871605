"""`quantization_config` (or a ModelOpt `hf_quant_config.json`) parsed into a `QuantConfig`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernelbay.errors import ConfigError

from ._fields import Fields
from ._loading import read_json
from ._records import QuantConfig, frozen_json

MODELOPT_FILE = "hf_quant_config.json"
EXCLUDE_KEYS = ("modules_to_not_convert", "ignore", "ignored_layers", "exclude_modules")
FP8_FORMATS = {"FP8": "e4m3", "FP8_E4M3": "e4m3", "FP8_E5M2": "e5m2"}


def resolve_quantization(f: Fields, folder: Path | None) -> QuantConfig | None:
    """What the checkpoint says about its quantization; never guessed from the folder's name."""
    raw = _quantization_dict(f, folder)
    if raw is None:
        return None
    method = raw.get("quant_method") or _inferred_method(f, raw)
    return QuantConfig(
        quant_method=str(method),
        element_type=_element_type(raw, method),
        weight_block_size=_block_size(f, raw),
        weight_granularity=_granularity(raw, method),
        activation_scheme=_activation_scheme(raw),
        modules_to_not_convert=_excluded(raw),
        kv_cache_dtype=_kv_cache_dtype(raw),
        raw=frozen_json(raw),
    )


def _quantization_dict(f: Fields, folder: Path | None) -> dict[str, Any] | None:
    value = f.raw.get("quantization_config", f.parsed.get("quantization_config"))
    if value is None and folder is not None and (folder / MODELOPT_FILE).is_file():
        return _modelopt_file(folder / MODELOPT_FILE)
    if value is None:
        return None
    if hasattr(value, "to_dict"):  # a transformers QuantizationConfigMixin
        value = value.to_dict()
    if not isinstance(value, Mapping):
        raise ConfigError(f"{f.source}: quantization_config must be an object, got {value!r}.")
    return dict(value)


def _modelopt_file(file: Path) -> dict[str, Any]:
    data = read_json(file)
    body = data.get("quantization") if isinstance(data, dict) else None
    if not isinstance(body, dict):
        raise ConfigError(f"{file} has no 'quantization' object.")
    return {"quant_method": "modelopt", "producer": data.get("producer"), **body}


def _inferred_method(f: Fields, raw: dict) -> str:
    """Some exports omit quant_method; their producer or layout still says which one it is."""
    producer = raw.get("producer")
    if (isinstance(producer, dict) and producer.get("name") == "modelopt") or "quant_algo" in raw:
        method = "modelopt"
    elif "config_groups" in raw:
        method = "compressed-tensors"
    else:
        raise ConfigError(
            f"{f.source}: quantization_config has no quant_method and no producer or "
            'config_groups to infer it from; add "quant_method".'
        )
    f.notes.append(f"quantization_config has no quant_method: {method} inferred from its keys")
    return method


def _group_part(raw: dict, name: str) -> dict:
    """`weights` / `input_activations` of the first compressed-tensors config group: an object, or {} when absent."""
    groups = raw.get("config_groups")
    first = next(iter(groups.values()), None) if isinstance(groups, dict) else None
    value = first.get(name) if isinstance(first, dict) else None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"quantization_config.config_groups.*.{name} must be an object, got {value!r}.")
    return value


def _element_type(raw: dict, method: str) -> str | None:
    if raw.get("fmt"):
        return str(raw["fmt"])
    algo = str(raw.get("quant_algo") or "").upper()
    if algo in FP8_FORMATS:
        return FP8_FORMATS[algo]
    if _is_fp8(_group_part(raw, "weights")) or method == "fp8":  # e4m3: transformers' FP8 default
        return "e4m3"
    if method == "mxfp4":
        return "e2m1"
    return None


def _block_size(f: Fields, raw: dict) -> tuple[int, int] | None:
    value = raw.get("weight_block_size") or _group_part(raw, "weights").get("block_structure")
    if value is None:
        return None
    if isinstance(value, str):  # compressed-tensors writes "128x128"
        value = value.lower().split("x")
    try:
        rows, cols = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"{f.source}: weight_block_size {value!r} is not a pair of integers.") from None
    return rows, cols


def _granularity(raw: dict, method: str) -> str | None:
    if raw.get("weight_block_size"):
        return "block"
    strategy = _group_part(raw, "weights").get("strategy")
    if strategy:
        return str(strategy)
    if raw.get("group_size") or method == "mxfp4":
        return "group"
    if method in ("fp8", "modelopt", "compressed-tensors"):
        return "tensor"
    return None


def _activation_scheme(raw: dict) -> str | None:
    if raw.get("activation_scheme"):
        return str(raw["activation_scheme"])
    inputs = _group_part(raw, "input_activations")
    if "dynamic" in inputs:
        return "dynamic" if inputs["dynamic"] else "static"
    return None


def _excluded(raw: dict) -> tuple[str, ...]:
    for key in EXCLUDE_KEYS:
        value = raw.get(key)
        if isinstance(value, str) and value:
            return (value,)
        if isinstance(value, (list, tuple)) and value:
            return tuple(str(v) for v in value)
        if value:
            raise ConfigError(f"quantization_config.{key} must be a list of module names, got {value!r}.")
    return ()


def _kv_cache_dtype(raw: dict) -> str | None:
    scheme = raw.get("kv_cache_scheme") or raw.get("kv_cache_quant_algo")
    if isinstance(scheme, dict):
        return "fp8_e4m3" if _is_fp8(scheme) else None
    if isinstance(scheme, str) and scheme.upper() in FP8_FORMATS:
        return "fp8_" + FP8_FORMATS[scheme.upper()]
    return None


def _is_fp8(spec: dict) -> bool:
    """A compressed-tensors quantization spec of 8-bit floats."""
    return spec.get("type") == "float" and spec.get("num_bits") == 8
