"""Fixtures for the config tests: the shared real configs and synthetic checkpoint folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._paths import load_shared


@pytest.fixture
def write_config(tmp_path):
    """`write_config(dict_or_text, name=...)` -> a folder holding that config.json."""

    def write(content, name: str = "model") -> Path:
        folder = tmp_path / name
        folder.mkdir(parents=True, exist_ok=True)
        text = content if isinstance(content, str) else json.dumps(content, indent=2)
        (folder / "config.json").write_text(text)
        return folder

    return write


@pytest.fixture
def shared_copy(write_config):
    """`shared_copy("qwen3-8b", drop=[...], **changes)`: a shared config with keys changed or removed."""

    def copy(name: str, drop: tuple[str, ...] = (), **changes) -> Path:
        data = load_shared(name)
        for key in drop:
            data.pop(key, None)
        data.update(changes)
        return write_config(data, name=name)

    return copy


@pytest.fixture
def hook_env():
    """`hook_env(**environ)`: a registry and hook manager of the test's own; the process's come back afterwards."""
    import os

    from kernelbay.hooks import plugin_manager, reset_hooks
    from kernelbay.registry import Registry, default_registry, reset_registry

    previous = default_registry()

    def make(**environ: str):
        reset_registry(Registry(environ={**os.environ, **environ}))
        reset_hooks()
        return plugin_manager()

    yield make
    reset_registry(previous)
    reset_hooks()
