"""Tiny configs of architectures kernelbay has no native family for (the fallback serves them).

Each keeps what makes its architecture differ from Llama: partial rotary, biases, q/k norms, logit and
residual multipliers, layer norms, NoPE layers, and sliding windows shorter than the test prompts
(5 tokens, mixed with full layers where the architecture mixes them).
"""

from __future__ import annotations

import transformers

from tests.models._tiny import COMMON, Tiny

WINDOW = 5
MIXED = ["sliding_attention", "full_attention", "sliding_attention"]

TINY_FALLBACK = {
    "olmo": Tiny("allenai/OLMo-1B-hf", lambda: transformers.OlmoConfig(**COMMON, clip_qkv=8.0)),
    "olmo2": Tiny("allenai/OLMo-2-1124-7B", lambda: transformers.Olmo2Config(**COMMON)),
    "olmo3": Tiny(
        "allenai/Olmo-3-7B", lambda: transformers.Olmo3Config(**COMMON, sliding_window=WINDOW, layer_types=MIXED)
    ),
    "granite": Tiny(
        "ibm-granite/granite-3.0-2b-instruct",
        lambda: transformers.GraniteConfig(
            **COMMON, embedding_multiplier=6.0, residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=4.0
        ),
    ),
    "phi": Tiny(
        "microsoft/phi-2",
        lambda: transformers.PhiConfig(**{**COMMON, "num_key_value_heads": 4}, partial_rotary_factor=0.5),
    ),
    "starcoder2": Tiny(
        "bigcode/starcoder2-3b", lambda: transformers.Starcoder2Config(**COMMON, sliding_window=WINDOW, use_bias=True)
    ),
    "cohere": Tiny(
        "CohereForAI/c4ai-command-r-v01",
        lambda: transformers.CohereConfig(**COMMON, logit_scale=0.25, use_qk_norm=True),
    ),
    "cohere2": Tiny(
        "CohereForAI/c4ai-command-r7b-12-2024",
        lambda: transformers.Cohere2Config(**COMMON, logit_scale=0.25, sliding_window=WINDOW, layer_types=MIXED),
    ),
    "glm4": Tiny(
        "THUDM/GLM-4-9B-0414", lambda: transformers.Glm4Config(**COMMON, head_dim=16, partial_rotary_factor=0.5)
    ),
    "smollm3": Tiny("HuggingFaceTB/SmolLM3-3B", lambda: transformers.SmolLM3Config(**COMMON, no_rope_layers=[1, 1, 0])),
    "exaone4": Tiny(
        "LGAI-EXAONE/EXAONE-4.0-1.2B",
        lambda: transformers.Exaone4Config(**COMMON, sliding_window=WINDOW, layer_types=MIXED),
    ),
}
