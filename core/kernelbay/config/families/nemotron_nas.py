"""NVIDIA Nemotron-NAS (DeciLM) decoders: Llama layers reshaped per layer by `block_configs`."""

from transformers import PretrainedConfig


class NemotronNasConfig(PretrainedConfig):
    """Keeps every key of config.json as an attribute: kernelbay reads each layer's attention
    (`n_heads_in_group`, `no_op`, `replace_with_linear`, `window_length`) and FFN (`ffn_mult`) from
    `block_configs`. `intermediate_size` and `num_key_value_heads` are null there: they vary per layer."""

    model_type = "nemotron-nas"

    def __init__(self, **kwargs):
        # transformers' RoPE standardisation reads this before it stores the remaining keys.
        self.max_position_embeddings = kwargs.get("max_position_embeddings")
        self.rope_parameters = None
        super().__init__(**kwargs)
