"""kernelbay-llama's own tiny Gemma 3 config (passed to `loaded(name, tiny)`; tests/models/_tiny.py holds the rest)."""

from __future__ import annotations

import transformers

from tests.models._tiny import COMMON, Tiny


def _gemma3_text() -> transformers.Gemma3TextConfig:
    """8 layers with the real 5:1 pattern (layer 5 global), a window shorter than the prompts, bases far apart,
    linear scaling (as gemma-3-4b) on the global layers only, and a final soft-cap."""
    return transformers.Gemma3TextConfig(
        **{**COMMON, "num_hidden_layers": 8},
        head_dim=24,
        sliding_window=5,
        sliding_window_pattern=6,
        query_pre_attn_scalar=20,
        rope_theta=50_000.0,
        rope_local_base_freq=100.0,
        rope_scaling={"rope_type": "linear", "factor": 4.0},
        final_logit_softcapping=30.0,
    )


TINY_GEMMA3: dict[str, Tiny] = {"gemma3": Tiny("gemma-3-1b-it (rope scaling as gemma-3-4b)", _gemma3_text)}
