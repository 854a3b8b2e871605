"""A model given as one self-describing weight file (`x.gguf`), or a folder holding only one.

The file's suffix names its `kernelbay.weight_formats` slot (`x.gguf` -> `gguf`). A format whose
class has `config_dict(path) -> dict` carries its config inside the file: it returns what config.json
would hold, and the core turns that into a transformers config. The core never imports a format's
reader library; formats without `config_dict` (safetensors) need a config.json beside them.
A model folder's format is `safetensors` (kernelbay-engine); its `stored_tensors(folder)` answers what the
folder stores, evidence for keys config.json leaves out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError, KernelbayError, MalformedConfig, MissingConfigFile, UnknownNameError

FOLDER_FORMAT = "safetensors"  # the weight format of a model folder (a file's is named by its suffix)


def _format_names() -> set[str]:
    """Installed weight formats, plus the first-party ones that only need installing (named in errors)."""
    from ..registry import names
    from ..registry._registry import FIRST_PARTY_PROVIDES

    return set(names("weight_format")) | set(FIRST_PARTY_PROVIDES["weight_format"])


def format_name(path: Path) -> str | None:
    """The weight-format slot of a folder, or the one a file's suffix names (`gguf` for `x.gguf`), or None."""
    if path.is_dir():
        return FOLDER_FORMAT
    suffix = path.suffix[1:].lower()
    return suffix if suffix and suffix in _format_names() else None


def weight_format_class(path: Path):
    """The class of the file's weight format; an uninstalled first-party one says what to install."""
    from ..registry import resolve

    name = format_name(path)
    if name is None:
        raise MissingConfigFile(f"{str(path)!r} is not a weight file kernelbay knows ({', '.join(_format_names())})")
    try:
        return resolve("weight_format", name)
    except UnknownNameError as err:
        raise MissingConfigFile(f"{str(path)!r} is a {name} file, but no weight format can open it: {err}") from None


def model_weight_file(path: Path) -> Path | None:
    """`path` itself if it is a weight file, or the one such file of a folder without config.json."""
    if path.is_file():
        return path if format_name(path) else None
    if not path.is_dir() or (path / "config.json").exists():
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


def hf_config_from_dict(file: Path, raw: dict[str, Any]):
    """The transformers config for a dict read from a weight file (transformers' class or a plugin's)."""
    from transformers import CONFIG_MAPPING

    from ._loading import config_class_for

    model_type = raw["model_type"]
    cls = CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else config_class_for(model_type)
    try:
        return cls.from_dict({k: v for k, v in raw.items() if k != "model_type"})
    except Exception as exc:  # any parse failure is a config problem, chained for the cause
        raise ConfigError(f"{cls.__name__} could not parse the config read from {file}: {exc}") from exc


def stored_tensors(folder: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) of a model folder's tensors, read by its format's `stored_tensors` from the headers
    alone; {} when it holds none, or when no installed format reads folders (the config's fields then decide)."""
    from ..registry import names

    if FOLDER_FORMAT not in names("weight_format"):
        return {}
    read = getattr(weight_format_class(folder), "stored_tensors", None)
    try:
        return read(folder) if read is not None else {}
    except KernelbayError as err:  # a corrupt header or index: the format's own words, as the config's error
        raise ConfigError(str(err)) from err
