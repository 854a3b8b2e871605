"""Importing a provider module and translating what goes wrong into a precise error."""

from __future__ import annotations

import importlib
from collections import namedtuple

from ..errors import MissingDependencyError, PluginImportError
from ._records import Provider


class NotProvided(PluginImportError):
    """The provider module itself does not exist (stale entry point, uninstalled package)."""


class BrokenProvider(namedtuple("BrokenProvider", "provider error")):
    """A provider that failed to import or register: listed, never half-registered."""

    __slots__ = ()

    def to_dict(self) -> dict:
        return {"provider": self.provider.to_dict(), "cause": str(self.error)}


def _fix_hint(provider: Provider) -> str:
    if provider.distribution:
        return (
            f"reinstall or fix {provider.distribution} {provider.version}, "
            f"or disable it with KERNELBAY_DISABLE_PLUGINS={provider.distribution}"
        )
    return f"fix {provider.path or provider.module}"


def _where(exc: BaseException) -> str:
    """`file:line` of the innermost frame, or of the SyntaxError itself."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    import traceback

    stack = traceback.extract_tb(exc.__traceback__)
    frames = [f for f in stack if "importlib._bootstrap" not in f.filename] or stack
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def translate(exc: BaseException, provider: Provider) -> PluginImportError:
    """One error type per cause, each naming the provider, the place and the fix."""
    who = provider.describe()
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if missing and (provider.module == missing or provider.module.startswith(missing + ".")):
        return NotProvided(
            f"provider module {provider.module!r} is not importable: {who} advertises it "
            f"but it does not exist; {_fix_hint(provider)}"
        )
    if isinstance(exc, ModuleNotFoundError):
        return MissingDependencyError(
            f"{who} needs the package {exc.name!r}, which is not installed "
            f"(imported at {_where(exc)}); install {exc.name!r} or {_fix_hint(provider)}"
        )
    if isinstance(exc, AttributeError):
        return PluginImportError(f"AttributeError inside provider {who} at {_where(exc)}: {exc}; {_fix_hint(provider)}")
    if isinstance(exc, SyntaxError):
        return PluginImportError(f"syntax error in provider {who} at {_where(exc)}: {exc.msg}; {_fix_hint(provider)}")
    if isinstance(exc, SystemExit):
        return PluginImportError(
            f"provider {who} called sys.exit({exc.code!r}) while being imported (at {_where(exc)}); a plugin must "
            f"never end the process: {_fix_hint(provider)}"
        )
    return PluginImportError(
        f"provider {who} failed at {_where(exc)}: {type(exc).__name__}: {exc}; {_fix_hint(provider)}"
    )


def import_module(provider: Provider, module: str | None = None):
    """Import the provider's module (or `module`, one it names); any failure, `sys.exit()` included, comes back as a
    translated PluginImportError. Only Ctrl-C passes through: it is the user's, not the plugin's."""
    try:
        return importlib.import_module(module or provider.module)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # every failure is translated and re-raised, so the plugin is marked broken
        raise translate(exc, provider) from exc


def load_attribute(target: str, provider: Provider):
    """`module:qual.name` -> the object, with the same error translation as a module import."""
    module_name, _, qualname = target.partition(":")
    obj = import_module(provider, module_name)
    try:
        for part in filter(None, qualname.split(".")):
            obj = getattr(obj, part)
    except AttributeError as exc:
        raise PluginImportError(
            f"{provider.describe()} advertises {target!r}, but {module_name!r} has no "
            f"attribute {qualname!r}; {_fix_hint(provider)}"
        ) from exc
    return obj
