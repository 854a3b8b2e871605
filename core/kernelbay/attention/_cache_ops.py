"""Deprecated alias of `kernelbay.attention.cache_ops` (docs/contract.md: kept, warning, for one minor release)."""

import warnings

from .cache_ops import FP8_MAX, CacheViews, cache_views, read_plane, write_plane, write_planes

warnings.warn(
    "kernelbay.attention._cache_ops is deprecated and goes in kernelbay 0.2: import kernelbay.attention.cache_ops",
    DeprecationWarning,
    stacklevel=2,
)
__all__ = ["FP8_MAX", "CacheViews", "cache_views", "read_plane", "write_plane", "write_planes"]
