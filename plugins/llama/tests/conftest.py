"""kernelbay-llama's tests: its architectures against transformers, on the tiny checkpoints of tests/models."""

from __future__ import annotations

from tests.models.conftest import _one_thread, loaded, loaded_moe, tiny_checkpoints  # noqa: F401  (fixtures)
