"""The engine: `LLM` (load, schedule, generate, stream) and `SamplingParams`.

Names load on first access (PEP 562), so `from kernelbay.engine import SamplingParams` does not
build anything and `kernelbay.LLM` reaches here only when used.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_LAZY = {
    "LLM": "kernelbay.engine.llm",
    "SamplingParams": "kernelbay.engine.sampling",
    "RequestOutput": "kernelbay.engine.outputs",
    "StreamDelta": "kernelbay.engine.outputs",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = ["LLM", "RequestOutput", "SamplingParams", "StreamDelta"]
