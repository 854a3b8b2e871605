"""The registry a worker process starts from: the parent's exported providers, replayed lazily.

The parent's plugin filters win: a worker serves the parent's model, so it must resolve exactly what the parent
resolves. `KERNELBAY_PLUGINS` / `KERNELBAY_DISABLE_PLUGINS` travel with the export as the parent read them (set or
unset), replacing whatever the worker's own environment says, and every external provider the parent holds
(custom dirs and runtime registrations included) is recorded by module name, imported only when resolved.
"""

from __future__ import annotations

import os
import sys

PLUGIN_FILTERS = ("KERNELBAY_PLUGINS", "KERNELBAY_DISABLE_PLUGINS", "KERNELBAY_PREFER")


def registry_handoff() -> dict:
    """What a worker needs to rebuild this process's registry (JSON- and pickle-safe)."""
    from kernelbay.registry import default_registry

    return {
        "providers": default_registry().export_providers(),
        "environ": {name: os.environ.get(name) for name in PLUGIN_FILTERS},
    }


def adopt_registry(handoff: dict) -> list[str]:
    """Make this process's registry the parent's (see the module docstring); returns the exported provider modules
    already imported once it is rebuilt (none: it stays lazy)."""
    from kernelbay.registry import Registry, reset_registry

    environ = dict(os.environ)
    for name, value in handoff["environ"].items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    registry = reset_registry(Registry(environ=environ))
    registry.import_providers(handoff["providers"])
    exported = {item["provider"]["module"] for item in handoff["providers"]["providers"]}
    return sorted(m for m in exported if m in sys.modules)


def registry_summary() -> list[dict]:
    """Every slot with its winner's provenance: what must be equal on every rank."""
    from kernelbay.registry import default_registry

    return sorted((slot.to_dict() for slot in default_registry().slots()), key=lambda s: (s["kind"], s["name"]))
