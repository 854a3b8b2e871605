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


class DraftMismatch(InputError, ValueError):
    """`speculative=DIR` names a folder that is no EAGLE-3 draft of this target: not a draft, a draft trained for
    another model type, or one whose vocabulary, hidden size or aux layers do not fit the target (the message names
    the field, both values and what to use instead). Raised before any token is generated."""

    exit_code = 14


class BackendFailure(errors.KernelbayError, RuntimeError):
    """A kernel backend raised inside `forward`, or a step's logits came out NaN or +inf: the message names the
    backend(s) with their distribution, the layer and the engine step; the backend's own exception is the
    `__cause__` (the CLI prints its traceback under --trace). Not an input error: the installed kernel failed."""

    exit_code = 13


class ModelConstructionError(errors.KernelbayError, RuntimeError):
    """A model class's constructor raised: the message names the class, its provider and that provider's origin
    (distribution or custom dir), with the cause; exit code 1 like any other kernelbay error."""


# The core's codes and those of every error defined here: all that `kernelbay run` exits with.
EXIT_CODES = {
    **errors.EXIT_CODES,
    **{cls.__name__: cls.exit_code for cls in InputError.__subclasses__() if cls.__module__ == __name__},
    BackendFailure.__name__: BackendFailure.exit_code,
}
