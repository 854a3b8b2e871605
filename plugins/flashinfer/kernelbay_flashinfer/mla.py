"""FLASHINFER_MLA: DeepSeek multi-head latent attention on `flashinfer.mla.BatchMLAPagedAttentionWrapper`.

The wrapper attends in the latent space (matrix absorption): queries are multiplied by each head's
W_UK before the kernel, and the latent output by W_UV after it. Both come from the layer's `kv_b_proj`
(latent -> per-head k_nope || v). The kernel is compiled for kv_lora_rank 512 and qk_rope_head_dim 64.
"""

from __future__ import annotations

import torch

from kernelbay.attention import ANY, AttentionBackend, KVLayout

from .availability import current_availability
from .metadata import FlashInferMetadata
from .plans import MLA_ROPE_DIM, PlanKey, planned_wrapper

CKV_DIM, KPE_DIM = 512, MLA_ROPE_DIM


class FlashInferMLABackend(AttentionBackend[FlashInferMetadata]):
    name = "FLASHINFER_MLA"
    Metadata = FlashInferMetadata
    mla = True
    head_sizes = ANY  # absorbed: the kernel sees latent 512 + rope 64 whatever qk_nope_head_dim is
    dtypes = frozenset({"bfloat16", "float16"})
    kv_cache_dtypes = frozenset({"auto", "bfloat16", "float16"})
    kv_layouts = frozenset({KVLayout.NHD})
    platforms = frozenset({"cuda"})
    block_sizes = ANY  # FlashInfer pages at any page size
    preferred_block_size = 16

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        return current_availability()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        mla = self.geometry.mla
        if mla is None or (mla.kv_lora_rank, mla.qk_rope_head_dim) != (CKV_DIM, KPE_DIM):
            got = f"kv_lora_rank={mla.kv_lora_rank}, qk_rope_head_dim={mla.qk_rope_head_dim}" if mla else "no MLA"
            raise ValueError(
                f"FLASHINFER_MLA runs FlashInfer's MLA kernel, compiled for kv_lora_rank={CKV_DIM} "
                f"and qk_rope_head_dim={KPE_DIM} (DeepSeek-V2/V3); layer {self.geometry.layer_idx} "
                f"has {got}. Use another MLA backend (see `kernelbay explain`)."
            )
        self._absorbed: tuple[torch.Tensor, torch.Tensor] | None = None

    def absorbed_weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [H, qk_nope, L], W_UV [H, v, L]) read off `kv_b_proj` by feeding it the identity."""
        if self._absorbed is None:
            mla, heads = self.geometry.mla, self.geometry.num_heads
            eye = torch.eye(mla.kv_lora_rank, device=self.kv_cache.device, dtype=dtype)
            with torch.no_grad():
                if self.kv_b_proj(torch.zeros_like(eye[:1])).abs().max() > 0:
                    raise ValueError(
                        "FLASHINFER_MLA absorbs kv_b_proj into the query and output; it must be linear without a bias"
                    )
                w = self.kv_b_proj(eye).t().reshape(heads, mla.qk_nope_head_dim + mla.v_head_dim, -1)
            self._absorbed = (w[:, : mla.qk_nope_head_dim].contiguous(), w[:, mla.qk_nope_head_dim :].contiguous())
        return self._absorbed

    def _attend(self, q: torch.Tensor, metadata: FlashInferMetadata, args) -> torch.Tensor:
        mla = self.geometry.mla
        w_uk, w_uv = self.absorbed_weights(q.dtype)
        q_nope = torch.einsum("thn,hnl->thl", q[..., : mla.qk_nope_head_dim], w_uk)
        q_pe = q[..., mla.qk_nope_head_dim :].contiguous()
        plane = self.kv_cache[0][:, :, 0]  # [blocks, block_size, kv_lora_rank + rope]
        key = PlanKey(
            kind="mla",
            device=str(q.device),
            layout=metadata.layout.value,
            num_heads=self.geometry.num_heads,
            num_kv_heads=1,
            head_dim=CKV_DIM,
            scale=self.geometry.scale,
            window_left=-1,
            logit_softcap=None,
            causal=self.is_causal(args),
            q_dtype=q.dtype,
            kv_dtype=self.kv_cache.dtype,
        )
        latent_out = planned_wrapper(key, metadata).run(q_nope, q_pe, plane[..., :CKV_DIM], plane[..., CKV_DIM:])
        return torch.einsum("thl,hvl->thv", latent_out, w_uv)
