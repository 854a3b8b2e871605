"""`KERNELBAY_TRACE=1` logging: discovery, imports, registrations, decisions."""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("kernelbay")
_configured = False


def enable_trace() -> None:
    """Send kernelbay's debug log to stderr (what `--trace` and KERNELBAY_TRACE=1 do)."""
    global _configured
    if _configured:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[kernelbay] %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    _configured = True


def trace(msg: str, *args: object) -> None:
    if not _configured and os.environ.get("KERNELBAY_TRACE", "") not in ("", "0"):
        enable_trace()
    logger.debug(msg, *args)
