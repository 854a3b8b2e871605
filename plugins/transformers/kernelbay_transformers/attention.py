"""The attention function registered with transformers' `AttentionInterface` under the name "kernelbay".

A transformers attention module computes q, k, v (RoPE, q/k norms and all) and hands them to
`paged_attention`, which runs the kernelbay `Attention` layer attached to that module: the backend
kernelbay's selector chose for the layer, over kernelbay's paged KV cache, with the step's metadata
passed down the model's forward as the keyword argument `kernelbay_metadata`. The layer's geometry was
read from the config when the model was built; every call checks that what transformers passes
(scaling, sliding window, soft-cap) still agrees with it, so nothing differs silently.
"""

from __future__ import annotations

import torch

IMPLEMENTATION = "kernelbay"
METADATA_KWARG = "kernelbay_metadata"
LAYER_ATTRIBUTE = "kernelbay_attention"  # on each transformers attention module: its kernelbay Attention
CONTEXT_ATTRIBUTE = "kernelbay_context"  # ... and the model's context length
# keyword arguments transformers may pass that change what attention computes, and kernelbay's layers do not
_UNSUPPORTED = {"s_aux": "attention sinks", "sinks": "attention sinks"}


def register() -> None:
    """Make "kernelbay" a valid `attn_implementation` (idempotent; masks are not built for unknown names)."""
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, paged_attention)


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query [1, H, T, D], key/value [1, KV, T, D] (T packed tokens) -> ([1, T, H, D], no weights)."""
    layer = getattr(module, LAYER_ATTRIBUTE, None)
    metadata = kwargs.get(METADATA_KWARG)
    if layer is None or metadata is None:
        raise RuntimeError(
            f"{type(module).__name__} ran with attn_implementation={IMPLEMENTATION!r} outside kernelbay: "
            "this model runs only through kernelbay's ModelRunner / LLM"
        )
    problem = _disagreement(
        layer.geometry, getattr(module, CONTEXT_ATTRIBUTE), scaling, dropout, sliding_window, softcap, kwargs
    )
    if problem:
        raise RuntimeError(f"{type(module).__name__} layer {layer.layer_idx}: {problem}")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, heads, D]
    return layer(q, k, v, metadata).unsqueeze(0), None


def _disagreement(geometry, context: int, scaling, dropout, sliding_window, softcap, kwargs) -> str | None:
    """What transformers asked for that the layer's geometry does not do, in words; None when they agree."""
    for name, what in _UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            return f"transformers passes {name} ({what}), which kernelbay's attention layers do not implement"
    if dropout:
        return f"attention dropout {dropout} (kernelbay runs inference only; call model.eval())"
    if scaling is not None and abs(scaling - geometry.scale) > 1e-12 * max(1.0, abs(scaling)):
        return f"scaling {scaling} differs from {geometry.scale} read from the model at construction"
    # kernelbay drops a window no shorter than the context (the layer attends fully); transformers passes it on
    whole = geometry.sliding_window is None and sliding_window is not None and sliding_window >= context
    if (sliding_window or None) != geometry.sliding_window and not whole:
        return f"sliding window {sliding_window} differs from {geometry.sliding_window} resolved from the config"
    if (softcap or None) != geometry.logit_softcap:
        return f"soft-cap {softcap} differs from {geometry.logit_softcap} resolved from the config"
    return None
