"""`KERNELBAY_TRACE=1` logging: discovery, imports, registrations, decisions.

`logging` is imported only when something is actually logged, to keep `kernelbay plugins` fast.
"""

from __future__ import annotations

import os
import sys

_configured = False


def _logger():
    import logging

    return logging.getLogger("kernelbay")


def enable_trace() -> None:
    """Send kernelbay's debug log to stderr (what `--trace` and KERNELBAY_TRACE=1 do)."""
    global _configured
    if _configured:
        return
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[kernelbay] %(message)s"))
    logger = _logger()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    _configured = True


def _tracing() -> bool:
    if _configured:
        return True
    if os.environ.get("KERNELBAY_TRACE", "") not in ("", "0"):
        enable_trace()
        return True
    # a host application may have turned kernelbay's debug log on itself
    return "logging" in sys.modules and _logger().isEnabledFor(10)


def trace(msg: str, *args: object) -> None:
    if _tracing():
        _logger().debug(msg, *args)


def warn(msg: str, *args: object) -> None:
    _logger().warning(msg, *args)
