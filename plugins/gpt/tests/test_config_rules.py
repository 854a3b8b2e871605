"""kernelbay-gpt's KV-head rules: the flags each family spells its shared KV heads with."""

from __future__ import annotations

import transformers

from kernelbay.attention import LayerKind
from kernelbay_engine.config import ModelConfig

FULL = LayerKind.FULL

SIZES = dict(hidden_size=64, num_attention_heads=4, num_layers=2, vocab_size=96, ffn_hidden_size=128, seq_length=64)


class ChatGLMConfig(transformers.PretrainedConfig):
    """ChatGLM's config class ships as folder code (trusted remote code); its spelling of the sizes."""

    model_type = "chatglm"


def chatglm(**flags) -> ModelConfig:
    return ModelConfig.from_hf_config(ChatGLMConfig(architectures=["ChatGLMModel"], **SIZES, **flags))


def test_chatglm_multi_query_attention_groups_its_kv_heads():
    """multi_query_attention: multi_query_group_num KV heads on every (full-attention) layer; without it, MHA."""
    grouped = chatglm(multi_query_attention=True, multi_query_group_num=2)
    assert (grouped.layer_num_kv_heads, grouped.layer_types) == ((2, 2), (FULL, FULL))
    assert any("layers: the 'chatglm' rule of kernelbay_gpt.config_rules" in note for note in grouped.notes)
    assert chatglm().num_key_value_heads == 4
