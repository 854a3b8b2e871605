"""What DeepSeek configs leave implicit, as kernelbay-deepseek's `register_model_type_rules` hook.

Each rule reads a `kernelbay.config.ConfigView` and returns its answer, or None to leave the point to the
core's generic fields. Light to import (no torch, no transformers): hook modules load at the first config.
"""

from __future__ import annotations

import math

from kernelbay.config import INDEXED, IndexerGeometry, LayerPlan
from kernelbay.errors import ConfigError
from kernelbay.hooks import hookimpl

MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2")


@hookimpl
def register_model_type_rules(register):
    register(MLA_MODEL_TYPES, attention_scale=yarn_mla_scale)
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


INDEXER_FIELDS = ("index_n_heads", "index_head_dim", "index_topk")


def v32_layers(config) -> LayerPlan | None:
    """DeepSeek V3.2: every layer is MLA over the top-k tokens its lightning indexer picks (`index_topk`);
    this also reads layer_types written as "deepseek_sparse_attention"."""
    if config.get("index_topk") is None:
        return None
    return LayerPlan((INDEXED,) * config.num_hidden_layers, indexer=_indexer(config))


def _indexer(config) -> IndexerGeometry:
    missing = [name for name in INDEXER_FIELDS if config.get_int(name) is None]
    if missing:
        raise ConfigError(f"DeepSeek V3.2 sparse attention (index_topk set) lacks {', '.join(missing)}", missing)
    return IndexerGeometry(*(config.get_int(name) for name in INDEXER_FIELDS))
