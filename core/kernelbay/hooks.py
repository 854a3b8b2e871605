"""pluggy hooks for what is not a slot: the core hosts them, the distribution that calls a hook declares it.

Plugins implement `register_*(register)` callbacks; the core owns collection and provenance. A distribution
declares the hooks it calls with `declare_hooks(Specs)` (kernelbay-engine: `register_model_type_rules`, a model
family's config rules). Hook modules (entry-point group `kernelbay.hooks`) load at the first hook call, not at
import::

    from kernelbay.hooks import hookimpl

    @hookimpl
    def register_model_type_rules(register):
        register("gemma2", layers=gemma2_layers)
"""

from __future__ import annotations

import threading
from collections import namedtuple
from typing import TYPE_CHECKING

import pluggy

from ._trace import warn

if TYPE_CHECKING:
    from .registry._records import Provider

PROJECT = "kernelbay"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# A hook plugin that failed to import: listed (doctor, a warning), never fatal.
BrokenHookPlugin = namedtuple("BrokenHookPlugin", "name distribution cause")


_lock = threading.Lock()
_manager: pluggy.PluginManager | None = None
_broken: list[BrokenHookPlugin] = []
_providers: dict[str, Provider] = {}  # hook plugin name -> its entry point's provider
_declared: set[type] = set()  # hook specification classes declared by distributions (declare_hooks)


def _load_entry_point_plugins(pm: pluggy.PluginManager) -> None:
    from .registry import default_registry
    from .registry._imports import import_module

    registry = default_registry()
    for entry in registry.discovery().in_group("kernelbay.hooks"):
        provider = entry.provider
        try:
            module = import_module(provider)
            pm.register(module, name=entry.name)
            _providers[entry.name] = provider
        except Exception as exc:  # noqa: BLE001 - a broken hook plugin is listed (doctor, a warning), never fatal
            _broken.append(BrokenHookPlugin(entry.name, entry.distribution, str(exc)))
            warn("hook plugin %r of %s is broken and contributes no hooks: %s", entry.name, entry.distribution, exc)


def plugin_manager() -> pluggy.PluginManager:
    """The process's hook manager; entry-point hook modules load on first call."""
    global _manager
    with _lock:
        if _manager is None:
            pm = pluggy.PluginManager(PROJECT)
            _load_entry_point_plugins(pm)
            _manager = pm
        return _manager


def declare_hooks(specs: type) -> None:
    """Add a distribution's hook specifications (a class of `@hookspec` methods) to the process's manager, once:
    implementations are then checked against them. The distribution calling a hook declares it before."""
    pm = plugin_manager()
    with _lock:
        if specs not in _declared:
            pm.add_hookspecs(specs)
            _declared.add(specs)


def broken_hook_plugins() -> list[BrokenHookPlugin]:
    plugin_manager()
    return list(_broken)


def hook_provider(plugin: str) -> Provider:
    """Who hook plugin `plugin` is: its entry point's provider, or (registered at runtime) an external one."""
    from .registry._records import Provider

    plugin_manager()
    return _providers.get(plugin) or Provider(plugin)


def call_hook(hook_name: str, make_register) -> None:
    """Call each implementation of `hook_name` with `make_register(plugin name)` (none: a hook no installed plugin
    implements and none declared); a raise names the plugin."""
    caller = getattr(plugin_manager().hook, hook_name, None)
    for impl in caller.get_hookimpls() if caller is not None else ():
        try:
            impl.function(register=make_register(impl.plugin_name))
        except Exception as exc:
            from .errors import PluginImportError

            raise PluginImportError(
                f"hook {hook_name} of plugin {impl.plugin_name!r} raised {type(exc).__name__}: {exc}"
            ) from exc


def collect(hook_name: str) -> list[tuple[object, str]]:
    """Call hook `hook_name` with a `register` callback; return (item, plugin name) pairs in call order."""
    collected: list[tuple[object, str]] = []

    def make_register(plugin: str):
        return lambda *item: collected.append((item[0] if len(item) == 1 else item, plugin))

    call_hook(hook_name, make_register)
    return collected


def reset_hooks() -> None:
    """Forget the manager (tests; after the registry is reset)."""
    global _manager
    with _lock:
        _manager = None
        _declared.clear()
        _broken.clear()
        _providers.clear()
