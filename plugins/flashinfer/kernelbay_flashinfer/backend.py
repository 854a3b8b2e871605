"""FLASHINFER: FlashInfer's paged-KV prefill (any query lengths) and decode (one token per request) kernels."""

from __future__ import annotations

import torch

from kernelbay.attention import ANY, AttentionBackend, KVLayout

from .availability import current_availability
from .metadata import FlashInferMetadata
from .plans import PlanKey, planned_wrapper


class FlashInferBackend(AttentionBackend[FlashInferMetadata]):
    name = "FLASHINFER"
    Metadata = FlashInferMetadata
    # FlashInfer's documented support (the head dims its kernels are compiled for, fp16/bf16 compute,
    # fp8 KV with per-tensor scales, any page size, NHD and HND, window_left, logits_soft_cap, any GQA ratio).
    head_sizes = frozenset({64, 128, 256})
    dtypes = frozenset({"bfloat16", "float16"})
    kv_cache_dtypes = frozenset({"auto", "bfloat16", "float16", "fp8_e4m3"})
    kv_layouts = frozenset(KVLayout)
    sliding_window = True
    logit_softcap = True
    platforms = frozenset({"cuda"})
    block_sizes = ANY  # FlashInfer pages at any page size
    preferred_block_size = 16

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        return current_availability()

    def plan_key(self, q: torch.Tensor, metadata: FlashInferMetadata, causal: bool) -> PlanKey:
        g = self.geometry
        return PlanKey(
            kind="decode" if metadata.is_decode_only else "prefill",
            device=str(q.device),
            layout=metadata.layout.value,
            num_heads=g.num_heads,
            num_kv_heads=g.num_kv_heads,
            head_dim=g.head_dim,
            scale=g.scale,
            window_left=g.sliding_window - 1 if g.sliding_window else -1,
            logit_softcap=g.logit_softcap,
            causal=causal,
            q_dtype=q.dtype,
            kv_dtype=self.kv_cache.dtype,
        )

    def _attend(self, q: torch.Tensor, metadata: FlashInferMetadata, args) -> torch.Tensor:
        wrapper = planned_wrapper(self.plan_key(q, metadata, self.is_causal(args)), metadata)
        scales = {}
        if self.kv_cache.dtype == torch.float8_e4m3fn:  # FlashInfer folds k_scale into sm_scale, v_scale into out
            scales = {"k_scale": self.k_scale, "v_scale": self.v_scale}
        return wrapper.run(q.contiguous(), (self.kv_cache[0], self.kv_cache[1]), **scales)
