"""PEP 562 lazy attributes: a package names what it exports and where, and loads each on first access."""

from __future__ import annotations

import sys

# Annotations only (never evaluated): `import kernelbay` must not pay for importing typing or collections.abc,
# so TYPE_CHECKING is the constant type checkers recognise, not typing's.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


def lazy_exports(package: str, table: Mapping[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`: name -> defining module, imported and cached on first use."""

    def __getattr__(name: str):
        module_name = table.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(module_name), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__
