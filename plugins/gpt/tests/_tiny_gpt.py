"""kernelbay-gpt's tiny configs (passed to `loaded(name, tiny)`): each has the structure of a real checkpoint."""

from __future__ import annotations

import transformers

from tests.models._tiny import Tiny

SIZES = dict(vocab_size=96, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _gpt2() -> transformers.GPT2Config:
    return transformers.GPT2Config(**SIZES, n_embd=64, n_layer=3, n_head=4, n_positions=512)


def _opt(**kw) -> transformers.OPTConfig:
    return transformers.OPTConfig(
        **SIZES,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        ffn_dim=96,
        max_position_embeddings=512,
        **kw,
    )


def _neox(**kw) -> transformers.GPTNeoXConfig:
    return transformers.GPTNeoXConfig(
        **SIZES,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=512,
        **{"tie_word_embeddings": False, **kw},
    )


def _falcon(**kw) -> transformers.FalconConfig:
    return transformers.FalconConfig(
        **SIZES, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, max_position_embeddings=512, **kw
    )


TINY_GPT: dict[str, Tiny] = {
    "gpt2": Tiny("gpt2 (Conv1D weights, learned positions, gelu_new)", _gpt2),
    "gpt2-layer-scaled": Tiny(
        "GPT-2 with scale_attn_by_inverse_layer_idx (Stanford CRFM's Mistral GPT-2s)",
        lambda: transformers.GPT2Config(
            **SIZES, n_embd=64, n_layer=3, n_head=4, n_positions=512, scale_attn_by_inverse_layer_idx=True
        ),
    ),
    "opt-125m": Tiny("opt-125m (pre-norm, positions offset by 2)", lambda: _opt(do_layer_norm_before=True)),
    "opt-350m": Tiny(
        "opt-350m (post-norm, project_in/out to a narrower embedding)",
        lambda: _opt(do_layer_norm_before=False, word_embed_proj_dim=32),
    ),
    "neox-parallel": Tiny(
        "pythia (parallel residual, rotary_pct 0.25; tied here, as a tied NeoX checkpoint would be)",
        lambda: _neox(rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=True),
    ),
    "neox-sequential": Tiny(
        "redpajama-incite-3b (sequential residual, full rotary)",
        lambda: _neox(rotary_pct=1.0, use_parallel_residual=False),
    ),
    "falcon-7b": Tiny(
        "falcon-7b (multi-query, parallel attention, one input_layernorm, no biases)",
        lambda: _falcon(multi_query=True, new_decoder_architecture=False, parallel_attn=True, bias=False),
    ),
    "falcon-40b": Tiny(
        "falcon-40b (new decoder architecture: 2 grouped KV heads, ln_attn + ln_mlp)",
        lambda: _falcon(new_decoder_architecture=True, num_kv_heads=2, parallel_attn=True, bias=False),
    ),
    "falcon-11b": Tiny(
        "falcon2-11b (new decoder architecture with num_ln_in_parallel_attn=1: one input_layernorm)",
        lambda: _falcon(new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1, bias=False),
    ),
    "falcon-sequential": Tiny(
        "Falcon's original decoder without parallel_attn or multi-query (per-head [q, k, v], biases)",
        lambda: _falcon(multi_query=False, new_decoder_architecture=False, parallel_attn=False, bias=True),
    ),
}
