"""A model's files -> config.json as a dict -> a transformers `PretrainedConfig`, without running folder code
unless trusted.

config.json is parsed strictly (no NaN/Infinity, integers within 64 bits, bounded nesting). A model may also be
one self-describing weight file (`x.gguf`), or a folder holding only one: the file's suffix names its
`kernelbay.weight_formats` slot, and a format whose class has `config_dict(path) -> dict` returns what config.json
would hold. A model folder's format is `safetensors` (kernelbay-engine), whose `stored_tensors(folder)` answers
what the folder stores: evidence for keys config.json leaves out. The core never imports a format's reader.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from kernelbay.errors import (
    ConfigError,
    KernelbayError,
    MalformedConfig,
    MissingConfigFile,
    ModelFolderNotFound,
    UnknownNameError,
)

from ._fields import MAX_LAYERS, check_size
from ._file_config import WeightFileConfig
from ._geometry import LAYERS
from ._llama import plain_llama_config
from ._transformers import transformers_names

CONFIG_FILE = "config.json"
FOLDER_FORMAT = "safetensors"  # the weight format of a model folder (a file's is named by its suffix)
MAX_JSON_DEPTH = 64  # real configs nest 3-4 deep (text_config.rope_scaling.*)


def read_config_json(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The folder and its config.json as a dict, or a ConfigError saying exactly what is wrong."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ModelFolderNotFound(_missing_model_message(folder))
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
    data = read_json(file)
    if not isinstance(data, dict):
        raise MalformedConfig(f"{file} must hold a JSON object at the top level, not {type(data).__name__}.")
    return folder, data


class _Rejected(ValueError):
    """A JSON literal config.json may not hold; turned into MalformedConfig with the file named."""


def _int64(text: str) -> int:
    if len(text.lstrip("-")) > 19 or abs(int(text)) >= 2**63:
        raise _Rejected(f"the integer {text[:40]}{'...' if len(text) > 40 else ''} does not fit in 64 bits")
    return int(text)


def read_json(file: Path) -> Any:
    """The file's JSON, strict about what a config may hold; every refusal is a MalformedConfig naming `file`."""
    try:
        text = file.read_text(encoding="utf-8")
        data = json.loads(text, parse_int=_int64)  # NaN, Infinity and 1e999 parse as floats: refused below
    except UnicodeDecodeError as exc:
        raise MalformedConfig(f"{file} is not UTF-8 text (byte {exc.start}); is it really a config.json?") from None
    except json.JSONDecodeError as exc:
        raise MalformedConfig(
            f"{file} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}."
        ) from None
    except _Rejected as exc:
        raise MalformedConfig(f"{file} is not a valid config: {exc}.") from None
    except RecursionError:
        raise MalformedConfig(f"{file} nests too deeply to parse; a config.json is a few levels deep.") from None
    depth, bad = _scan(data)
    if depth > MAX_JSON_DEPTH:
        raise MalformedConfig(f"{file} nests more than {MAX_JSON_DEPTH} levels deep; a config.json is a few levels.")
    if bad is not None:
        raise MalformedConfig(
            f"{file}: {bad[0]} is {bad[1]}, which is not a finite JSON number "
            "(JSON has no NaN or Infinity); write a finite number, or null"
        )
    return data


def _scan(data: Any) -> tuple[int, tuple[str, float] | None]:
    """Nesting depth of parsed JSON and the first NaN/Infinity with its key path, without recursion."""
    deepest, bad, stack = 0, None, [(data, 1, "")]
    while stack:
        value, depth, path = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(value, float) and not math.isfinite(value) and bad is None:
            bad = (path or "the top level", value)
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        stack.extend((child, depth + 1, f"{path}.{key}" if path else str(key)) for key, child in items)
    return deepest, bad


