"""Config classes for `model_type`s transformers does not know, parsed without running folder code.

They are `kernelbay.configs` entry points of kernelbay-deepseek (built-in: a plugin's class for the
same model_type wins).
"""

from __future__ import annotations

from transformers import DeepseekV3Config


class KimiK2Config(DeepseekV3Config):
    """Kimi K2 (DeepSeek V3's architecture under its own model_type): its config.json names
    `configuration_deepseek.DeepseekV3Config` in its auto_map; transformers' DeepseekV3Config parses
    the same fields without running the folder's code."""

    model_type = "kimi_k2"
