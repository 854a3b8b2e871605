"""What a hardware platform tells kernelbay: whether it is here, its device, its backend order."""

from __future__ import annotations

from typing import ClassVar


class Platform:
    """Subclass per platform and expose it in the `kernelbay.platforms` entry-point group."""

    name: ClassVar[str] = ""
    device_type: ClassVar[str] = ""
    """torch device type ("cpu", "cuda", ...)."""
    default_priority: ClassVar[tuple[str, ...]] = ()
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

    def to_dict(self) -> dict:
        current, reason = self.is_current()
        return {
            "name": self.name,
            "device": self.device(),
            "current": current,
            "reason": reason,
            "backend_priority": self.backend_priority(),
            "moe_backend_priority": self.moe_backend_priority(),
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
