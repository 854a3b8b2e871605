"""Per-call options a layer passes to `AttentionBackend.forward`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class AttentionForwardArgs:
    """Options for one forward call (`backend.forward(q, k, v, metadata, AttentionForwardArgs(...))`)."""

    causal: bool = True
    """Mask each query from keys after its own position (decoder self-attention)."""
    update_kv_cache: bool = True
    """Write this call's k/v into the paged cache before attending (False: reuse what is cached)."""
    output: Any = None
    """Optional preallocated output tensor [T, num_heads, v_head_dim] to write into."""
    topk_indices: Any = None
    """DSA layers only (sparse mode "dsa"): [T, index_topk] integer tensor, the keys each query attends to as
    positions in its own request's sequence (0 .. seq_len - 1, the layer's causal mask still applies); -1 pads
    a row whose query sees fewer keys. The indexer picks them (model code) before the layer attends."""
    sinks: Any = None
    """Layers with attention sinks only (geometry.sinks): [num_heads] float tensor, each head's learned sink
    logit, which joins the softmax denominator (exp(sink) added to the sum; it contributes no value)."""

    def __post_init__(self):
        if not isinstance(self.causal, bool):
            raise TypeError(f"AttentionForwardArgs.causal must be a bool, got {self.causal!r}")
        if not isinstance(self.update_kv_cache, bool):
            raise TypeError(f"AttentionForwardArgs.update_kv_cache must be a bool, got {self.update_kv_cache!r}")
