"""Config classes for GPT-family `model_type`s transformers does not know, parsed without running folder code.

`kernelbay.configs` entry points of kernelbay-gpt (built-in: a plugin's class for the same model_type wins).
"""

from __future__ import annotations

from transformers import FalconConfig


class RefinedWebModelConfig(FalconConfig):
    """Falcon checkpoints published before transformers integrated them (Falcon-7B's `RefinedWebModel`):
    FalconConfig's fields under the legacy spellings `n_head` / `n_layer`, which kernelbay reads as
    num_attention_heads / num_hidden_layers."""

    model_type = "RefinedWebModel"
