"""Microsoft Phi-3-small: dense and block-sparse attention layers interleaved."""

from transformers import PretrainedConfig


class Phi3SmallConfig(PretrainedConfig):
    """Keeps every key of config.json as an attribute; kernelbay reads `dense_attention_every_n_layers`,
    the `blocksparse_*` geometry, `rope_embedding_base` and the muP attention scale from it."""

    model_type = "phi3small"
