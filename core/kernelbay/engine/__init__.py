"""The engine: `LLM` (load, schedule, generate, stream) and `SamplingParams`.

Names load on first access (PEP 562), so `from kernelbay.engine import SamplingParams` does not
build anything and `kernelbay.LLM` reaches here only when used.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "LLM": "kernelbay.engine.llm",
    "SamplingParams": "kernelbay.engine.sampling",
    "RequestOutput": "kernelbay.engine.outputs",
    "StreamDelta": "kernelbay.engine.outputs",
}


def __getattr__(name: str):
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'kernelbay.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["LLM", "RequestOutput", "SamplingParams", "StreamDelta"]
