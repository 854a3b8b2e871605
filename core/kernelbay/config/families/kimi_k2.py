"""Kimi K2: DeepSeek V3's architecture under its own model_type."""

from transformers import DeepseekV3Config


class KimiK2Config(DeepseekV3Config):
    """Kimi K2's config.json names `configuration_deepseek.DeepseekV3Config` in its auto_map: the same
    fields as transformers' DeepseekV3Config, which parses it without running the folder's code."""

    model_type = "kimi_k2"
