"""Assemble a `ModelConfig` from config.json (as written) and transformers' parse of it: which slot it resolves
to (architecture and kind), then its geometry."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelbay.attention import LayerKind
from kernelbay.errors import ConfigError

from . import _geometry as geo
from ._fields import Fields
from ._file_config import WeightFileConfig
from ._layers import ConfigSignature, LayerPlan, config_signature, resolve_layers
from ._llama import is_llama_parse, llama_config_parameters
from ._loading import (
    CONFIG_FILE,
    hf_config_from_dict,
    load_hf_config,
    read_config_json,
    stored_tensors,
    weight_file_config_is_complete,
)
from ._moe import resolve_moe
from ._quant import resolve_quantization
from ._rope import resolve_position_embedding, resolve_rope
from ._rules import FamilyRules, family_rules
from ._transformers import causal_lm_class_names, has_transformers_name, model_types_by_class, transformers_names

if TYPE_CHECKING:
    from ._model_config import ModelConfig

# How EAGLE heads spell their tie to a base architecture: LlamaForCausalLMEagle3, Eagle3LlamaForCausalLM.
_EAGLE_MARKS = re.compile(r"^(?:EAGLE3|Eagle3|EAGLE|Eagle)(?=[A-Z])|(?:EAGLE3|Eagle3|EAGLE|Eagle)$")
VISION_ENCODER_SUFFIXES = ("VisionModel", "VisionTransformer", "VisionTower")
# Keys a composite config keeps at the top level that describe its parts too.
INHERITED_KEYS = ("torch_dtype", "dtype", "quantization_config")
# Legacy flags that change the KV heads (Falcon, ChatGLM): a family's `layers` rule reads them, never MHA by default.
LEGACY_KV_FLAGS = ("multi_query", "new_decoder_architecture", "multi_query_attention")


def build_from_folder(record: type[ModelConfig], path: str | Path, trust_remote_code: bool, encoder_only: bool):
    folder, raw = read_config_json(path)
    if folder.is_file():  # a self-describing weight file (x.gguf): its format plugin read the config
        hf_config = hf_config_from_dict(folder, raw)
        paired = weight_file_config_is_complete(folder)  # the format wrote both names from one table
        fields = Fields(raw, _parsed(hf_config), source=f"{folder} (metadata)", paired=paired)
    else:
        names, model_type = raw.get("architectures"), raw.get("model_type")
        if isinstance(names, list) and names and isinstance(names[0], str) and isinstance(model_type, str):
            _check_family(str(folder / CONFIG_FILE), names[0], model_type)  # before another family's class parses it
        hf_config = load_hf_config(folder, raw, trust_remote_code)
        fields = Fields(raw, _parsed(hf_config), str(folder / CONFIG_FILE), folder, stored_tensors)
    try:
        return _build(record, fields, hf_config, folder, encoder_only)
    except ConfigError as err:
        _raise_provider_refusal(hf_config, err)
        raise


def _raise_provider_refusal(hf_config, err: ConfigError) -> None:
    """A config kernelbay cannot resolve, for an architecture transformers implements, may be one its provider
    refuses anyway (the transformers fallback refuses encoder-decoders, state-space models, ...): that reason is
    the error, alone (the fields kernelbay could not find only say that no family reads this config). A malformed
    config of any other architecture (a name transformers does not know, a family rule's refusal) keeps its own
    error."""
    from kernelbay.errors import KernelbayError, UnknownNameError, UnsupportedArchitecture
    from kernelbay.registry import resolve_impl

    names = getattr(hf_config, "architectures", None)
    arch = names[0] if isinstance(names, (list, tuple)) and names else None
    if not (isinstance(arch, str) and has_transformers_name(arch)):
        return
    try:
        resolve_impl("model", arch, hf_config=hf_config)
    except UnsupportedArchitecture as refused:
        if isinstance(refused.__cause__, UnknownNameError):  # nobody serves it: the config error stands
            return
        raise UnsupportedArchitecture(str(refused)) from err
    except KernelbayError:  # a broken or conflicting provider: the config error stands
        return


def build_from_hf_config(record: type[ModelConfig], hf_config, encoder_only: bool):
    parsed = _parsed(hf_config)
    fields = Fields(parsed, parsed, source=f"{type(hf_config).__name__}")
    return _build(record, fields, hf_config, None, encoder_only)


def _parsed(hf_config) -> dict[str, Any]:
    """transformers' view of the config, legacy attribute names (`n_embd`) included (a weight file's: its fields)."""
    parsed = hf_config.to_dict()
    if isinstance(hf_config, WeightFileConfig):
        return parsed
    (PretrainedConfig,) = transformers_names("PretrainedConfig")
    if type(hf_config) is PretrainedConfig:  # its to_dict writes the class's model_type (""), not the config's
        parsed["model_type"] = hf_config.model_type
    for alias, attribute in getattr(hf_config, "attribute_map", {}).items():
        parsed.setdefault(alias, getattr(hf_config, attribute, None))
    return parsed


def _build(record: type[ModelConfig], f: Fields, hf_config, folder: Path | None, encoder_only: bool) -> ModelConfig:
    model_type = str(f.get("model_type") or getattr(hf_config, "model_type", ""))
    top_rules = family_rules(f, model_type)
    naming = _naming(f, model_type, encoder_only, top_rules)
    encoder = naming["model_kind"] == "vision_encoder"
    f, geometry_config = _section(f, hf_config, "vision_config" if encoder else "text_config")
    layer_model_type = str(getattr(geometry_config, "model_type", "") or model_type)
    rules = family_rules(f, layer_model_type)  # the family's plugin answers first, the generic fields after
    hidden, n_layers, heads, vocab = geo.core_sizes(f, encoder)
    mla = geo.resolve_mla(f, rules)
    head_dim = geo.resolve_head_dim(f, hidden, heads, mla)
    max_positions = geo.resolve_max_positions(f, encoder)
    if encoder:
        plan = LayerPlan((LayerKind.ENCODER,) * n_layers)
    else:
        plan = resolve_layers(f, rules, n_layers, max_positions, lambda: _signature(geometry_config))
    kv_heads = _layer_kv_heads(f, plan, heads)
    position_embedding = rules.ask("position_embedding") or resolve_position_embedding(f, mla)
    return record(
        not_built=top_rules.ask("not_built", note=False),
        **naming,
        model_type=model_type,
        hidden_size=hidden,
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=max(kv_heads) or heads,
        head_dim=head_dim,
        vocab_size=vocab,
        intermediate_size=rules.ask("intermediate_size") or geo.resolve_intermediate_size(f),
        max_position_embeddings=max_positions,
        rms_norm_eps=geo.resolve_norm_eps(f),
        tie_word_embeddings=f.get_bool("tie_word_embeddings"),
        dtype=geo.resolve_dtype(f),
        layer_types=plan.kinds,
        layer_num_kv_heads=kv_heads,
        sliding_window=plan.sliding_window,
        attention_chunk_size=plan.attention_chunk_size,
        mla=mla,
        rope=resolve_rope(f, rules, head_dim, max_positions, mla) if position_embedding == "rope" else None,
        position_embedding=position_embedding,
        attention_scale=rules.ask("attention_scale") or geo.resolve_attention_scale(f, head_dim),
        v_head_dim=mla.v_head_dim if mla else head_dim,
        attn_logit_softcapping=f.get_float("attn_logit_softcapping"),
        attention_sinks=bool(rules.ask("attention_sinks")),
        gated_ffn=rules.ask("gated_ffn") is not False,
        final_logit_softcapping=f.get_float("final_logit_softcapping"),
        quantization=resolve_quantization(f, folder),
        blocksparse=plan.blocksparse,
        indexer=plan.indexer,
        moe=None if encoder else resolve_moe(f, n_layers, rules),
        notes=tuple(f.notes),
        source=str(folder) if folder else None,
        hf_config=hf_config,
    )


def _signature(config) -> ConfigSignature | None:
    """The signature of the class `config` is a parse of: LlamaConfig's for a Llama config held in the generic
    PretrainedConfig (known without importing the class), else its own class's."""
    if is_llama_parse(config):
        return ConfigSignature("LlamaConfig", llama_config_parameters())
    if isinstance(config, WeightFileConfig):  # the generic class's parse it stands for
        (PretrainedConfig,) = transformers_names("PretrainedConfig")
        return config_signature(PretrainedConfig)
    return config_signature(type(config))


