"""Asking a backend class every capability a requirements record needs; each failure is one line."""

from __future__ import annotations

from ._requirements import AttentionRequirements


def _sorted(values) -> str:
    return ", ".join(str(v) for v in sorted(values, key=str))


def geometry_failures(cls, req: AttentionRequirements) -> list[str]:
    """Failures a layer's geometry alone reveals (head size, MLA, window, chunking, soft-cap)."""
    failures = []
    if not cls.supports_head_size(req.head_size):
        sizes = f" (supported: {_sorted(cls.head_sizes)})" if cls.head_sizes is not None else ""
        failures.append(f"head_size: {req.head_size} is not supported{sizes}")
    flags = [(req.use_mla, cls.supports_mla, "mla: multi-head latent attention is not supported"),
             (req.sliding_window, cls.supports_sliding_window, "sliding_window: sliding-window attention is not supported"),
             (req.attn_type.value == "encoder_attention", cls.supports_encoder,
              "encoder: bidirectional encoder attention is not supported"),
             (req.chunked_attention, cls.supports_chunked_attention, "chunked_attention: chunked attention is not supported"),
             (req.logit_softcap, cls.supports_logit_softcap, "logit_softcap: attention logit soft-capping is not supported")]
    failures += [line for needed, supports, line in flags if needed and not supports()]
    return failures


def _runtime_failures(cls, req: AttentionRequirements) -> list[str]:
    failures = []
    if not cls.supports_dtype(req.dtype):
        failures.append(f"dtype: {req.dtype} is not supported (supported: {_sorted(cls.dtypes)})")
    if not cls.supports_kv_cache_dtype(req.kv_cache_dtype):
        failures.append(f"kv_cache_dtype: {req.kv_cache_dtype} is not supported "
                        f"(supported: {_sorted(cls.kv_cache_dtypes)})")
    if req.block_size is not None and not cls.supports_block_size(req.block_size):
        failures.append(f"block_size: {req.block_size} is not supported "
                        f"(supported: {_sorted(cls.supported_block_sizes())})")
    if req.kv_layout is not None and not cls.supports_kv_layout(req.kv_layout):
        failures.append(f"kv_layout: {req.kv_layout.value} is not supported (supported: {_sorted(cls.kv_layouts)})")
    if not cls.supports_sparse(req.sparse_mode):
        failures.append(f"sparse: mode {req.sparse_mode!r} is not supported (supported: {_sorted(cls.sparse_modes)})")
    if req.fused_rope and not cls.supports_fused_rope():
        failures.append("fused_rope: fused RoPE is not supported")
    if req.fused_qkv and not cls.supports_fused_qkv():
        failures.append("fused_qkv: fused QKV input is not supported")
    return failures


def capability_failures(cls, req: AttentionRequirements) -> list[str]:
    """Every capability in `req` the backend class lacks, plus platform and availability."""
    failures = geometry_failures(cls, req) + _runtime_failures(cls, req)
    if req.platform is not None and not cls.supports_platform(req.platform):
        failures.append(f"platform: {req.platform} is not supported (supported: {_sorted(cls.platforms or ())})")
    available, reason = cls.is_available()
    if not available:
        failures.append(f"available: {reason}")
    return failures
