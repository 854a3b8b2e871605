"""Checks on a model folder made before anything loads, and the translation of loader errors into
the engine's exit-coded input errors (same message, a precise type)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ..errors import UnknownNameError
from .errors import IncapableBackend, MissingWeights, UnknownBackend, UnsupportedArchitecture


def demo_model_folder() -> Path:
    """The checkpoint shipped inside the package (`kernelbay/demo`): what `kernelbay run` uses by default."""
    from importlib.resources import files

    return Path(str(files("kernelbay") / "demo"))


def check_model_folder(path: str | Path) -> Path:
    """The folder, once it exists and holds a config.json that parses; else a precise InputError."""
    from ..config import read_config_json

    folder, _ = read_config_json(path)
    return folder


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
