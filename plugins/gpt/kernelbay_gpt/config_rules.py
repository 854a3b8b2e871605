"""What GPT-family configs leave implicit, as kernelbay-gpt's `register_model_type_rules` hook.

Each rule reads a `kernelbay_engine.config.ConfigView` and returns its answer, or None to leave the point to the
core's generic fields. Light to import (no torch, no transformers): hook modules load at the first config.
"""

from __future__ import annotations

from kernelbay.attention import LayerKind
from kernelbay.hooks import hookimpl
from kernelbay_engine.config import LayerPlan

FALCON_TYPES = ("falcon", "RefinedWeb", "RefinedWebModel")


@hookimpl
def register_model_type_rules(register):
    register(("gpt2", "gpt_bigcode", "falcon", "RefinedWebModel"), intermediate_size=four_times_hidden)
    register(FALCON_TYPES, architecture=falcon_legacy_architecture, layers=falcon_kv_heads)
    register("chatglm", layers=chatglm_kv_heads)
    register("bloom", position_embedding=lambda config: "alibi")
    register(("gpt2", "gpt_bigcode", "opt", "gpt_neox", "falcon", "RefinedWebModel", "bloom"), gated_ffn=not_gated)


def not_gated(config) -> bool:
    """Their MLP is up -> activation -> down: two matrices, not Llama's three (parameter counts read it)."""
    return False


def four_times_hidden(config) -> int:
    """GPT-2, GPT-BigCode, Falcon: the FFN is 4 x hidden where config.json leaves its width null (as documented)."""
    return config.get_int("intermediate_size", "ffn_hidden_size", "n_inner") or 4 * config.hidden_size


def falcon_legacy_architecture(config) -> str | None:
    """Falcon checkpoints published before transformers integrated the family name their class RWForCausalLM."""
    if (config.get("architectures") or ("",))[0] != "RWForCausalLM":
        return None
    config.note("legacy architecture RWForCausalLM resolves as FalconForCausalLM")
    return "FalconForCausalLM"


# ---- KV heads, spelled the family's way: every layer attends fully, with the KV heads the flags give ----------
def falcon_kv_heads(config) -> LayerPlan:
    """Falcon: multi_query (7B, RW) shares one KV head; new_decoder_architecture (40B, 180B) groups num_kv_heads."""
    if config.get_bool("multi_query") and not config.get_bool("new_decoder_architecture"):
        return _full_attention(config, 1)
    return _full_attention(config, config.get_int("num_kv_heads", "n_head_kv", default=config.num_attention_heads))


def chatglm_kv_heads(config) -> LayerPlan | None:
    """ChatGLM's multi_query_attention: multi_query_group_num KV heads."""
    if not config.get_bool("multi_query_attention"):
        return None
    return _full_attention(config, config.get_int("multi_query_group_num", default=1))


def _full_attention(config, kv_heads: int) -> LayerPlan:
    n = config.num_hidden_layers
    return LayerPlan((LayerKind.FULL,) * n, kv_heads=(kv_heads,) * n)