def load_hf_config(folder: Path, raw: dict[str, Any], trust_remote_code: bool):
    """The transformers config for `raw`: transformers' own class, a plugin's, or (trusted) the folder's; a plain
    Llama config is LlamaConfig's parse held in the generic `PretrainedConfig` (kernelbay_engine.config._llama)."""
    model_type = raw.get("model_type")
    file = folder / CONFIG_FILE
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError(
            f"{file} has no 'model_type'; add the Hugging Face model type "
            '(e.g. "llama") so the right config class can parse it.'
        )
    parts = [part for part in (raw, raw.get("text_config"), raw.get("vision_config")) if isinstance(part, dict)]
    for name, value in ((name, part.get(name)) for part in parts for name in LAYERS):
        if isinstance(value, int) and not isinstance(value, bool):  # bounded before anything is built per layer
            check_size(str(file), name, value, limit=MAX_LAYERS)
    auto_map = raw.get("auto_map") or {}
    if not (isinstance(auto_map, dict) and all(_is_code_reference(ref) for ref in auto_map.values())):
        raise ConfigError(
            f'{file}: auto_map must map Auto classes to code references ("module.Class"), got {auto_map!r}.'
        )
    remote = auto_map.get("AutoConfig")
    llama = plain_llama_config(folder, raw)  # LlamaConfig's parse without its ~0.9 s import chain, or None
    if llama is not None:
        return llama
    CONFIG_MAPPING, AutoConfig = transformers_names("CONFIG_MAPPING", "AutoConfig")

    trusted = bool(trust_remote_code and remote)
    if trusted or model_type in CONFIG_MAPPING:  # AutoConfig also refuses a malformed auto_map
        return _parse("transformers", file, lambda: AutoConfig.from_pretrained(str(folder), trust_remote_code=trusted))
    cls = config_class_for(model_type, remote)
    return _parse(f"{cls.__module__}.{cls.__qualname__}", file, lambda: cls.from_pretrained(str(folder)))


def _is_code_reference(ref: Any) -> bool:
    """A "module.Class" (or "repo--module.Class", or a repo id) string; a tokenizer's is a [slow, fast] pair,
    either may be null."""
    if isinstance(ref, (list, tuple)):
        return bool(ref) and all(part is None or _is_code_reference(part) for part in ref)
    return isinstance(ref, str) and bool(ref)


def _parse(parser: str, source: object, parse):
    try:
        return parse()
    except Exception as exc:  # any parse failure is a config problem, chained for the cause
        raise ConfigError(f"{parser} could not parse {source}: {exc}") from exc


def config_class_for(model_type: str, remote: str | None = None):
    """transformers' config class for `model_type`, else the `kernelbay.configs` slot's.

    First-party families ship theirs through the same door (kernelbay-llama's Nemotron-NAS, Phi-3-small
    and Falcon-RW classes, kernelbay-deepseek's Kimi K2): built-in, so any plugin providing the same
    model_type wins.
    """
    from kernelbay.registry import names, resolve

    CONFIG_MAPPING, PretrainedConfig = transformers_names("CONFIG_MAPPING", "PretrainedConfig")

    if model_type in CONFIG_MAPPING:
        return CONFIG_MAPPING[model_type]
    try:
        cls = resolve("config", model_type)
    except UnknownNameError:
        raise ConfigError(_unknown_model_type_message(model_type, remote, names("config"))) from None
    if not (isinstance(cls, type) and issubclass(cls, PretrainedConfig)):
        raise ConfigError(
            f"The kernelbay.configs slot {model_type!r} holds {cls!r}, which is not a "
            "transformers PretrainedConfig subclass; fix the plugin that registers it."
        )
    return cls


