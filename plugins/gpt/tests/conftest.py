"""kernelbay-gpt's tests: its architectures against transformers, on tests/models' tiny-checkpoint fixtures."""

from __future__ import annotations

from tests.models.conftest import _one_thread, loaded, tiny_checkpoints  # noqa: F401  (fixtures)
