"""Fixtures: a fresh process registry for tests that register MoE backends at runtime."""

from __future__ import annotations

from tests.testing.conftest import fresh_registry  # noqa: F401  (fixture)
