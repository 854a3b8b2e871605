"""The engine's default model, the model-folder check made before anything loads, and the translation of
loader errors into exit-coded input errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from kernelbay_engine.errors import MissingWeights


def demo_model_folder() -> Path:
    """The checkpoint shipped inside the package (`kernelbay_engine/demo`): `kernelbay run`'s default."""
    from importlib.resources import files

    return Path(str(files("kernelbay_engine") / "demo"))


def check_model_folder(path: str | Path) -> Path:
    """The folder (or weight file), once it exists and holds a config that parses; else a precise InputError."""
    from kernelbay_engine.config import read_config_json

    folder, _ = read_config_json(path)
    return folder


@contextlib.contextmanager
def model_errors() -> Iterator[None]:
    """While loading a model: weight problems get their own type (the registry's resolve_impl raises
    UnsupportedArchitecture itself)."""
    from kernelbay_engine.loading.checkpoint import CheckpointError

    try:
        yield
    except CheckpointError as err:
        raise MissingWeights(str(err)) from err


__all__ = ["demo_model_folder", "model_errors"]
