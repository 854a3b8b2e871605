"""Which slot a config resolves to: architecture name and kind (model, draft model, vision encoder)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError
from ._fields import Fields
from ._rules import FamilyRules

# How EAGLE heads spell their tie to a base architecture: LlamaForCausalLMEagle3, Eagle3LlamaForCausalLM.
_EAGLE_MARKS = re.compile(r"^(?:EAGLE3|Eagle3|EAGLE|Eagle)(?=[A-Z])|(?:EAGLE3|Eagle3|EAGLE|Eagle)$")
VISION_ENCODER_SUFFIXES = ("VisionModel", "VisionTransformer", "VisionTower")


@dataclass(frozen=True, slots=True)
class Naming:
    architecture: str  # the slot name to resolve
    architectures: tuple[str, ...]  # as written in config.json
    model_kind: str  # "model" | "draft_model" | "vision_encoder"
    draft_vocab_size: int | None = None


def resolve_naming(f: Fields, model_type: str, encoder_only: bool, rules: FamilyRules) -> Naming:
    """DESIGN "Model resolution": architectures[0]; encoder-only -> vision encoder; drafts -> EAGLE3<Arch>;
    a family's `architecture` rule may rename a legacy architectures[0]."""
    architectures = _architectures(f, model_type)
    first = architectures[0]
    if f.get("draft_vocab_size") is not None:
        return Naming(draft_architecture(first), architectures, "draft_model", f.get_int("draft_vocab_size"))
    if encoder_only or is_vision_encoder(first, model_type):
        return Naming(first, architectures, "vision_encoder")
    return Naming(rules.ask("architecture") or first, architectures, "model")


def _architectures(f: Fields, model_type: str) -> tuple[str, ...]:
    value = f.get("architectures")
    if value:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{f.source}: architectures must be a list of class names, got {value!r}.")
        return tuple(value)
    default = _transformers_causal_lm(model_type)
    if default is None:
        raise ConfigError(
            f"{f.source}: 'architectures' is missing and transformers has no causal-LM class for "
            f'model_type {model_type!r}; add e.g. "architectures": ["LlamaForCausalLM"].'
        )
    f.notes.append(f"no architectures in config: transformers' causal LM for {model_type!r} ({default}) used")
    return (default,)


def _transformers_causal_lm(model_type: str) -> str | None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)


def draft_architecture(architecture: str) -> str:
    """`EAGLE3<TargetArch>`: the decoder class the EAGLE-3 head is built from, its EAGLE marks removed.

    SpecForge writes `LlamaForCausalLMEagle3`, vLLM `Eagle3LlamaForCausalLM`: both are
    `EAGLE3LlamaForCausalLM`, a Llama layer drafting for whatever target it was trained on.
    """
    base = _EAGLE_MARKS.sub("", architecture)
    return "EAGLE3" + base


def is_vision_encoder(architecture: str, model_type: str) -> bool:
    """A standalone vision tower (SigLIP, CLIP vision): encoder-only by construction."""
    return architecture.endswith(VISION_ENCODER_SUFFIXES) or model_type.endswith("_vision_model")


def resolution_target(config) -> tuple[str, str]:
    """(slot kind, slot name) a resolved `ModelConfig` builds from (DESIGN "Model resolution", steps 1-3).

    `ModelConfig` has already applied the naming rules: `architecture` is `architectures[0]`, or
    `EAGLE3<TargetArch>` for a draft, and `model_kind` is "model", "draft_model" or "vision_encoder".
    """
    return config.model_kind, config.architecture