def _layer_kv_heads(f: Fields, plan: LayerPlan, heads: int) -> tuple[int, ...]:
    if plan.kv_heads is not None:
        return plan.kv_heads
    if LayerKind.ENCODER in plan.kinds:
        return (0,) * len(plan.kinds)
    legacy = ", ".join(f"{flag}=true" for flag in LEGACY_KV_FLAGS if f.get_bool(flag))
    if legacy and f.get("num_key_value_heads") is None:
        raise ConfigError(
            f"{f.source}: the KV heads are given by {legacy}, which only the family's plugin reads "
            "(kernelbay-gpt for Falcon and ChatGLM); install it."
        )
    kv = f.get_int("num_key_value_heads", default=heads)  # absent or null: MHA
    return tuple(0 if kind == LayerKind.NO_ATTENTION else kv for kind in plan.kinds)


def _section(f: Fields, hf_config, name: str) -> tuple[Fields, Any]:
    """The part of a composite config the geometry lives in (`text_config` of a VLM, or its
    `vision_config` for an encoder-only deployment); the config itself when it is not composite."""
    sub_config = getattr(hf_config, name, None)
    sub_raw = f.raw.get(name)
    if sub_config is None and not isinstance(sub_raw, dict):
        return f, hf_config
    if name == "text_config" and any(f.get(key) is not None for key in geo.HIDDEN):
        return f, hf_config  # the text sizes are already at the top level
    parsed = sub_config.to_dict() if sub_config is not None else {}
    raw = dict(sub_raw) if isinstance(sub_raw, dict) else parsed
    for key in INHERITED_KEYS:
        if f.raw.get(key) is not None and key not in raw:
            raw[key] = f.raw[key]
    part = Fields(raw, parsed, f"{f.source} ({name})", f.folder, f.read_tensors)
    part.notes = f.notes
    return part, sub_config if sub_config is not None else hf_config


