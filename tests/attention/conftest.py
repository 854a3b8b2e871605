"""Fixtures: a fresh registry per selector test, with fake backends registered at runtime."""

from __future__ import annotations

import pytest

from kernelbay.attention import clear_selection_cache
from kernelbay.registry import default_registry, reset_registry


@pytest.fixture
def fresh_registry():
    """A registry over the real environment (VANILLA, SDPA, FLEX installed); restored afterwards."""
    previous = default_registry()
    clear_selection_cache()
    registry = reset_registry()
    yield registry
    reset_registry(previous)
    clear_selection_cache()
