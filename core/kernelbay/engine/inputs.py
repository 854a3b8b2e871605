"""Checks on a model folder made before anything loads, and the translation of loader errors into
the engine's exit-coded input errors (same message, a precise type)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from ..errors import UnknownNameError
from .errors import (IncapableBackend, MalformedConfig, MissingConfigFile, MissingWeights, ModelFolderNotFound,
                     UnknownBackend, UnsupportedArchitecture)

CONFIG_FILE = "config.json"


def demo_model_folder() -> Path:
    """The checkpoint shipped inside the package (`kernelbay/demo`): what `kernelbay run` uses by default."""
    from importlib.resources import files

    return Path(str(files("kernelbay") / "demo"))


def check_model_folder(path: str | Path) -> Path:
    """The folder, once it exists and holds a config.json that parses; else a precise InputError."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ModelFolderNotFound(f"model folder {str(folder)!r} does not exist; pass a folder that holds "
                                  f"{CONFIG_FILE} (and weights to run it)")
    if not folder.is_dir():
        raise ModelFolderNotFound(f"{str(folder)!r} is a file, not a model folder; pass the folder holding it")
    if not (folder / CONFIG_FILE).is_file():
        raise MissingConfigFile(f"{str(folder)!r} has no {CONFIG_FILE}; a Hugging Face checkpoint folder needs one")
    _check_json(folder / CONFIG_FILE)
    return folder


def _check_json(file: Path) -> None:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise MalformedConfig(f"{file} is not UTF-8 text (byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise MalformedConfig(f"{file} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}") from None
    if not isinstance(data, dict):
        raise MalformedConfig(f"{file} must hold a JSON object at the top level, not {type(data).__name__}")


@contextlib.contextmanager
def model_errors() -> Iterator[None]:
    """While resolving and loading a model: unknown architecture and weight problems get their own types."""
    from ..models.loading.checkpoint import CheckpointError

    try:
        yield
    except UnknownNameError as err:
        if isinstance(err, UnsupportedArchitecture):
            raise
        raise UnsupportedArchitecture(str(err)) from err
    except CheckpointError as err:
        raise MissingWeights(str(err)) from err


@contextlib.contextmanager
def backend_errors() -> Iterator[None]:
    """While selecting attention backends: unknown names and incapable backends get their own types."""
    from ..attention import BackendNotCapable, NoCapableBackend

    try:
        yield
    except UnknownNameError as err:
        if isinstance(err, UnknownBackend):
            raise
        raise UnknownBackend(str(err)) from err
    except (BackendNotCapable, NoCapableBackend) as err:
        raise IncapableBackend(str(err)) from err


__all__ = ["backend_errors", "check_model_folder", "demo_model_folder", "model_errors"]
