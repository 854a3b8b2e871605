"""Hardware platforms: which one this process runs on, and the attention backends it prefers.

Platforms are plugins (entry-point group `kernelbay.platforms`); the core ships `cpu` and `cuda`.
"""

from __future__ import annotations

from ._base import Platform
from ._detect import current_platform, detect_platforms, get_platform

__all__ = ["Platform", "current_platform", "detect_platforms", "get_platform"]
