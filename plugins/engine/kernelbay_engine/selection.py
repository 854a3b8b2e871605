"""A resolved `ModelConfig` turned into the selector's requirement records, once, by the engine.

The core's selector knows requirements, not models (as vLLM's does): `select_attention` asks it for every
attention layer group of a config, `select_moe` for the MoE layers, and `stored_expert_format` is the one
answer to which format the checkpoint stores its experts in."""

from __future__ import annotations

import os

from kernelbay.attention import (
    AttentionRequirements,
    LayerGroupSelection,
    LayerKind,
    SelectionResult,
    select_for_layer_groups,
)
from kernelbay.errors import ConfigError
from kernelbay.moe import MOE_BACKEND_ENV, MoERequirements, select_moe_backend


def attention_requirements(
    cfg, layer_kind: str | LayerKind, kv_cache_dtype: str | None = "auto", dtype: str | None = None, **runtime
) -> AttentionRequirements:
    """Requirements of the `layer_kind` layers of `cfg` (runtime: block_size, kv_layout, platform, ...)."""
    kind = LayerKind.parse(layer_kind)
    if not kind.has_attention:
        raise ValueError(f"{kind.value} layers have no attention backend; skip them when selecting")
    runtime.setdefault("sparse_mode", kind.sparse_mode)
    mla = cfg.mla
    return AttentionRequirements(
        head_size=mla.qk_head_dim if mla is not None else cfg.head_dim,
        dtype=dtype or cfg.dtype,
        kv_cache_dtype=kv_cache_dtype or "auto",
        attn_type=kind.attention_type,
        use_mla=mla is not None,
        logit_softcap=cfg.attn_logit_softcapping is not None,
        sinks=cfg.attention_sinks,
        **runtime,
    )


def select_attention(
    cfg, kv_cache_dtype: str | None = "auto", requested: str | None = None, platform=None, dtype=None, **runtime
) -> LayerGroupSelection:
    """A backend per attention layer group of `cfg` (`cfg.layer_groups()`; layers without attention skipped)."""
    kinds = [LayerKind.parse(kind) for kind, _layers in cfg.layer_groups()]
    groups = {
        kind.value: attention_requirements(cfg, kind, kv_cache_dtype=kv_cache_dtype, dtype=dtype, **runtime)
        for kind in kinds
        if kind.has_attention
    }
    return select_for_layer_groups(groups, requested=requested, platform=platform)


def stored_expert_format(cfg) -> tuple[str, tuple[int, int] | None]:
    """The format the checkpoint stores its expert weights in (`kernelbay.moe.EXPERT_FORMATS`), with its FP8
    block size."""
    quant = cfg.quantization
    method = quant.quant_method if quant is not None else None
    if method == "mxfp4":
        return "mxfp4", None
    block = quant.weight_block_size if quant is not None else None
    if method == "fp8" and block:
        return "fp8_block", (int(block[0]), int(block[1]))
    return "dense", None


def select_moe(
    cfg, requested: str | None = None, platform=None, dtype: str | None = None
) -> tuple[SelectionResult, bool] | None:
    """(selection, dequantized) for the MoE layers of `cfg`, or None for a dense model.

    The stored expert format is asked for first; when no capable kernel reads it (and none was requested), a
    kernel for dense weights is chosen and `dequantized` is True: the engine dequantizes the experts at load."""
    moe = cfg.moe
    if moe is None:
        return None
    fmt, block = stored_expert_format(cfg)

    def needs(fmt: str, block=None) -> MoERequirements:
        geometry = moe.geometry(cfg.hidden_size, fmt, block)
        return MoERequirements.from_geometry(geometry, dtype=dtype or cfg.dtype, routing=moe.routing)

    try:
        return select_moe_backend(needs(fmt, block), requested=requested, platform=platform), False
    except ConfigError:
        if fmt == "dense" or requested or os.environ.get(MOE_BACKEND_ENV):
            raise
    return select_moe_backend(needs("dense"), platform=platform), True
