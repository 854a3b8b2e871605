"""Position embedding: RoPE (every spelling of its parameters), ALiBi, or learned positions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kernelbay.attention import LayerKind, MLASpec
from kernelbay.errors import ConfigError

from ._fields import Fields, check_size
from ._records import ROPE_TYPES, RopeConfig, frozen_json

if TYPE_CHECKING:
    from ._rules import FamilyRules

THETA = ("rope_theta", "rotary_emb_base", "rope_embedding_base", "rotary_base")
PARTIAL = ("partial_rotary_factor", "rotary_pct")
ROPE_HINTS = THETA + PARTIAL + ("rope_scaling", "rope_parameters", "rotary_dim")
ROPE_TYPE_ALIASES = {"su": "longrope"}  # early Phi-3 128k checkpoints
DEFAULT_THETA = 10000.0


def resolve_position_embedding(f: Fields, mla: MLASpec | None) -> str:
    """ "rope", "alibi" or "learned" (GPT-2, OPT: a position table, nothing to rotate)."""
    if f.get_bool("alibi"):
        return "alibi"
    if mla is not None or any(f.get(name) for name in ROPE_HINTS):
        return "rope"
    return "learned"


def rope_parameters(f: Fields) -> dict[str, Any]:
    """The RoPE dict as written: `rope_parameters` (transformers 5) or `rope_scaling`, else {}."""
    for layer in (f.raw, f.parsed):
        for name in ("rope_parameters", "rope_scaling"):
            value = layer.get(name)
            if isinstance(value, Mapping):
                return dict(value)
            if value is not None:
                raise ConfigError(f"{f.source}: {name} must be an object, got {value!r}.")
    return {}


def resolve_rope(f: Fields, rules: FamilyRules, head_dim: int, max_positions: int, mla: MLASpec | None) -> RopeConfig:
    """The RoPE of the full-attention layers (transformers 5 may nest one dict per layer kind); what other layers
    rotate with differently is the family's `rope` rule's to say (Gemma 3's local base: kernelbay-llama)."""
    main = rope_parameters(f)
    if isinstance(main.get(LayerKind.FULL), Mapping):
        main = dict(main[LayerKind.FULL])
    rope_type = _rope_type(main)
    original = _original_positions(f, main)
    rope = RopeConfig(
        theta=_theta(f, main),
        rope_type=rope_type,
        factor=_factor(f, main, rope_type, max_positions, original),
        rotary_dim=_rotary_dim(f, main, head_dim, mla),
        scaling=frozen_json(_scaling(main, rope_type, original)),
        original_max_position_embeddings=original if rope_type != "default" else None,
    )
    return rules.apply("rope", rope, rules.ask("rope"))


def _original_positions(f: Fields, params: dict) -> int | None:
    written = params.get("original_max_position_embeddings")
    if written is None:
        return f.get_int("original_max_position_embeddings")
    return check_size(
        f.source, "original_max_position_embeddings", f.as_int("original_max_position_embeddings", written)
    )


def _scaling(params: dict, rope_type: str, original: int | None) -> dict:
    """The scaling parameters under one spelling, whichever of rope_scaling / rope_parameters held them."""
    if rope_type == "default":
        return {}
    scaling = {k: v for k, v in params.items() if k not in ("type", "rope_type", "rope_theta", "partial_rotary_factor")}
    if original:
        scaling["original_max_position_embeddings"] = original
    return {"rope_type": rope_type, **scaling}


def _rope_type(params: dict) -> str:
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if not isinstance(rope_type, str):
        raise ConfigError(f"rope_type must be a string (one of {', '.join(ROPE_TYPES)}), got {rope_type!r}.")
    return ROPE_TYPE_ALIASES.get(rope_type, rope_type)


def _theta(f: Fields, params: dict) -> float:
    """The base: a top-level key as written, else the one inside the RoPE dict, else the class's value."""
    theta = next((v for v in (f.as_written(*THETA), params.get("rope_theta"), f.get(*THETA)) if v is not None), None)
    if theta is None:
        f.notes.append(f"rope_theta not in config.json: using the RoPE default {DEFAULT_THETA}")
        return DEFAULT_THETA
    return f.as_float("rope_theta", theta, positive=True)


def _factor(f: Fields, params: dict, rope_type: str, max_positions: int, original: int | None) -> float | None:
    factor = params.get("factor")
    if factor is None and rope_type == "longrope" and original:
        # LongRoPE derives its factor from the context extension, as transformers does.
        f.notes.append(f"longrope factor = max_position_embeddings / original = {max_positions}/{original}")
        return max_positions / original
    if factor is None:
        return None
    factor = f.as_float("rope_scaling.factor", factor, positive=True)
    if factor < 1:  # transformers' own rule: a factor stretches the trained context, never shrinks it
        raise ConfigError(f"{f.source}: rope_scaling.factor must be >= 1 (it stretches the context), got {factor}.")
    return factor


def _rotary_dim(f: Fields, params: dict, head_dim: int, mla: MLASpec | None) -> int:
    """Channels rotated per head: MLA's rope part, an explicit rotary_dim, or a partial fraction."""
    if mla is not None:
        return mla.qk_rope_head_dim
    explicit = f.get_int("rotary_dim")
    if explicit is not None:
        return explicit
    fraction = f.get_float(*PARTIAL)
    if fraction is None:
        fraction = f.as_float("partial_rotary_factor", params.get("partial_rotary_factor") or 1.0, positive=True)
    if not 0 < fraction <= 1:
        raise ConfigError(f"{f.source}: partial_rotary_factor/rotary_pct must be in (0, 1], got {fraction}.")
    return int(head_dim * fraction)