# ---- naming: DESIGN "Model resolution" ---------------------------------------------------------------------
def _naming(f: Fields, model_type: str, encoder_only: bool, rules: FamilyRules) -> dict[str, Any]:
    """architecture (the slot name), architectures, model_kind and draft_vocab_size: architectures[0];
    encoder-only -> vision encoder; drafts -> EAGLE3<Arch>; a family's `architecture` rule may rename a legacy
    architectures[0]."""
    names = _architectures(f, model_type)
    if not f.paired:  # (transformers' tables cost its `models` package import, ~0.4 s)
        _check_family(f.source, names[0], model_type)
    architecture, kind, draft_vocab_size = names[0], "model", None
    if f.get("draft_vocab_size") is not None:
        architecture, kind = draft_architecture(names[0]), "draft_model"
        draft_vocab_size = f.get_int("draft_vocab_size")
    elif encoder_only or names[0].endswith(VISION_ENCODER_SUFFIXES) or model_type.endswith("_vision_model"):
        kind = "vision_encoder"  # a standalone vision tower (SigLIP, CLIP vision) is encoder-only by construction
    else:
        architecture = rules.ask("architecture") or names[0]
    return {
        "architecture": architecture,
        "architectures": names,
        "model_kind": kind,
        "draft_vocab_size": draft_vocab_size,
    }


def _architectures(f: Fields, model_type: str) -> tuple[str, ...]:
    value = f.get("architectures")
    if value:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{f.source}: architectures must be a list of class names, got {value!r}.")
        return tuple(value)
    default = causal_lm_class_names().get(model_type)
    if default is None:
        raise ConfigError(
            f"{f.source}: 'architectures' is missing and transformers has no causal-LM class for "
            f'model_type {model_type!r}; add e.g. "architectures": ["LlamaForCausalLM"].'
        )
    f.notes.append(f"no architectures in config: transformers' causal LM for {model_type!r} ({default}) used")
    return (default,)


def _check_family(source: str, architecture: str, model_type: str) -> None:
    """architectures[0] and model_type name one family: where transformers pairs the class with model_types and
    knows this model_type too, it must be one of them (a Llama config saying gpt2 would get GPT-2's rules)."""
    family = model_types_by_class().get(architecture)
    (known_types,) = transformers_names("CONFIG_MAPPING")
    if not family or model_type in family or model_type not in known_types:
        return  # a class or model_type transformers does not know: its plugin pairs them
    named = [t for t in sorted(family, key=len) if t.replace("_", "") in architecture.lower()]  # llama for Llama...
    own_class = causal_lm_class_names().get(model_type)
    instead = f", or architectures to [{own_class!r}]" if own_class else ""
    raise ConfigError(
        f"{source}: architectures[0] {architecture!r} belongs to model_type {' / '.join(map(repr, sorted(family)))}"
        f", but model_type is {model_type!r}: one family's config rules would read another's model; set model_type "
        f"to {(named or sorted(family))[0]!r}{instead}, whichever the checkpoint really is."
    )


def draft_architecture(architecture: str) -> str:
    """`EAGLE3<TargetArch>`: the decoder class the EAGLE-3 head is built from, its EAGLE marks removed.

    SpecForge writes `LlamaForCausalLMEagle3`, vLLM `Eagle3LlamaForCausalLM`: both are
    `EAGLE3LlamaForCausalLM`, a Llama layer drafting for whatever target it was trained on.
    """
    return "EAGLE3" + _EAGLE_MARKS.sub("", architecture)
