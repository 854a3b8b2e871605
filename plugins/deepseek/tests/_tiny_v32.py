"""kernelbay-deepseek's own tiny DeepSeek-V3.2 config: MLA + MoE as V3, plus the DSA lightning indexer."""

from __future__ import annotations

import transformers

from tests.models._tiny import COMMON, MLA, YARN, Tiny

INDEX_TOPK = 4
"""Smaller than most prompts and every decoded sequence of PROMPTS: each query past position 4 attends sparsely."""
# Mixed lengths, most longer than INDEX_TOPK (one shorter: a query that sees fewer keys than top-k pads with -1).
PROMPTS = (
    [1, 5, 9, 22, 7, 3, 8, 90, 4, 17, 33],
    [2, 30, 31],
    [11, 12, 13, 14, 15, 16, 17, 18],
    [40, 41, 42, 43, 44, 45],
)

TINY_V32: dict[str, Tiny] = {
    "deepseek_v32": Tiny(
        "deepseek-v3.2",
        lambda: transformers.DeepseekV32Config(
            **COMMON | MLA,
            q_lora_rank=24,
            n_shared_experts=1,
            n_group=4,
            topk_group=2,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            rope_parameters={**YARN, "mscale": 1.0, "mscale_all_dim": 1.0},
            index_n_heads=8,  # several heads: a key's score is rarely exactly 0 (all relus off), so no top-k ties
            index_head_dim=16,
            index_topk=INDEX_TOPK,
        ),
    ),
}
