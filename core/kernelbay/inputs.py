"""The translation of selector errors into exit-coded input errors (same message, a precise type)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from kernelbay.errors import IncapableBackend, UnknownBackend, UnknownNameError


@contextlib.contextmanager
def backend_errors() -> Iterator[None]:
    """While selecting attention backends: unknown names and incapable backends get their own types."""
    from kernelbay.attention import BackendNotCapable, NoCapableBackend

    try:
        yield
    except UnknownNameError as err:
        if isinstance(err, UnknownBackend):
            raise
        raise UnknownBackend(str(err)) from err
    except (BackendNotCapable, NoCapableBackend) as err:
        raise IncapableBackend(str(err)) from err


__all__ = ["backend_errors"]
