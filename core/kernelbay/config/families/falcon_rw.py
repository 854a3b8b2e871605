"""Falcon checkpoints published before transformers integrated them (`RWForCausalLM`)."""

from transformers import FalconConfig


class RefinedWebModelConfig(FalconConfig):
    """Falcon-7B's original `RefinedWebModel` config: FalconConfig's fields under the legacy spellings
    `n_head` / `n_layer`, which kernelbay reads as num_attention_heads / num_hidden_layers."""

    model_type = "RefinedWebModel"
