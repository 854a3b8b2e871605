"""Parameter counts from the resolved geometry: how big a model is, and how much of it one token reads.

Counted: embeddings (and an untied LM head), attention projections, FFNs (gate, up and down, or up and down where
a family rule says `gated_ffn` is False), routers and experts; norms, biases and rotary tables are left out
(under 0.1% for the models here)."""

from __future__ import annotations


def _attention(c) -> int:
    hidden, heads = c.hidden_size, c.num_attention_heads
    mla = c.mla
    if mla is None:
        kv = c.num_key_value_heads
        return hidden * heads * c.head_dim + 2 * hidden * kv * c.head_dim + heads * c.v_head_dim * hidden
    q_width = heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    q = hidden * mla.q_lora_rank + mla.q_lora_rank * q_width if mla.q_lora_rank else hidden * q_width
    kv = hidden * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank * heads * (
        mla.qk_nope_head_dim + mla.v_head_dim
    )
    return q + kv + heads * mla.v_head_dim * hidden


def parameter_counts(c) -> dict[str, int]:
    """{"total": ..., "active_per_token": ...} for a resolved `ModelConfig`."""
    embed = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    layers = [i for i, kind in enumerate(c.layer_types) if kind != "no_attention"]
    attention = _attention(c) * len(layers)
    dense_ffn = (3 if c.gated_ffn else 2) * c.hidden_size * c.intermediate_size
    moe = c.moe
    if moe is None:
        total = embed + attention + dense_ffn * c.num_hidden_layers
        return {"total": total, "active_per_token": total}
    expert = 3 * c.hidden_size * moe.intermediate_size
    shared = 3 * c.hidden_size * moe.shared_intermediate_size + c.hidden_size * moe.num_experts  # + router
    n_moe = moe.num_moe_layers
    dense = dense_ffn * (c.num_hidden_layers - n_moe)
    common = embed + attention + dense + shared * n_moe
    return {"total": common + expert * moe.num_experts * n_moe, "active_per_token": common + expert * moe.top_k * n_moe}
