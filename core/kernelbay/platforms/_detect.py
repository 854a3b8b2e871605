"""Finding the current platform among the installed ones."""

from __future__ import annotations

import os

from .._trace import trace
from ..errors import KernelbayError, UnknownNameError, unknown_name_message
from ._base import Platform

_ENV = "KERNELBAY_PLATFORM"
_FALLBACK = "cpu"


def get_platform(name: str) -> Platform:
    """The installed platform called `name`; unknown names list the known ones."""
    from ..registry import names, resolve

    known = names("platform")
    if name not in known:
        raise UnknownNameError(unknown_name_message("platform", name, known))
    cls = resolve("platform", name)
    return cls() if isinstance(cls, type) else cls


def detect_platforms() -> list[tuple[str, bool, str]]:
    """(name, current, reason) for every installed platform; a broken one reports its error."""
    from ..registry import names

    found = []
    for name in names("platform"):
        try:
            current, reason = get_platform(name).is_current()
        except Exception as exc:  # noqa: BLE001 - a broken platform plugin must not break detection
            current, reason = False, f"failed to load: {type(exc).__name__}: {exc}"
        trace("detect platform %s: %s (%s)", name, "current" if current else "not current", reason)
        found.append((name, current, reason))
    return found


def current_platform() -> Platform:
    """`KERNELBAY_PLATFORM` if set, else the one current accelerator platform, else cpu.

    Two current accelerator platforms is an error naming both: set KERNELBAY_PLATFORM to choose.
    """
    forced = os.environ.get(_ENV)
    if forced:
        platform = get_platform(forced)
        current, reason = platform.is_current()
        if not current:
            raise KernelbayError(f"{_ENV}={forced} but that platform is not usable here: {reason}")
        trace("detect platform %s: chosen by %s (%s)", forced, _ENV, reason)
        return platform
    accelerators = [name for name, current, _ in detect_platforms() if current and name != _FALLBACK]
    if len(accelerators) > 1:
        raise KernelbayError(f"several platforms are current ({', '.join(accelerators)}); set {_ENV} to one of them")
    chosen = accelerators[0] if accelerators else _FALLBACK
    trace(
        "detect platform %s: chosen (%s)",
        chosen,
        "the one current accelerator" if accelerators else "no accelerator is current",
    )
    return get_platform(chosen)
