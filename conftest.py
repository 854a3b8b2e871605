"""Suite-wide fixtures, for tests/ and for every plugin's own tests/ folder: no KERNELBAY_* leakage from the caller.

The fixtures one area shares with a plugin's tests stay in that area's conftest under tests/ (the installed plugin
sites in tests/ecosystem, the tiny checkpoints in tests/models, ...) and the plugin's conftest imports them by name."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _clean_kernelbay_env(monkeypatch):
    """Tests never see the developer's KERNELBAY_* variables."""
    for key in list(os.environ):
        if key.startswith("KERNELBAY_"):
            monkeypatch.delenv(key)
