"""The architectures plugins provide, by name.

`from kernelbay.models import LlamaForCausalLM` resolves that architecture through the registry on
first access (PEP 562) and caches it here. Building a model from a checkpoint is the engine's job
(`from kernelbay_engine import AutoModelForCausalLM`).
"""

from __future__ import annotations


def __getattr__(name: str):
    if name.startswith("_"):
        raise AttributeError(f"module 'kernelbay.models' has no attribute {name!r}")
    from kernelbay import resolve
    from kernelbay.errors import UnknownNameError

    try:
        value = resolve("model", name)
    except UnknownNameError as err:
        raise AttributeError(str(err)) from err
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    from kernelbay.registry import names

    return sorted(set(globals()) | set(names("model")))


__all__: list[str] = []
