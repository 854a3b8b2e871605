"""kernelbay: a model registry, an attention-backend protocol and a selector, with plugins for the rest.

Table of contents (everything heavy is imported on first use, never by `import kernelbay`):

- registration: `register_model`, `register_vision_encoder`, `register_draft_model`,
  `register_attention_backend`, `register_moe_backend`, `register_platform`, `register_config`, `resolve`,
  `load_custom_module_dirs` (`kernelbay.registry` for the log, provenance, rebuild, export);
- errors: `KernelbayError`, `RegistrationConflict`, `UnknownNameError`, `PluginImportError`,
  `ConfigError`, `NoTarget` (`kernelbay.errors`);
- architectures by name: `from kernelbay.models import X`;
- attention: `AttentionBackend`, `select_attention_backend` (`kernelbay.attention`);
- MoE kernels: `MoEBackend`, `select_moe_backend` (`kernelbay.moe`);
- the conformance kit: `kernelbay.testing`, `kernelbay check-backend NAME`.

The runtime (`LLM`, `SamplingParams`, `AutoModelForCausalLM`, config resolution, layers, loading, `run` and
`explain`) is the separate distribution kernelbay-engine: `from kernelbay_engine import LLM, SamplingParams`.
"""

from __future__ import annotations

from ._version import __version__
from .lazy import lazy_exports

# name -> module that defines it. Nothing below is imported by `import kernelbay` itself: plugins
# pay for the registry when they first use a decorator, users pay for torch when they first build a model.
_LAZY = {
    **dict.fromkeys(
        ("ConfigError", "KernelbayError", "NoTarget", "PluginImportError", "RegistrationConflict", "UnknownNameError"),
        "kernelbay.errors",
    ),
    **dict.fromkeys(
        (
            "load_custom_module_dirs",
            "register_attention_backend",
            "register_config",
            "register_draft_model",
            "register_model",
            "register_moe_backend",
            "register_platform",
            "register_vision_encoder",
            "resolve",
        ),
        "kernelbay.registry",
    ),
    "AttentionBackend": "kernelbay.attention",
    "select_attention_backend": "kernelbay.attention",
    "MoEBackend": "kernelbay.moe",
    "select_moe_backend": "kernelbay.moe",
}


# Names the runtime distribution provides: asking the core for them says where they live.
_RUNTIME = {
    **dict.fromkeys(("LLM", "SamplingParams", "AutoModelForCausalLM"), "kernelbay_engine"),
    "ModelConfig": "kernelbay_engine.config",
}
_lazy_getattr, __dir__ = lazy_exports(__name__, _LAZY)


def __getattr__(name: str):
    if name in _RUNTIME:
        raise AttributeError(
            f"kernelbay is the contract only; {name} is the runtime's: pip install kernelbay-engine, "
            f"then `from {_RUNTIME[name]} import {name}`"
        )
    return _lazy_getattr(name)


__all__ = ["__version__", *sorted(_LAZY)]  # noqa: PLE0604 - every lazily exported name, derived from the table
