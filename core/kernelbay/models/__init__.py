"""The architectures plugins provide, by name.

`from kernelbay.models import LlamaForCausalLM` resolves that architecture through the registry on
every access (PEP 562); nothing is cached here, so the attribute and `resolve()` always agree (the
registry caches, and forgets on a later registration or unregister_provider). Building a model from
a checkpoint is the engine's job (`from kernelbay_engine import AutoModelForCausalLM`).
"""

from __future__ import annotations


def __getattr__(name: str):
    if name.startswith("_"):
        raise AttributeError(f"module 'kernelbay.models' has no attribute {name!r}")
    from kernelbay import resolve
    from kernelbay.errors import UnknownNameError
    from kernelbay.registry._imports import NotProvided

    try:
        return resolve("model", name)
    except (UnknownNameError, NotProvided) as err:  # a stale entry point provides nothing: hasattr() is False
        raise AttributeError(str(err)) from err


def __dir__() -> list[str]:
    from kernelbay.registry import names

    return sorted(set(globals()) | set(names("model")))


__all__: list[str] = []
