"""kernelbay-engine, the runtime: `LLM` (load, schedule, generate, stream), `SamplingParams` and
`AutoModelForCausalLM`, over the contract in `kernelbay` (registry, attention protocol, selector).

Inside: `models/` (AutoModelForCausalLM, `CausalLM` base, meta-device construction, weight formats),
`layers/` (norms, rotary, linear, MLP shared by families), `loading/` (safetensors, load plan),
`attention` (the `Attention` nn.Module every model layer uses), `kv_cache` (paged block manager),
`scheduler`, `runner`, `sampling`, `llm`, and `cli` (`kernelbay run`, a `kernelbay.commands` entry point).

Names load on first access (PEP 562): `from kernelbay_engine import SamplingParams` builds nothing.
"""

from __future__ import annotations

from kernelbay.lazy import lazy_exports

_LAZY = {
    "LLM": "kernelbay_engine.llm",
    "SamplingParams": "kernelbay_engine.sampling",
    "RequestOutput": "kernelbay_engine.outputs",
    "StreamDelta": "kernelbay_engine.outputs",
    "AutoModelForCausalLM": "kernelbay_engine.models.auto",
    "CausalLM": "kernelbay_engine.models.base",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = ["AutoModelForCausalLM", "CausalLM", "LLM", "RequestOutput", "SamplingParams", "StreamDelta"]
