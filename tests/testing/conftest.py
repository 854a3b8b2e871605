"""Fixtures: a fresh process registry for tests that register fake backends at runtime."""

from __future__ import annotations

import pytest

from kernelbay.attention import clear_selection_cache
from kernelbay.registry import default_registry, reset_registry


@pytest.fixture
def fresh_registry():
    """A registry over the real environment; whatever a test registers is gone afterwards."""
    previous = default_registry()
    clear_selection_cache()
    yield reset_registry()
    reset_registry(previous)
    clear_selection_cache()
