"""config.json -> a transformers `PretrainedConfig`, without running folder code unless trusted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ConfigError, MalformedConfig, MissingConfigFile, ModelFolderNotFound, UnknownNameError
from ._limits import check_written_layer_count, parse_config_text
from ._weight_files import model_weight_file, read_weight_file_config

CONFIG_FILE = "config.json"


def read_config_json(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The folder and its config.json as a dict, or a ConfigError saying exactly what is wrong."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ModelFolderNotFound(
            f"Model folder {str(folder)!r} does not exist; pass a folder that holds {CONFIG_FILE}."
        )
    weight_file = model_weight_file(folder)
    if weight_file is not None:  # x.gguf, or a folder holding only that: the file describes itself
        return weight_file, read_weight_file_config(weight_file)
    if not folder.is_dir():
        raise ModelFolderNotFound(
            f"{str(folder)!r} is a file, not a model folder; pass the folder that holds {CONFIG_FILE}."
        )
    file = folder / CONFIG_FILE
    if not file.is_file():
        present = ", ".join(sorted(p.name for p in folder.iterdir())[:8]) or "nothing"
        raise MissingConfigFile(
            f"{str(folder)!r} has no {CONFIG_FILE} (it holds: {present}); a Hugging Face checkpoint folder needs one."
        )
    return folder, _parse_json(file)


def _parse_json(file: Path) -> dict[str, Any]:
    try:
        data = parse_config_text(file.read_text(encoding="utf-8"), file)
    except UnicodeDecodeError as exc:
        raise MalformedConfig(f"{file} is not UTF-8 text (byte {exc.start}); is it really a config.json?") from None
    except json.JSONDecodeError as exc:
        raise MalformedConfig(
            f"{file} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}."
        ) from None
    if not isinstance(data, dict):
        raise MalformedConfig(f"{file} must hold a JSON object at the top level, not {type(data).__name__}.")
    return data


def load_hf_config(folder: Path, raw: dict[str, Any], trust_remote_code: bool):
    """The transformers config for `raw`: transformers' own class, a plugin's, or (trusted) the folder's."""
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError(
            f"{folder / CONFIG_FILE} has no 'model_type'; add the Hugging Face model type "
            '(e.g. "llama") so the right config class can parse it.'
        )
    check_written_layer_count(raw, str(folder / CONFIG_FILE))
    remote = _remote_config_class(raw)
    if trust_remote_code and remote:
        return _auto_config(folder, trust_remote_code=True)
    if _transformers_knows(model_type):
        return _auto_config(folder, trust_remote_code=False)
    return _from_class(config_class_for(model_type, remote), folder)


def _remote_config_class(raw: dict[str, Any]) -> str | None:
    auto_map = raw.get("auto_map")
    return auto_map.get("AutoConfig") if isinstance(auto_map, dict) else None


def _transformers_knows(model_type: str) -> bool:
    from transformers import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


def _auto_config(folder: Path, trust_remote_code: bool):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as exc:  # any parse failure is a config problem, chained for the cause
        raise ConfigError(f"transformers could not parse {folder / CONFIG_FILE}: {exc}") from exc


def _from_class(cls, folder: Path):
    try:
        return cls.from_pretrained(str(folder))
    except Exception as exc:  # re-raised as a ConfigError, as above
        raise ConfigError(f"{cls.__module__}.{cls.__qualname__} could not parse {folder / CONFIG_FILE}: {exc}") from exc


def config_class_for(model_type: str, remote: str | None = None):
    """A `model_type` transformers does not know, through the `kernelbay.configs` slot.

    First-party families ship theirs through the same door (kernelbay-llama's Nemotron-NAS, Phi-3-small
    and Falcon-RW classes, kernelbay-deepseek's Kimi K2): built-in, so any plugin providing the same
    model_type wins.
    """
    from ..registry import names, resolve

    try:
        cls = resolve("config", model_type)
    except UnknownNameError:
        raise ConfigError(_unknown_model_type_message(model_type, remote, names("config"))) from None
    _check_is_config_class(cls, model_type)
    return cls


def _check_is_config_class(cls, model_type: str) -> None:
    from transformers import PretrainedConfig

    if not (isinstance(cls, type) and issubclass(cls, PretrainedConfig)):
        raise ConfigError(
            f"The kernelbay.configs slot {model_type!r} holds {cls!r}, which is not a "
            "transformers PretrainedConfig subclass; fix the plugin that registers it."
        )


def _unknown_model_type_message(model_type: str, remote: str | None, plugin_types: list[str]) -> str:
    import transformers

    known = sorted(plugin_types)
    msg = (
        f"model_type {model_type!r} is unknown to transformers {transformers.__version__} and no installed "
        f"kernelbay plugin provides it (kernelbay.configs knows: {', '.join(known) or 'none'})."
    )
    if remote:
        msg += (
            f" config.json names remote code ({remote}): pass --trust-remote-code "
            "(trust_remote_code=True) to run it from the model folder,"
        )
    else:
        msg += " config.json has no auto_map, so there is no folder code to trust either;"
    return msg + (
        f" or install a plugin that declares a 'kernelbay.configs' entry point named {model_type!r}"
        ", or a transformers release that ships it."
    )
