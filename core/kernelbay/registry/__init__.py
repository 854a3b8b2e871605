"""The process-wide slot registry and the `register_*` doors into it."""

import sys
import threading

from ._records import (
    ANY_ARCHITECTURE,
    KINDS,
    Origin,
    Preferences,
    Provider,
    Registration,
    Slot,
    decide,
)
from ._registry import MODEL_IMPLS, Registry

_default: Registry | None = None
_default_lock = threading.Lock()


def default_registry() -> Registry:
    """This process's registry (discovery runs on first use, not at import)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Registry()
    return _default


def reset_registry(registry: Registry | None = None) -> Registry:
    """Replace the process registry (tests, or after changing KERNELBAY_* variables)."""
    global _default
    _default = registry if registry is not None else Registry()
    return _default


def _door(kind: str, what: str):
    """The `register_<kind>` function: a decorator, or with `target=` a direct registration."""

    def register(*names: str, target=None):
        # the module calling register_*(...) is the provider, not the target's module
        caller = sys._getframe(1).f_globals.get("__name__")
        if target is not None:
            default_registry().add(kind, names, target, caller=caller)
            return target

        def decorator(obj):
            default_registry().add(kind, names, obj, caller=caller)
            return obj

        return decorator

    register.__name__ = register.__qualname__ = f"register_{kind}"
    register.__doc__ = (
        f'`@register_{kind}("Name", ...)` registers {what}; without decorating, '
        f'`register_{kind}("Name", target=...)` registers a class or a lazy "package.module:Class" path.'
    )
    return register


register_model = _door("model", "architectures")
register_vision_encoder = _door("vision_encoder", "vision encoders of multimodal models")
register_draft_model = _door("draft_model", "speculative-decoding drafts, named `EAGLE3<TargetArch>`")
register_attention_backend = _door("attention_backend", "attention backends")
register_moe_backend = _door("moe_backend", "MoE kernels")
register_platform = _door("platform", "hardware platforms (`kernelbay.platforms.Platform` subclasses)")
register_config = _door("config", "transformers config classes for HF `model_type`s transformers does not know")


def load_custom_module_dirs(paths, registry: Registry | None = None) -> list[str]:
    """Import `.py` files by path and folders as packages; what they register is custom-dir (external)."""
    from ._custom_dirs import load_custom_module_dirs as load

    return load(paths, registry=registry)


def _on_default(method: str):
    """`method` of this process's registry as a module function (`kernelbay.registry.rebuild()`, ...)."""

    def call(*args, **kwargs):
        return getattr(default_registry(), method)(*args, **kwargs)

    call.__name__ = call.__qualname__ = method
    call.__doc__ = getattr(Registry, method).__doc__
    return call


resolve = _on_default("resolve")
resolve_impl = _on_default("resolve_impl")
names = _on_default("names")
rebuild = _on_default("rebuild")
unregister_provider = _on_default("unregister_provider")
export_providers = _on_default("export_providers")
import_providers = _on_default("import_providers")
prefer = _on_default("prefer")


def slot_info(kind: str, name: str, load: bool = True) -> dict | None:
    """Provenance of one slot (winner, displaced, conflict); `load` imports its providers first."""
    reg = default_registry()
    if load:
        try:
            reg.resolve(kind, name)
        except Exception:  # noqa: BLE001 - the slot (or its absence) is the answer here
            pass
    slot = reg.slot(kind, name)
    return slot.to_dict() if slot else None


def first_party_names(kind: str) -> dict[str, str]:
    """Names of `kind` the first-party plugins provide -> the distribution, installed or not (for errors that
    say what to install)."""
    from ._records import first_party_provides

    return first_party_provides(kind)


def registered_slots(obj) -> list[tuple[str, str]]:
    """Every (kind, name) `obj` registered for in this process, including slots it lost since."""
    from ._registry import import_time_registrations

    return list(dict.fromkeys(reg.key for reg, o in import_time_registrations() if o is obj))


# The exports: every public name above but the modules (the records, the doors, the process registry's API).
__all__ = [
    "ANY_ARCHITECTURE",
    "KINDS",
    "MODEL_IMPLS",
    "Origin",
    "Preferences",
    "Provider",
    "Registration",
    "Registry",
    "Slot",
    "decide",
    "default_registry",
    "export_providers",
    "first_party_names",
    "import_providers",
    "load_custom_module_dirs",
    "names",
    "prefer",
    "rebuild",
    "register_attention_backend",
    "register_config",
    "register_draft_model",
    "register_model",
    "register_moe_backend",
    "register_platform",
    "register_vision_encoder",
    "registered_slots",
    "reset_registry",
    "resolve",
    "resolve_impl",
    "slot_info",
    "unregister_provider",
]
