"""MoE backend selection: the attention selector's machinery (one cache, reasons per candidate) for MoE kernels."""

from __future__ import annotations

from ..attention._selector import SelectionResult, _requested_name, select_for_layer_groups
from ._backend import MoERequirements


def select_moe_backend(requirements: MoERequirements, requested: str | None = None, platform=None) -> SelectionResult:
    """The MoE kernel for a model's MoE layers on `platform` (default: the current one).

    Candidates: the platform's `moe_backend_priority()`, then every installed `kernelbay.moe_backends` entry.
    `requested` (or KERNELBAY_MOE_BACKEND) must be known and capable; there is no fallback."""
    return select_for_layer_groups({"moe": requirements}, requested, platform, "moe_backend").groups[0][1]


def stored_expert_format(cfg) -> tuple[str, tuple[int, int] | None]:
    """The format the checkpoint stores expert weights in, with its FP8 block size."""
    quant = getattr(cfg, "quantization", None)
    method = getattr(quant, "quant_method", None)
    if method == "mxfp4":
        return "mxfp4", None
    block = getattr(quant, "weight_block_size", None)
    if method == "fp8" and block:
        return "fp8_block", (int(block[0]), int(block[1]))
    return "dense", None


def select_moe_for_model(cfg, requested: str | None = None, platform=None, dtype: str | None = None):
    """(selection, dequantized) for a resolved ModelConfig's MoE layers, or None for a dense model.

    The stored expert format is asked for first; when no capable kernel reads it (and none was requested), a
    kernel for dense weights is chosen and `dequantized` is True: the engine dequantizes the experts at load."""
    from ..errors import ConfigError

    moe = getattr(cfg, "moe", None)
    if moe is None:
        return None
    fmt, block = stored_expert_format(cfg)

    def needs(fmt: str, block=None) -> MoERequirements:
        geometry = moe.geometry(cfg.hidden_size, fmt, block)
        return MoERequirements.from_geometry(geometry, dtype=dtype or cfg.dtype, routing=moe.routing)

    try:
        return select_moe_backend(needs(fmt, block), requested=requested, platform=platform), False
    except ConfigError:
        if fmt == "dense" or requested or _requested_name(None, "moe_backend"):
            raise
    return select_moe_backend(needs("dense"), platform=platform), True
