"""Renamed names that keep working for one minor release with a `DeprecationWarning` (docs/contract.md, "The rule").

Each helper gives the old spelling a path to the new one and says, once per use, which name replaces it and in
which release the old one goes."""

from __future__ import annotations

import functools
import warnings

REMOVED_IN = "kernelbay 0.2"


def warn_renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    warnings.warn(f"{old} is deprecated and goes in {REMOVED_IN}: use {new}", DeprecationWarning, stacklevel=stacklevel)


def renamed_field(cls: type, old: str, new: str) -> type:
    """A frozen dataclass whose field `new` was called `old`: `cls(old=...)` and `obj.old` still work, warning."""
    init = cls.__init__  # type: ignore[misc]  # the dataclass's own, wrapped on the class itself
    owner = cls.__qualname__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if old in kwargs:
            if new in kwargs:
                raise TypeError(f"{owner}() got both {old}= and its replacement {new}=")
            warn_renamed(f"{owner}({old}=...)", f"{new}=")
            kwargs[new] = kwargs.pop(old)
        init(self, *args, **kwargs)

    def read_old(self):
        warn_renamed(f"{owner}.{old}", f"{owner}.{new}")
        return getattr(self, new)

    cls.__init__ = __init__  # type: ignore[misc]
    setattr(cls, old, property(read_old, doc=f"Deprecated spelling of `{new}` (goes in {REMOVED_IN})."))
    return cls


def renamed_declaration(cls: type, old: str, new: str) -> None:
    """A kernel class that declares `old` (the earlier spelling of the declaration `new`) is read as declaring
    `new`, with a warning naming the class: a plugin built against the earlier release keeps its capabilities."""
    if old in vars(cls) and new not in vars(cls):
        warn_renamed(f"{cls.__module__}.{cls.__qualname__} declares {old}: the declaration", new, stacklevel=4)
        setattr(cls, new, vars(cls)[old])


def renamed_constants(module: str, renames: dict[str, tuple[str, object]]):
    """A module `__getattr__` serving each old constant name as its new value (old -> (new name, value))."""

    def __getattr__(name: str):
        if name not in renames:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new, value = renames[name]
        warn_renamed(f"{module}.{name}", f"{module}.{new}")
        return value

    return __getattr__
