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


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("", "0", "false", "no", "off")
_warned_values: set[str] = set()


def env_flag(name: str, value: str | None) -> bool:
    """An on/off environment variable: 1/true/yes/on or 0/false/no/off/empty (any case).

    Anything else counts as off and is reported once on stderr, naming the variable: a typo must not
    silently turn a feature on (nor crash every command, since this runs before any command starts)."""
    word = (value or "").strip().lower()
    if word in TRUE_WORDS:
        return True
    if word not in FALSE_WORDS and word not in _warned_values:
        _warned_values.add(word)
        print(
            f"kernelbay: warning: {name}={value!r} is not a boolean; use one of {'/'.join(TRUE_WORDS)} (on) "
            f"or {'/'.join(w for w in FALSE_WORDS if w)} or empty (off); treated as off",
            file=sys.stderr,
        )
    return False


def _tracing() -> bool:
    if _configured:
        return True
    if env_flag("KERNELBAY_TRACE", os.environ.get("KERNELBAY_TRACE")):
        enable_trace()
        return True
    # a host application may have turned kernelbay's debug log on itself
    return "logging" in sys.modules and _logger().isEnabledFor(10)


def trace(msg: str, *args: object) -> None:
    if _tracing():
        _logger().debug(msg, *args)


def warn(msg: str, *args: object) -> None:
    _logger().warning(msg, *args)
