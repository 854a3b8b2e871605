"""Whether a kernel claims anything at all: the declarations that refuse every spec, and what to tell its author
(check-backend's CLAIMS NO SPEC, the pytest plugin's `claims_a_spec` item, `kernelbay doctor`)."""

from __future__ import annotations

from ..attention._capabilities import AttentionRequirements, _Any, _failure
from ..dtypes import MODEL_DTYPES


def refused_declarations(cls, req) -> list[str]:
    """The declarations (`head_sizes`, `block_sizes`, `mla`, ...) of `cls` that refuse `req`, in table order."""
    return [check.declared for check in cls.CHECKS if _failure(cls, check, getattr(req, check.field))]


COMMON_HEAD_SIZES = (64, 128)
COMMON_BLOCK_SIZE = 16  # the engine's default block size


def common_geometry_gaps(cls) -> list[str]:
    """Empty when the attention backend `cls` serves at least one common layer (full attention, head size 64 or
    128, any model dtype, 16-token blocks, on a platform it declares); else the declarations that refuse them all,
    e.g. `["head_sizes", "block_sizes"]` for one that left both at their conservative default (none)."""
    platforms = cls.platforms if not isinstance(cls.platforms, _Any) and cls.platforms else ("cpu",)
    refusals = [
        refused_declarations(
            cls,
            AttentionRequirements(head_size=size, dtype=dtype, block_size=COMMON_BLOCK_SIZE, platform=platform),
        )
        for size in COMMON_HEAD_SIZES
        for dtype in MODEL_DTYPES
        for platform in sorted(platforms)
    ]
    if any(not refused for refused in refusals):
        return []
    in_every = [name for name in refusals[0] if all(name in refused for refused in refusals)]
    return in_every or list(dict.fromkeys(name for refused in refusals for name in refused))


ATTENTION_GUIDE = "'Capability declarations' in docs/guides/attention-backend-plugin.md"


def declarations_hint(backend: str, gaps: list[str], where: str = ATTENTION_GUIDE) -> str:
    """What to tell the author of a backend that serves nothing: which declarations to add, and where they are."""
    listed = ", ".join(gaps) if gaps else "its declarations"
    return (
        f"{backend} can serve nothing: {listed} refuse every common geometry (what a backend does not declare, "
        f"it does not get: the defaults are none); declare them on the class (see {where})"
    )
