"""What DeepSeek configs leave implicit, as kernelbay-deepseek's `register_model_type_rules` hook.

Each rule reads a `kernelbay_engine.config.ConfigView` and returns its answer, or None to leave the point to the
core's generic fields. Light to import (no torch, no transformers): hook modules load at the first config.
"""

from __future__ import annotations

import math

from kernelbay.attention import LayerKind
from kernelbay.errors import ConfigError
from kernelbay.hooks import hookimpl
from kernelbay_engine.config import IndexerSpec, LayerPlan

MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2")


@hookimpl
def register_model_type_rules(register):
    register(MLA_MODEL_TYPES, attention_scale=yarn_mla_scale, mla=q_lora_rank_from_weights)
    register("deepseek_v32", layers=v32_layers)


def yarn_mla_scale(config) -> float | None:
    """DeepSeek multiplies the MLA softmax scale 1/sqrt(qk_head_dim) by mscale² under YaRN (`mscale_all_dim`)."""
    if config.get_int("kv_lora_rank") is None:
        return None
    head_dim = config.get_int("qk_nope_head_dim") + config.get_int("qk_rope_head_dim")
    return head_dim**-0.5 * _yarn_mscale(config.rope_parameters) ** 2


def _yarn_mscale(rope_scaling: dict) -> float:
    factor = rope_scaling.get("factor") or 1.0
    mscale_all_dim = rope_scaling.get("mscale_all_dim") or 0
    if not mscale_all_dim or factor <= 1:
        return 1.0
    return 0.1 * mscale_all_dim * math.log(factor) + 1.0


def q_lora_rank_from_weights(config) -> dict | None:
    """A `q_lora_rank` config.json leaves out, read from the weights: the rows of q_a_proj, or null where queries
    are projected directly (q_proj); None when they do not tell (the core then says what to add)."""
    if config.get("kv_lora_rank") is None or not config.raw or config.written("q_lora_rank"):
        return None
    compressed = sorted(name for name in config.tensors if name.endswith("self_attn.q_a_proj.weight"))
    if compressed:
        rows = config.tensors[compressed[0]][1][0]
        config.note(f"q_lora_rank missing: {rows}, the rows of {compressed[0]}")
        return {"q_lora_rank": rows}
    if any(name.endswith("self_attn.q_proj.weight") for name in config.tensors):
        config.note("q_lora_rank missing: null, the checkpoint projects queries directly (q_proj)")
        return {"q_lora_rank": None}
    return None


INDEXER_FIELDS = ("index_n_heads", "index_head_dim", "index_topk")


def v32_layers(config) -> LayerPlan | None:
    """DeepSeek V3.2: every layer is MLA over the top-k tokens its lightning indexer picks (`index_topk`);
    this also reads layer_types written as "deepseek_sparse_attention"."""
    if config.get("index_topk") is None:
        return None
    return LayerPlan((LayerKind.INDEXED,) * config.num_hidden_layers, indexer=_indexer(config))


def _indexer(config) -> IndexerSpec:
    missing = [name for name in INDEXER_FIELDS if config.get_int(name) is None]
    if missing:
        raise ConfigError(f"DeepSeek V3.2 sparse attention (index_topk set) lacks {', '.join(missing)}", missing)
    return IndexerSpec(*(config.get_int(name) for name in INDEXER_FIELDS))