def _unknown_model_type_message(model_type: str, remote: str | None, plugin_types: list[str]) -> str:
    (version,) = transformers_names("__version__")
    msg = (
        f"model_type {model_type!r} is unknown to transformers {version} and no installed "
        f"kernelbay plugin provides it (kernelbay.configs knows: {', '.join(sorted(plugin_types)) or 'none'})."
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


# ---- weight formats --------------------------------------------------------------------------------
def _format_names() -> set[str]:
    """Installed weight formats, plus the first-party ones that only need installing (named in errors)."""
    from kernelbay.registry import first_party_names, names

    return set(names("weight_format")) | set(first_party_names("weight_format"))


def format_name(path: Path) -> str | None:
    """The weight-format slot of a folder, or the one a file's suffix names (`gguf` for `x.gguf`), or None."""
    if path.is_dir():
        return FOLDER_FORMAT
    suffix = path.suffix[1:].lower()
    return suffix if suffix and suffix in _format_names() else None


def weight_format_class(path: Path):
    """The class of the file's weight format; an uninstalled first-party one says what to install."""
    from kernelbay.registry import resolve

    name = format_name(path)
    if name is None:
        raise MissingConfigFile(f"{str(path)!r} is not a weight file kernelbay knows ({', '.join(_format_names())})")
    try:
        return resolve("weight_format", name)
    except UnknownNameError as err:
        raise MissingConfigFile(f"{str(path)!r} is a {name} file, but no weight format can open it: {err}") from None


def _missing_model_message(path: Path) -> str:
    """A path that names a model file by its suffix (x.gguf) is a missing file, any other a missing folder."""
    kind = format_name(path)
    if kind is not None:
        return f"Model file {str(path)!r} does not exist; pass an existing .{kind} file or a model folder."
    return f"Model folder {str(path)!r} does not exist; pass a folder that holds {CONFIG_FILE}, or a model file."


def model_weight_file(path: Path) -> Path | None:
    """`path` itself if it is a weight file, or the one such file of a folder without config.json."""
    if path.is_file():
        return path if format_name(path) else None
    if not path.is_dir() or (path / CONFIG_FILE).exists():
        return None
    found = sorted(p for p in path.iterdir() if p.is_file() and format_name(p) and not _needs_config(p))
    if len(found) > 1:
        listed = ", ".join(p.name for p in found)
        raise MissingConfigFile(f"{str(path)!r} has no config.json and several model files ({listed}); pass one file")
    return found[0] if found else None


def _needs_config(file: Path) -> bool:
    """True for formats that hold tensors only (safetensors): they are not a model on their own."""
    try:
        return getattr(weight_format_class(file), "config_dict", None) is None
    except MissingConfigFile:
        return False  # not installed: the file is still the model the user meant, and the error says so


def read_weight_file_config(file: Path) -> dict[str, Any]:
    """What config.json would hold, from the file's own metadata (the format plugin reads it)."""
    read = getattr(weight_format_class(file), "config_dict", None)
    if read is None:
        raise MissingConfigFile(f"{str(file)!r} holds weights only; pass the folder that holds it and its config.json")
    raw = read(file)
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise MalformedConfig(f"the weight format for {file.name} returned no config with a 'model_type': {raw!r:.200}")
    return raw


def weight_file_config_is_complete(file: Path) -> bool:
    """True when the weight file's format says the config it reads is whole (`config_is_complete(path)`: no class
    default adds a field kernelbay reads, and its architectures and model_type come from one table of the format)."""
    complete = getattr(weight_format_class(file), "config_is_complete", None)
    return complete is not None and bool(complete(file))


def hf_config_from_dict(file: Path, raw: dict[str, Any]):
    """The config for a dict read from a weight file: held as it is (`WeightFileConfig`, what transformers' generic
    `PretrainedConfig` would hold) when its format says it is complete, so transformers is not imported at all (nor
    the model type's class: LlamaConfig's import chain costs ~0.9 s); else that class's parse (transformers' class or
    a plugin's)."""
    if weight_file_config_is_complete(file):
        return WeightFileConfig(raw)
    return _class_parse(raw, f"the config read from {file}")


def _class_parse(raw: dict[str, Any], source: str):
    """`raw` parsed by its model type's config class (transformers' or a plugin's)."""
    cls = config_class_for(raw["model_type"])
    config = {k: v for k, v in raw.items() if k != "model_type"}
    return _parse(cls.__name__, source, lambda: cls.from_dict(config))


def typed_hf_config(hf_config):
    """`hf_config` as its model type's own transformers class (transformers' modeling code reads that class's
    defaults): a complete config read from a weight file, or a plain Llama config.json, is held in the generic
    `PretrainedConfig` (or `WeightFileConfig`), parsed here again by the class; any other config is returned as it
    is."""
    if isinstance(hf_config, WeightFileConfig):
        return _class_parse(hf_config.to_dict(), f"the {hf_config.model_type} config")
    (PretrainedConfig,) = transformers_names("PretrainedConfig")
    if type(hf_config) is not PretrainedConfig:
        return hf_config
    cls = config_class_for(hf_config.model_type)
    fields = hf_config.to_dict()  # with the class's model_type ("") and this transformers' version: the config's own
    fields.update(model_type=hf_config.model_type, transformers_version=hf_config.transformers_version)
    return _parse(cls.__name__, f"the {hf_config.model_type} config", lambda: cls.from_dict(fields))


def stored_tensors(folder: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) of a model folder's tensors, read by its format's `stored_tensors` from the headers
    alone; {} when it holds none, or when no installed format reads folders (the config's fields then decide)."""
    from kernelbay.registry import names

    if FOLDER_FORMAT not in names("weight_format"):
        return {}
    read = getattr(weight_format_class(folder), "stored_tensors", None)
    try:
        return read(folder) if read is not None else {}
    except KernelbayError as err:  # a corrupt header or index: the format's own words, as the config's error
        raise ConfigError(str(err)) from err
