"""kernelbay-torch's tests: VANILLA, SDPA and FLEX over the named batch specs of tests/attention/_harness.py."""

from __future__ import annotations

from tests.attention.conftest import fresh_registry  # noqa: F401  (a fixture, shared with the selector tests)
