"""The engine's default model, the model-folder check made before anything loads, and the translation of
loader errors into exit-coded input errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from kernelbay.errors import MissingWeights, UnknownNameError, UnsupportedArchitecture


def demo_model_folder() -> Path:
    """The checkpoint shipped inside the package (`kernelbay_engine/demo`): `kernelbay run`'s default."""
    from importlib.resources import files

    return Path(str(files("kernelbay_engine") / "demo"))


def check_model_folder(path: str | Path) -> Path:
    """The folder (or weight file), once it exists and holds a config that parses; else a precise InputError."""
    from kernelbay.config import read_config_json

    folder, _ = read_config_json(path)
    return folder


@contextlib.contextmanager
def model_errors() -> Iterator[None]:
    """While resolving and loading a model: unknown architecture and weight problems get their own types."""
    from kernelbay_engine.loading.checkpoint import CheckpointError

    try:
        yield
    except UnknownNameError as err:
        if isinstance(err, UnsupportedArchitecture):
            raise
        raise UnsupportedArchitecture(str(err)) from err
    except CheckpointError as err:
        raise MissingWeights(str(err)) from err


__all__ = ["demo_model_folder", "model_errors"]
