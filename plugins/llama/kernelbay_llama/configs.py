"""Config classes for `model_type`s transformers does not know, parsed without running folder code.

They are `kernelbay.configs` entry points of kernelbay-llama (built-in: a plugin's class for the same
model_type wins). kernelbay reads these geometries (`kernelbay explain`) but has no model for them yet.
"""

from __future__ import annotations

from transformers import PretrainedConfig


class NemotronNasConfig(PretrainedConfig):
    """NVIDIA Nemotron-NAS (DeciLM): Llama layers reshaped per layer by `block_configs`. Keeps every key
    of config.json as an attribute: kernelbay reads each layer's attention (`n_heads_in_group`, `no_op`,
    `replace_with_linear`, `window_length`) and FFN (`ffn_mult`) from `block_configs`.
    `intermediate_size` and `num_key_value_heads` are null there: they vary per layer."""

    model_type = "nemotron-nas"

    def __init__(self, **kwargs):
        # transformers' RoPE standardisation reads this before it stores the remaining keys.
        self.max_position_embeddings = kwargs.get("max_position_embeddings")
        self.rope_parameters = None
        super().__init__(**kwargs)


class Phi3SmallConfig(PretrainedConfig):
    """Microsoft Phi-3-small (dense and block-sparse attention layers interleaved). Keeps every key of
    config.json as an attribute; kernelbay reads `dense_attention_every_n_layers`, the `blocksparse_*`
    geometry, `rope_embedding_base` and the muP attention scale from it."""

    model_type = "phi3small"
