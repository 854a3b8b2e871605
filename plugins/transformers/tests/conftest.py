"""kernelbay-transformers' tests: the fallback against plain transformers, on tiny checkpoints built here."""

from __future__ import annotations

from tests.models.conftest import _one_thread, loaded, tiny_checkpoints  # noqa: F401  (fixtures)
