"""kernelbay: a model registry, an attention-backend protocol and a selector, with plugins for the rest.

Table of contents (everything heavy is imported on first use, never by `import kernelbay`):

- registration: `register_model`, `register_vision_encoder`, `register_draft_model`,
  `register_attention_backend`, `register_platform`, `register_config`, `resolve`,
  `load_custom_module_dirs` (`kernelbay.registry` for the log, provenance, rebuild, export);
- errors: `KernelbayError`, `RegistrationConflict`, `UnknownNameError`, `PluginImportError`,
  `ConfigError`, `NoTarget` (`kernelbay.errors`);
- models: `AutoModelForCausalLM`, `ModelConfig` (`kernelbay.models`, `kernelbay.config`);
- attention: `AttentionBackend`, `select_attention_backend` (`kernelbay.attention`);
- engine: `LLM`, `SamplingParams` (`kernelbay.engine`).
"""

from __future__ import annotations

from ._lazy import lazy_exports
from ._version import __version__

# name -> module that defines it. Nothing below is imported by `import kernelbay` itself: plugins
# pay for the registry when they first use a decorator, users pay for torch when they first build a model.
_LAZY = {
    **dict.fromkeys(("ConfigError", "KernelbayError", "NoTarget", "PluginImportError", "RegistrationConflict",
                     "UnknownNameError"), "kernelbay.errors"),
    **dict.fromkeys(("load_custom_module_dirs", "register_attention_backend", "register_config",
                     "register_draft_model", "register_model", "register_platform", "register_vision_encoder",
                     "resolve"), "kernelbay.registry"),
    "AutoModelForCausalLM": "kernelbay.models",
    "ModelConfig": "kernelbay.config",
    "AttentionBackend": "kernelbay.attention",
    "select_attention_backend": "kernelbay.attention",
    "LLM": "kernelbay.engine",
    "SamplingParams": "kernelbay.engine",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = [
    "__version__", "AttentionBackend", "AutoModelForCausalLM", "ConfigError", "KernelbayError", "LLM",
    "ModelConfig", "NoTarget", "PluginImportError", "RegistrationConflict", "SamplingParams", "UnknownNameError",
    "load_custom_module_dirs", "register_attention_backend", "register_config", "register_draft_model",
    "register_model", "register_platform", "register_vision_encoder", "resolve", "select_attention_backend",
]
