"""Config classes kernelbay ships for `model_type`s transformers does not know.

They fill the `kernelbay.configs` slot only when it is empty: a plugin that provides the same
model type wins (built-in fills empty slots). None of them runs code from a model folder.
"""

from __future__ import annotations

import importlib

# model_type -> "module:Class"
BUILTIN_CONFIGS = {
    "kimi_k2": "kernelbay.config.families.kimi_k2:KimiK2Config",
    "nemotron-nas": "kernelbay.config.families.nemotron_nas:NemotronNasConfig",
    "phi3small": "kernelbay.config.families.phi3small:Phi3SmallConfig",
    "RefinedWebModel": "kernelbay.config.families.falcon_rw:RefinedWebModelConfig",
}


def load_builtin_config_class(model_type: str):
    """The built-in config class for `model_type`, or None when kernelbay ships none."""
    target = BUILTIN_CONFIGS.get(model_type)
    if target is None:
        return None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
