"""`--custom-module-dirs`: import model/backend code from a file or folder at startup."""

from __future__ import annotations

import importlib.util
import sys
from functools import partial
from pathlib import Path

from ..errors import CustomModuleDirError
from ._imports import _where
from ._records import Origin, Provider


def _module_name_for(path: Path) -> str:
    name = path.stem if path.is_file() else path.name
    if not name.isidentifier():
        raise CustomModuleDirError(
            f"custom module path {str(path)!r}: {name!r} is not a valid Python module name; "
            "rename it (letters, digits, underscores)"
        )
    return name


def _spec_for(path: Path, name: str):
    if path.is_file():
        if path.suffix != ".py":
            raise CustomModuleDirError(f"custom module file {str(path)!r} is not a .py file")
        return importlib.util.spec_from_file_location(name, path)
    init = path / "__init__.py"
    if not init.exists():
        raise CustomModuleDirError(
            f"custom module dir {str(path)!r} has no __init__.py; "
            "add one that imports your model modules (it is imported as a package)"
        )
    return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(path)])


def _check_free(name: str, path: Path) -> None:
    """A custom module takes a top-level name: refuse one that is loaded, or installed (it would shadow it for every
    later `import name`, e.g. a `tqdm.py` breaking the progress bar), unless that is this very path."""
    existing = sys.modules.get(name)
    if existing is not None:
        where = getattr(existing, "__file__", None) or "a built-in module"
        raise CustomModuleDirError(
            f"custom module {str(path)!r} would be imported as {name!r}, but a module of "
            f"that name is already loaded from {where}; rename the file or folder"
        )
    installed = _installed_location(name)
    if installed is not None and installed != path:
        raise CustomModuleDirError(
            f"custom module {str(path)!r} would be imported as {name!r}, which would shadow the installed module "
            f"{name!r} ({installed}) for every later `import {name}`; rename the file or folder"
        )


def _installed_location(name: str) -> Path | str | None:
    """Where `import name` would load a top-level module from now (a file's path, a package's folder), or None."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a broken finder entry: nothing importable under that name
        return None
    if spec is None:
        return None
    if spec.origin in (None, "built-in", "frozen"):
        locations = list(spec.submodule_search_locations or [])
        return Path(locations[0]).resolve() if locations else str(spec.origin or "a namespace package")
    origin = Path(spec.origin).resolve()
    return origin.parent if spec.submodule_search_locations is not None else origin


def _exec(path: Path, name: str) -> None:
    spec = _spec_for(path, name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        drop_modules(name)
        if isinstance(exc, KeyboardInterrupt):
            raise  # Ctrl-C: not the module's fault, and the CLI turns it into exit 130
        raise CustomModuleDirError(
            f"custom module {str(path)!r} failed at {_where(exc)}: {type(exc).__name__}: {exc}"
        ) from exc


def drop_modules(name: str) -> None:
    """Forget module `name` and its submodules, so that loading its path again executes it again."""
    for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[loaded]


def load_custom_module_dirs(paths, registry=None) -> list[str]:
    """Import each `.py` file by path and each folder as a package; registrations are custom-dir (external).

    Loading the same path twice is a no-op. Returns the module names imported now.
    """
    from . import default_registry

    registry = registry or default_registry()
    imported = []
    for raw in paths:
        path = Path(raw).expanduser().resolve()
        if str(path) in registry.custom_paths:
            continue
        if not path.exists():
            raise CustomModuleDirError(f"custom module dir {str(raw)!r} does not exist (resolved to {str(path)!r})")
        name = _module_name_for(path)
        _check_free(name, path)
        provider = Provider(name, None, None, Origin.CUSTOM_DIR, str(path))
        registry.run_in_frame(provider, partial(_exec, path, name))
        registry.custom_paths[str(path)] = name
        imported.append(name)
    return imported
