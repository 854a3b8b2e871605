"""Model construction, loading and running, on the tiny checkpoints that tests/models builds with transformers (of
the llama and deepseek families: the engine's tests use kernelbay-llama and kernelbay-deepseek as models under test).
One torch thread: ../conftest.py."""

from __future__ import annotations

from tests.models.conftest import tiny_checkpoints  # noqa: F401  (a fixture)
