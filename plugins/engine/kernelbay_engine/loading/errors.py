"""The loader's one error type (its own module so the file reader and the folder logic can share it)."""

from __future__ import annotations

from kernelbay.errors import KernelbayError


class CheckpointError(KernelbayError, ValueError):
    """The checkpoint folder's weights are absent, corrupt, inconsistent or in a refused format."""
