"""Hardware platforms: which one this process runs on, and the backends it prefers.

Platforms are plugins (entry-point group `kernelbay.platforms`); the core ships `cpu` and `cuda`.
"""

from __future__ import annotations

import os
from typing import ClassVar

from .._trace import trace
from ..errors import KernelbayError

_ENV = "KERNELBAY_PLATFORM"
_FALLBACK = "cpu"


class Platform:
    """Subclass per platform and expose it in the `kernelbay.platforms` entry-point group."""

    name: ClassVar[str] = ""
    device_type: ClassVar[str] = ""
    """torch device type ("cpu", "cuda", ...)."""
    default_priority: ClassVar[tuple[str, ...]] = ()
    """Attention backend names to try first (`backend_priority`)."""
    moe_priority: ClassVar[tuple[str, ...]] = ()
    """MoE backend names to try first (`moe_backend_priority`)."""

    def is_current(self) -> tuple[bool, str]:
        """Whether this process runs on this platform, and why (not)."""
        raise NotImplementedError(f"{type(self).__name__} must implement is_current()")

    def backend_priority(self) -> list[str]:
        """Attention backend names to try first, best first; the selector then tries every other installed one."""
        return list(self.default_priority)

    def moe_backend_priority(self) -> list[str]:
        """MoE backend names to try first, best first; the selector then tries every other installed one."""
        return list(self.moe_priority)

    def device(self, index: int | None = None) -> str:
        """A torch device string: "cuda:0", "cpu"."""
        return self.device_type if index is None else f"{self.device_type}:{index}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def get_platform(name: str) -> Platform:
    """The installed platform called `name`; an unknown name is UnknownNameError listing the known ones."""
    from ..registry import resolve

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


__all__ = ["Platform", "current_platform", "detect_platforms", "get_platform"]
