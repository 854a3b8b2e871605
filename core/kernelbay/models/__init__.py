"""Model construction and the architectures plugins provide.

`from kernelbay.models import AutoModelForCausalLM` loads the auto class; any other public name is
an architecture (`from kernelbay.models import LlamaForCausalLM`) resolved through the registry on
first access (PEP 562) and cached here.

Inside: `auto` (resolution steps and `from_pretrained`), `base` (`CausalLM`, what every family
provides), `meta` (meta-device construction), `quant` (per-layer weight formats, FP8 blocks),
`layers/` (norms, rotary, linear, MLP shared by families), `loading/` (safetensors, load plan).
"""

from __future__ import annotations

import importlib

_LOCAL = {"AutoModelForCausalLM": "kernelbay.models.auto", "CausalLM": "kernelbay.models.base"}


def __getattr__(name: str):
    if name.startswith("_"):
        raise AttributeError(f"module 'kernelbay.models' has no attribute {name!r}")
    if name in _LOCAL:
        value = getattr(importlib.import_module(_LOCAL[name]), name)
    else:
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

    return sorted(set(globals()) | set(_LOCAL) | set(names("model")))


__all__ = ["AutoModelForCausalLM", "CausalLM"]
