"""Every exception kernelbay raises on purpose; each message says what is wrong and how to fix it.

A user-input error (InputError) carries the exit code the CLI reports as `exit_code` (`kernelbay explain`,
and the commands plugins add, such as `kernelbay run`); EXIT_CODES collects them (kernelbay-engine's own, 9-13,
are in kernelbay_engine.errors), docs/engine.md tabulates them with their meanings.
"""

from __future__ import annotations

from collections.abc import Iterable


class KernelbayError(Exception):
    """Base class of kernelbay's own errors."""


class RegistrationConflict(KernelbayError):
    """Two external providers claim one slot and nothing says which to prefer."""


class UnknownNameError(KernelbayError, LookupError):
    """A slot name (architecture, backend, platform, model_type) nobody provides."""


class PluginImportError(KernelbayError, ImportError):
    """A plugin module failed to import or register; carries the plugin and the cause."""


class MissingDependencyError(PluginImportError):
    """A plugin imports a package that is not installed."""


class CustomModuleDirError(KernelbayError):
    """A custom module dir (or file) does not exist or fails to import."""


class ConfigError(KernelbayError, ValueError):
    """A model config or option set that cannot work; lists every violation."""

    def __init__(self, message: str, violations: Iterable[str] = ()):
        self.violations = list(violations)
        if self.violations:
            message = message + "\n" + "\n".join(f"  - {v}" for v in self.violations)
        super().__init__(message)


class InputError(KernelbayError):
    """A bad user input named precisely; `exit_code` is what the CLI exits with (docs/engine.md)."""

    exit_code = 1


class ModelFolderNotFound(InputError, ConfigError, FileNotFoundError):
    exit_code = 3


class MissingConfigFile(InputError, ConfigError, FileNotFoundError):
    exit_code = 4


class MalformedConfig(InputError, ConfigError):
    """config.json (or a sibling JSON file) does not parse; the message gives line and column."""

    exit_code = 5


class UnsupportedArchitecture(InputError, UnknownNameError):
    exit_code = 6


class UnknownBackend(InputError, UnknownNameError):
    exit_code = 7


class IncapableBackend(InputError, ConfigError):
    exit_code = 8


# Every InputError defined here (all direct subclasses) by class name: what docs/engine.md tabulates.
_CODED: list[type[InputError]] = [InputError, *InputError.__subclasses__()]
EXIT_CODES = {cls.__name__: cls.exit_code for cls in _CODED}


class NoTarget(KernelbayError):
    """Raised by an alternative implementation that declines to build for this config."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


def close_matches(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """Names in `known` that look like `name` (case-insensitive), best first."""
    import difflib

    known = list(known)
    by_lower = {k.lower(): k for k in known}
    hits = difflib.get_close_matches(name.lower(), list(by_lower), n=n, cutoff=0.6)
    return [by_lower[h] for h in hits]


def unknown_name_message(what: str, name: str, known: Iterable[str]) -> str:
    """`Unknown <what>: 'X'. Known: a, b. Did you mean: c?` in one place."""
    known = sorted(set(known))
    msg = f"Unknown {what}: {name!r}. Known {what}s: {', '.join(known) or '(none installed)'}."
    matches = close_matches(name, known)
    if matches:
        msg += f" Did you mean: {', '.join(matches)}?"
    return msg
