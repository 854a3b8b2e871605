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
FALSE_WORDS = ("0", "false", "no", "off")
_warned_values: set[str] = set()


def bool_word(text: str) -> bool | None:
    """True or False for an on/off word (any case, spaces stripped), None for anything else: the one parser of
    the words (environment variables, backend options)."""
    word = text.strip().lower()
    return True if word in TRUE_WORDS else False if word in FALSE_WORDS else None


def env_flag(name: str, value: str | None) -> bool:
    """An on/off environment variable: 1/true/yes/on or 0/false/no/off/empty (any case).

    Anything else counts as off and is reported once on stderr, naming the variable: a typo must not
    silently turn a feature on (nor crash every command, since this runs before any command starts)."""
    answer = bool_word(value or "0")
    if answer is None and value not in _warned_values:
        _warned_values.add(str(value))
        print(
            f"kernelbay: warning: {name}={value!r} is not a boolean; use one of {'/'.join(TRUE_WORDS)} (on) "
            f"or {'/'.join(FALSE_WORDS)} or empty (off); treated as off",
            file=sys.stderr,
        )
    return bool(answer)


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
