"""The engine's bad-input errors, each with the exit code `kernelbay run` reports (docs/engine.md tabulates them
with the core's, kernelbay.errors)."""

from __future__ import annotations

from kernelbay import errors
from kernelbay.errors import InputError


class MissingWeights(InputError, ValueError):
    exit_code = 9


class PromptTooLong(InputError, ValueError):
    exit_code = 10


class SamplingParamsError(InputError, ValueError):
    """A sampling parameter out of range; the message names the parameter and the valid range."""

    exit_code = 11


class RequestTooLarge(InputError, MemoryError):
    """A single request needs more KV-cache blocks than the whole cache has: it could never run."""

    exit_code = 12


# The core's codes and those of every InputError defined here: all that `kernelbay run` exits with.
EXIT_CODES = {
    **errors.EXIT_CODES,
    **{cls.__name__: cls.exit_code for cls in InputError.__subclasses__() if cls.__module__ == __name__},
}
