"""Resolved geometry of representative real checkpoints, checked against hand arithmetic on published numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from kernelbay.attention import LayerKind
from kernelbay_engine.config import ModelConfig
from tests._paths import REAL_CONFIGS as SHARED_CONFIGS

BLOCKSPARSE, FULL, NO_ATTENTION, SLIDING = (
    LayerKind.BLOCKSPARSE,
    LayerKind.FULL,
    LayerKind.NO_ATTENTION,
    LayerKind.SLIDING,
)

BF16 = FP16 = 2  # bytes per cached element
FP32 = 4


@dataclass(frozen=True)
class Expect:
    head_dim: int
    kv_heads: int
    groups: dict  # attention kind -> layer indices
    rope_type: str | None  # None: no rotary embedding (learned positions)
    kv_bytes: int  # per token, all layers, kv_cache_dtype "auto"
    mla_width: int | None = None  # cached elements per token per layer under MLA
    sliding_window: int | None = None
    architecture: str | None = None


def full(n: int) -> dict:
    return {FULL: tuple(range(n))}


NEMOTRON_NO_OP = (6, 7, 11, *range(42, 52), *range(53, 71))  # block_configs with attention.no_op = true

EXPECTED = {
    # hidden 4096 / 32 heads = 128; MHA; 32 layers x K,V x 32 heads x 128 x fp16
    "llama-2-7b-hf": Expect(4096 // 32, 32, full(32), "default", 32 * 2 * 32 * 128 * FP16),
    # GQA 8; llama3 RoPE scaling; 32 x 2 x 8 x 128 x bf16
    "meta-llama-3.1-8b": Expect(128, 8, full(32), "llama3", 32 * 2 * 8 * 128 * BF16),
    # every layer slides over 4096 tokens (MLC spells it sliding_window_size)
    "mistral-7b-v0.1": Expect(
        128, 8, {SLIDING: tuple(range(32))}, "default", 32 * 2 * 8 * 128 * BF16, sliding_window=4096
    ),
    # 896 / 14 = 64; use_sliding_window=false: all full; 24 x 2 x 2 x 64 x bf16
    "qwen2-0.5b": Expect(896 // 14, 2, full(24), "default", 24 * 2 * 2 * 64 * BF16),
    # explicit head_dim 128 (4096 / 32 happens to agree); 36 x 2 x 8 x 128 x bf16
    "qwen3-8b": Expect(128, 8, full(36), "default", 36 * 2 * 8 * 128 * BF16),
    # explicit head_dim 128 although 1024 / 16 = 64
    "qwen3-0.6b": Expect(128, 8, full(28), "default", 28 * 2 * 8 * 128 * BF16),
    # head_dim 256 (3584 / 16 = 224 is not it); even layers slide (Gemma-2 alternation)
    "gemma-2-9b": Expect(
        256,
        8,
        {SLIDING: tuple(range(0, 42, 2)), FULL: tuple(range(1, 42, 2))},
        "default",
        42 * 2 * 8 * 256 * BF16,
        sliding_window=4096,
    ),
    # sliding_window_pattern 6: layers 5, 11, 17, 23 global, the other 22 slide over 512
    "gemma-3-1b-it": Expect(
        256,
        1,
        {SLIDING: tuple(i for i in range(26) if (i + 1) % 6), FULL: (5, 11, 17, 23)},
        "default",
        26 * 2 * 1 * 256 * BF16,
        sliding_window=512,
    ),
    # MLA: q/k head 128 + 64 = 192; cache latent 512 + rope key 64 = 576 per layer, not 2 x 128 x 192
    "deepseek-v3": Expect(128 + 64, 128, full(61), "yarn", 61 * (512 + 64) * BF16, mla_width=512 + 64),
    # Kimi K2 = DeepSeek V3 geometry with 64 heads; model_type kimi_k2 parsed by kernelbay's built-in class
    "kimi-k2-instruct": Expect(
        192, 64, full(61), "yarn", 61 * 576 * BF16, mla_width=576, architecture="DeepseekV3ForCausalLM"
    ),
    # RW legacy: n_head 71, 4544 / 71 = 64; multi_query -> one KV head
    "falcon-7b-legacy-rw": Expect(
        4544 // 71, 1, full(32), "default", 32 * 2 * 1 * 64 * BF16, architecture="FalconForCausalLM"
    ),
    # new_decoder_architecture: num_kv_heads 8 wins over multi_query; 8192 / 128 = 64
    "falcon-40b-instruct": Expect(8192 // 128, 8, full(60), "default", 60 * 2 * 8 * 64 * BF16),
    # 3072 / 32 = 96; sliding_window 2047 < 4096 positions: every layer slides (as transformers' Phi3)
    "phi-3-mini-4k-instruct": Expect(
        3072 // 32, 32, {SLIDING: tuple(range(32))}, "default", 32 * 2 * 32 * 96 * BF16, sliding_window=2047
    ),
    # dense_attention_every_n_layers 2: layer i dense when (i + 1) % 2 == 0, block-sparse otherwise
    "phi-3-small-8k-instruct": Expect(
        4096 // 32,
        8,
        {BLOCKSPARSE: tuple(range(0, 32, 2)), FULL: tuple(range(1, 32, 2))},
        "default",
        32 * 2 * 8 * 128 * BF16,
    ),
    # explicit head_dim 64 (2880 / 64 = 45); layer_types alternate; no torch_dtype: float32 cache
    "gpt-oss-20b": Expect(
        64,
        8,
        {SLIDING: tuple(range(0, 24, 2)), FULL: tuple(range(1, 24, 2))},
        "yarn",
        24 * 2 * 8 * 64 * FP32,
        sliding_window=128,
    ),
    # 49 attention layers with n_heads_in_group 8 (64 / 8 = 8 KV heads), 31 no-op layers cost nothing
    "llama-3-3-nemotron-super-49b-v1": Expect(
        8192 // 64,
        64 // 8,
        {FULL: tuple(i for i in range(80) if i not in NEMOTRON_NO_OP), NO_ATTENTION: NEMOTRON_NO_OP},
        "llama3",
        49 * 2 * 8 * 128 * BF16,
    ),
    # head_dim 128 although 5120 / 64 = 80
    "qwen3-32b-fp8": Expect(128, 8, full(64), "default", 64 * 2 * 8 * 128 * BF16),
    # EAGLE-3 head: one Llama layer, fp16
    "eagle3-draft-llama3-8b-eagle3": Expect(
        4096 // 32, 8, full(1), "default", 1 * 2 * 8 * 128 * FP16, architecture="EAGLE3LlamaForCausalLM"
    ),
    # learned positions; no torch_dtype: fp32
    "gpt2": Expect(768 // 12, 12, full(12), None, 12 * 2 * 12 * 64 * FP32),
    "opt-125m": Expect(768 // 12, 12, full(12), None, 12 * 2 * 12 * 64 * FP16),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_resolved_geometry(name):
    """head_dim, KV heads, layer kinds, MLA width, RoPE type and KV bytes match the hand computation."""
    want = EXPECTED[name]
    cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / name)
    assert cfg.head_dim == want.head_dim
    assert cfg.num_key_value_heads == want.kv_heads
    assert dict(cfg.layer_groups()) == want.groups
    assert cfg.sliding_window == want.sliding_window
    assert (cfg.mla.cache_width if cfg.mla else None) == want.mla_width
    assert (cfg.rope.rope_type if cfg.rope else None) == want.rope_type
    assert cfg.kv_bytes_per_token() == want.kv_bytes
    if want.architecture:
        assert cfg.architecture == want.architecture


def test_deepseek_v2_lite_resolves_once_q_lora_rank_is_written(shared_copy):
    """With the published `"q_lora_rank": null` restored, V2-Lite is MLA without query compression."""
    cfg = ModelConfig.from_pretrained(shared_copy("deepseek-v2-lite-chat", q_lora_rank=None))
    assert cfg.mla.q_lora_rank is None and cfg.mla.kv_lora_rank == 512
    assert cfg.head_dim == 128 + 64 and cfg.v_head_dim == 128
    assert cfg.kv_bytes_per_token() == 27 * (512 + 64) * BF16  # 31104, not 27 x 2 x 16 x 192 x 2
    # YaRN factor 40, mscale_all_dim 0.707: softmax scale x (0.1 x 0.707 x ln 40 + 1)^2
    mscale = 0.1 * 0.707 * math.log(40) + 1
    assert cfg.attention_scale == pytest.approx(192**-0.5 * mscale**2)


def test_deepseek_v3_details():
    """DeepSeek V3: q_lora_rank 1536, YaRN factor 40 over 4096, block-wise FP8 weights, fp8 KV halves bytes."""
    cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / "deepseek-v3")
    assert cfg.mla.q_lora_rank == 1536 and cfg.rope.rotary_dim == 64
    assert (cfg.rope.factor, cfg.rope.original_max_position_embeddings) == (40, 4096)
    q = cfg.quantization
    assert (q.quant_method, q.element_type, q.weight_block_size, q.activation_scheme) == (
        "fp8",
        "e4m3",
        (128, 128),
        "dynamic",
    )
    assert cfg.kv_bytes_per_token("fp8_e4m3") == 61 * 576 * 1


def test_deepseek_v32_caches_the_indexer_key():
    """DeepSeek V3.2: every layer is indexed (top-k) MLA and also caches a 128-wide indexer key."""
    cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / "deepseek-v3.2")
    assert set(cfg.layer_types) == {"indexed_attention"}
    assert cfg.kv_bytes_per_token() == 61 * (512 + 64 + 128) * BF16


def test_gemma_details():
    """Gemma 2 27B scales by query_pre_attn_scalar 144, not head_dim 128; soft-caps 50 / 30; Gemma 3 local base."""
    g2 = ModelConfig.from_pretrained(SHARED_CONFIGS / "gemma-2-27b")
    assert g2.attention_scale == pytest.approx(144**-0.5)
    assert (g2.attn_logit_softcapping, g2.final_logit_softcapping) == (50.0, 30.0)
    g3 = ModelConfig.from_pretrained(SHARED_CONFIGS / "gemma-3-1b-it")
    assert (g3.rope.theta, g3.rope.local_theta) == (1_000_000, 10_000)


def test_partial_rotary_and_longrope():
    """Phi-4-mini rotates 0.75 x 128 = 96 channels; LongRoPE factor 131072 / 4096 = 32."""
    cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / "phi-4-mini-instruct")
    assert cfg.head_dim == 3072 // 24 and cfg.rope.rotary_dim == 96
    assert (cfg.rope.rope_type, cfg.rope.factor) == ("longrope", 32.0)
    assert len(cfg.rope.scaling["long_factor"]) == 48  # one per rotated channel pair: 96 / 2


def test_gpt_neox_rotary_pct():
    """RedPajama (GPT-NeoX): rotary_pct 1.0 of 2560 / 32 = 80 channels, base from rotary_emb_base."""
    cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / "redpajama-incite-3b-v1")
    assert (cfg.head_dim, cfg.rope.rotary_dim, cfg.rope.theta) == (80, 80, 10000)


def test_phi3_small_details():
    """Phi-3-small: muP scale 1 / head_dim, block-sparse geometry, RoPE base from rope_embedding_base."""
    cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / "phi-3-small-8k-instruct")
    assert cfg.attention_scale == pytest.approx(1 / 128)
    assert cfg.blocksparse.to_dict() == {
        "block_size": 64,
        "num_local_blocks": 16,
        "vert_stride": 8,
        "homo_head_pattern": False,
    }
    assert cfg.rope.theta == 1_000_000 and cfg.intermediate_size == 14336


def test_nemotron_ffn_widths_come_from_block_configs():
    """Nemotron-NAS: intermediate_size is null; the widest FFN is ffn_mult 5.25 x 2/3 x 8192 = 28672."""
    cfg = ModelConfig.from_pretrained(SHARED_CONFIGS / "llama-3-3-nemotron-super-49b-v1")
    assert cfg.intermediate_size == 28672
    assert cfg.layer_num_kv_heads[6] == 0 and cfg.layer_num_kv_heads[0] == 8


def test_qwen3_32b_fp8_quantization():
    """Qwen3-32B-FP8: block-wise e4m3 weights recorded as published."""
    q = ModelConfig.from_pretrained(SHARED_CONFIGS / "qwen3-32b-fp8").quantization
    assert (q.quant_method, q.element_type, q.weight_block_size, q.weight_granularity) == (
        "fp8",
        "e4m3",
        (128, 128),
        "block",
    )


def test_static_per_tensor_fp8_quantization():
    """The ModelOpt static per-tensor export: method inferred, static activations, FP8 KV cache, lm_head kept."""
    q = ModelConfig.from_pretrained(SHARED_CONFIGS / "qwen3-32b-fp8-static-pertensor").quantization
    assert (q.quant_method, q.element_type, q.weight_granularity, q.activation_scheme) == (
        "modelopt",
        "e4m3",
        "tensor",
        "static",
    )
    assert q.kv_cache_dtype == "fp8_e4m3" and q.modules_to_not_convert == ("lm_head",)


def test_gpt_oss_mxfp4_quantization():
    """gpt-oss: MXFP4 experts with attention, router, embeddings and lm_head excluded."""
    q = ModelConfig.from_pretrained(SHARED_CONFIGS / "gpt-oss-20b").quantization
    assert (q.quant_method, q.element_type, q.weight_granularity) == ("mxfp4", "e2m1", "group")
    assert "lm_head" in q.modules_to_not_convert
