"""Suite-wide fixtures: a clean kernelbay registry per test, no KERNELBAY_* leakage from the caller."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _clean_kernelbay_env(monkeypatch):
    """Tests never see the developer's KERNELBAY_* variables."""
    for key in list(os.environ):
        if key.startswith("KERNELBAY_"):
            monkeypatch.delenv(key)
