"""Checks on a model folder made before anything loads, and the translation of selector errors into
exit-coded input errors (same message, a precise type)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from kernelbay.errors import IncapableBackend, UnknownBackend, UnknownNameError


def check_model_folder(path: str | Path) -> Path:
    """The folder, once it exists and holds a config.json that parses; else a precise InputError."""
    from kernelbay.config import read_config_json

    folder, _ = read_config_json(path)
    return folder


@contextlib.contextmanager
def backend_errors() -> Iterator[None]:
    """While selecting attention backends: unknown names and incapable backends get their own types."""
    from kernelbay.attention import BackendNotCapable, NoCapableBackend

    try:
        yield
    except UnknownNameError as err:
        if isinstance(err, UnknownBackend):
            raise
        raise UnknownBackend(str(err)) from err
    except (BackendNotCapable, NoCapableBackend) as err:
        raise IncapableBackend(str(err)) from err


__all__ = ["backend_errors", "check_model_folder"]
