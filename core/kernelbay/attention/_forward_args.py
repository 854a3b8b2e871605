"""Per-call options a layer passes to `AttentionBackend.forward`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class AttentionForwardArgs:
    """Options for one forward call. Pass this record or the same names as keywords, never both."""

    causal: bool = True
    """Mask each query from keys after its own position (decoder self-attention)."""
    update_kv_cache: bool = True
    """Write this call's k/v into the paged cache before attending (False: reuse what is cached)."""
    output: Any = None
    """Optional preallocated output tensor [T, num_heads, v_head_dim] to write into."""

    def __post_init__(self):
        if not isinstance(self.causal, bool):
            raise TypeError(f"AttentionForwardArgs.causal must be a bool, got {self.causal!r}")
        if not isinstance(self.update_kv_cache, bool):
            raise TypeError(f"AttentionForwardArgs.update_kv_cache must be a bool, got {self.update_kv_cache!r}")


_FIELDS = tuple(f.name for f in dataclasses.fields(AttentionForwardArgs))
DEFAULT_FORWARD_ARGS = AttentionForwardArgs()


def resolve_forward_args(forward_args: AttentionForwardArgs | None, legacy: dict) -> AttentionForwardArgs:
    """One record from either form; both at once is an error, never a merge."""
    if forward_args is not None and legacy:
        raise TypeError(
            f"pass either forward_args=AttentionForwardArgs(...) or keyword options "
            f"({', '.join(sorted(legacy))}), not both; move them into the AttentionForwardArgs record")
    if forward_args is not None:
        if not isinstance(forward_args, AttentionForwardArgs):
            raise TypeError(f"forward_args must be an AttentionForwardArgs, got {type(forward_args).__name__}")
        return forward_args
    unknown = sorted(set(legacy) - set(_FIELDS))
    if unknown:
        raise TypeError(f"unknown attention forward option(s) {', '.join(unknown)}; known: {', '.join(_FIELDS)}")
    return AttentionForwardArgs(**legacy) if legacy else DEFAULT_FORWARD_ARGS
