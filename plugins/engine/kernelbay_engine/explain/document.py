"""`explain_model`: config -> architecture -> provider -> per-group backend (with reasons) -> KV cache size.

Works on a folder holding only config.json: nothing is loaded but the config and the provider module.
The result is a plain dict following docs/explain-schema.md (`SCHEMA_VERSION`); `render_text` prints it.
`kernelbay explain` (explain/cli.py) is kernelbay-engine's command, contributed through `kernelbay.commands`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .text import COUNT_UNITS, candidate_lines, compact_layers, human_bytes, scaled

SCHEMA_VERSION = 3
# The config record's fields the document shows (docs/explain.schema.json), as its to_dict() gives them.
CONFIG_FIELDS = (
    "model_type",
    "architecture",
    "architectures",
    "model_kind",
    "dtype",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "sliding_window",
    "attention_chunk_size",
    "attention_sinks",
    "mla",
    "indexer",
    "quantization",
    "parameters",
    "notes",
)


def explain_model(
    path: str | Path,
    *,
    backend: str | None = None,
    kv_cache_dtype: str = "auto",
    memory: int | float | str | None = None,
    trust_remote_code: bool = False,
    moe_backend: str | None = None,
    model_impl: str = "auto",
    quantization: str | None = None,
    tensor_parallel_size: int = 1,
) -> dict:
    """The explain document for the model folder at `path` (see docs/explain-schema.md); `model_impl`: auto |
    native | transformers, as for `kernelbay run` (which provider would serve). `memory` and `quantization`
    are answered by the document's `sections` (the tokens `memory` holds in the engine's KV blocks, and which
    linear kernel each layer would run)."""
    from kernelbay_engine.config import ModelConfig
    from kernelbay_engine.models.auto import resolve_model
    from kernelbay_engine.models.quant import LinearQuantization

    config = ModelConfig.from_pretrained(path, trust_remote_code=trust_remote_code)  # the folder's checks too
    kind, name = config.model_kind, config.architecture  # the slot it builds from (EAGLE3<Arch> for a draft)
    resolve_model(config, model_impl)  # imported as AutoModelForCausalLM does: the same error
    LinearQuantization.from_quant_config(config.quantization)  # the one check `run` makes of the quantization
    options: dict[str, Any] = {"kind": kind, "name": name, "model_impl": model_impl, "moe_backend": moe_backend}
    options |= {"memory": memory, "quantization": quantization, "backend": backend, "kv_cache_dtype": kv_cache_dtype}
    options["tensor_parallel_size"] = tensor_parallel_size  # the `tensor_parallel` section: one rank's share
    doc = {"schema_version": SCHEMA_VERSION, "model_path": config.source}
    return doc | {key: build(config, options) for key, (build, _) in SECTIONS.items()}


def _config_section(config, _options: dict) -> dict:
    data = config.to_dict()
    return {field: data[field] for field in CONFIG_FIELDS}


def _provider_section(config, r: dict) -> dict:
    from kernelbay.registry import Provider, default_registry, slot_info
    from kernelbay_engine.models.auto import fallback_reason

    kind, model_impl = r["kind"], r["model_impl"]
    info = slot_info(kind, r["name"]) or {}
    claims = [c for c in (info.get("winner"), *info.get("displaced", [])) if c]  # the serving one first
    note = None
    if model_impl == "transformers" or not claims:  # resolve_impl succeeded: the fallback serves
        fallback = default_registry().fallback_claim(kind)
        if fallback is not None:
            note = f"the fallback serves: {fallback_reason(kind, r['name'])}"
            claims.insert(0, fallback.to_dict())
    elif model_impl == "auto":
        claims, note = _after_declines(config, r["name"], claims)
    serving = claims[0]["provider"] if claims else dict.fromkeys(Provider._fields)
    return {**serving, "displaced": [c["provider"] for c in claims[1:]], "note": note}


def _after_declines(config, name: str, claims: list[dict]) -> tuple[list[dict], str | None]:
    """The claims from the one that will serve on: a winner that declines this config (NoTarget, as an external
    build does off its hardware) gives way to the built-in implementation it displaced, as in `run`."""
    from kernelbay.registry import Provider
    from kernelbay_engine.models.auto import _import_target, decline_message, declined_reason

    builtin = next((i for i, c in enumerate(claims[1:], 1) if c["provider"]["origin"] == "built-in"), None)
    if builtin is None:  # nothing to fall back to: a decline would be an error, which building reports
        return claims, None
    reason = declined_reason(_import_target(claims[0]["target"]), config)
    if reason is None:
        return claims, None
    decliner, serving = (Provider(**claims[i]["provider"]).describe() for i in (0, builtin))
    return [claims[builtin], *claims[builtin + 1 :]], decline_message(decliner, name, reason, serving)


# -- attention -----------------------------------------------------------------------------------
def _attention_section(config, r: dict) -> dict:
    """Each layer group's backend with every candidate's reason; when a group has none, still every group's
    candidates (the selector's error carries them)."""
    from kernelbay.attention import NoCapableBackend
    from kernelbay.platforms import current_platform
    from kernelbay_engine.prefix_cache import prefix_caching_status
    from kernelbay_engine.selection import select_attention

    backend, kv_cache_dtype = r["backend"], r["kv_cache_dtype"]
    section = {"platform": current_platform().name, "requested_backend": backend, "kv_cache_dtype": kv_cache_dtype}
    layers = dict(config.layer_groups())
    try:
        selection = select_attention(config, kv_cache_dtype=kv_cache_dtype, requested=backend)
    except NoCapableBackend as err:
        groups = [_group(kind, layers[kind], result, reports) for kind, result, reports in err.groups]
        return {
            **section,
            "shared_backend": None,
            "runnable": False,
            "error": str(err),
            "layer_groups": groups,
            "prefix_caching": None,
        }
    groups = [_group(kind, layers[kind], result, result.candidates) for kind, result in selection.groups]
    caching = prefix_caching_status(selection, requested=True)  # the engine's default; `run` can turn it off
    return {
        **section,
        "shared_backend": selection.shared,
        "runnable": True,
        "error": None,
        "layer_groups": groups,
        "prefix_caching": {"enabled": caching.enabled, "reason": caching.reason},
    }


def _group(kind: str, layers, result, reports) -> dict:
    return {
        "kind": kind,
        "layers": list(layers),
        "backend": result.backend_name if result else None,
        "requirements": result.requirements.to_dict() if result else None,
        "candidates": [c.to_dict() for c in reports],
    }


# -- MoE ----------------------------------------------------------------------------------------------
def _moe_section(config, r: dict) -> dict | None:
    """None for a dense model; else the experts' geometry and the MoE kernel chosen for them, with reasons."""
    from kernelbay.errors import ConfigError
    from kernelbay.moe import MOE_BACKEND_ENV
    from kernelbay_engine.selection import select_moe, stored_expert_format

    if config.moe is None:
        return None
    requested = r["moe_backend"]
    section = {**config.moe.to_dict(), "stored_format": stored_expert_format(config)[0], "requested_backend": requested}
    try:
        picked = select_moe(config, requested=requested)
    except ConfigError as err:
        if requested or os.environ.get(MOE_BACKEND_ENV):  # a kernel asked for by flag or KERNELBAY_MOE_BACKEND
            raise
        none: dict[str, Any] = {"backend": None, "dequantized": None, "requirements": None, "candidates": []}
        return {**section, **none, "runnable": False, "error": str(err)}
    assert picked is not None  # config.moe is set
    selection, dequantized = picked
    result = selection.to_dict()
    chosen = {key: result[key] for key in ("backend", "requirements", "candidates")}
    return {**section, **chosen, "dequantized": dequantized, "runnable": True, "error": None}


def _engine_sections(config, options: dict) -> dict:
    """The sections that answer `--memory` and `--quantization` (explain/sections.py), by name; None answers
    (the option not given) are left out."""
    from .sections import SECTIONS as ENGINE_SECTIONS

    answers = {name: make(config, options) for name, make in ENGINE_SECTIONS.items()}
    return {name: section for name, section in answers.items() if section is not None}


# -- KV cache --------------------------------------------------------------------------------------
def _kv_section(config, r: dict) -> dict:
    """What the config's caches take per token and for a full context (a budget's blocks: the engine's section)."""
    kv_cache_dtype = r["kv_cache_dtype"]
    per_token = config.kv_bytes_per_token(kv_cache_dtype)
    return {
        "dtype": config.dtype if kv_cache_dtype in (None, "auto") else kv_cache_dtype,
        "bytes_per_token": per_token,
        "indexer_bytes_per_token": config.indexer_kv_bytes_per_token(kv_cache_dtype),
        "context_tokens": config.max_position_embeddings,
        "context_bytes": per_token * config.max_position_embeddings,
    }


# -- text ------------------------------------------------------------------------------------------
def render_text(doc: dict) -> str:
    """The document for a terminal: one section per step of the resolution, in the document's order."""
    lines = [*_preferred_backend_notes(doc["attention"]), f"model        {doc['model_path']}"]
    for key, (_, text) in SECTIONS.items():
        lines += text(doc[key])
    return "\n".join(lines)


def _preferred_backend_notes(a: dict) -> list[str]:
    """First of all: the platform's preferred attention backend cannot serve this model (a vendor's backend that
    declares too little is otherwise passed over quietly for the next candidate), with its failures."""
    if a["requested_backend"]:
        return []
    notes = {}
    for group in a["layer_groups"]:
        preferred = next((c for c in group["candidates"] if c["source"] == "platform priority"), None)
        if preferred is not None and not preferred["capable"] and preferred["name"] not in notes:
            instead = f"{group['backend']} serves it instead" if group["backend"] else "no backend can serve it"
            notes[preferred["name"]] = (
                f"note         {a['platform']}'s preferred attention backend {preferred['name']} cannot serve this "
                f"model ({'; '.join(preferred['failures'])}); {instead}"
            )
    return list(notes.values())


def _config_lines(c: dict) -> list[str]:
    extra = f", sliding window {c['sliding_window']}" if c["sliding_window"] else ""
    extra += ", MLA" if c["mla"] else ""
    extra += ", attention sinks" if c.get("attention_sinks") else ""
    indexer = c.get("indexer")
    if indexer:
        extra += (
            f", DSA indexer ({indexer['index_n_heads']} heads x {indexer['index_head_dim']}, "
            f"top-{indexer['index_topk']} keys per query)"
        )
    extra += f", {c['quantization']['quant_method']} quantized" if c["quantization"] else ""
    total, active = c["parameters"]["total"], c["parameters"]["active_per_token"]
    extra += f", {scaled(total, COUNT_UNITS, str(total))} parameters"
    extra += f" ({scaled(active, COUNT_UNITS, str(active))} active/token)" if active != total else ""
    line = (
        f"config       {c['model_type']} / {c['architecture']}: {c['num_hidden_layers']} layers, hidden "
        f"{c['hidden_size']}, {c['num_attention_heads']} heads / {c['num_key_value_heads']} KV heads, head_dim "
        f"{c['head_dim']}, {c['dtype']}, context {c['max_position_embeddings']}{extra}"
    )
    return [line, *(f"  note       {note}" for note in c["notes"])]  # how a default or quirk was resolved


def _provider_lines(p: dict) -> list[str]:
    from kernelbay.registry import Provider

    serving = Provider(*(p[field] for field in Provider._fields))
    lines = [f"provider     {serving.describe()}", *([f"             {p['note']}"] if p.get("note") else [])]
    return lines + [f"             displaces {Provider(**d).describe()}" for d in p["displaced"]]


def _attention_lines(a: dict) -> list[str]:
    head = f"attention    on {a['platform']}, kv cache {a['kv_cache_dtype']}"
    head += f", requested {a['requested_backend']}" if a["requested_backend"] else ""
    lines = [head]
    for g in a["layer_groups"]:
        lines.append(f"  {g['kind']:<20} layers {compact_layers(g['layers'])} -> {g['backend'] or 'NO BACKEND'}")
        lines += candidate_lines(g["candidates"], 10)
    if a["prefix_caching"]:
        lines.append(f"  prefix caching {a['prefix_caching']['reason']}")
    if a["error"]:
        lines.append(f"  cannot run: {a['error']}")
    return lines


def _moe_lines(m: dict | None) -> list[str]:
    if m is None:
        return []
    shared = f" + shared expert {m['shared_intermediate_size']}" if m["shared_intermediate_size"] else ""
    head = (
        f"moe          {m['num_experts']} experts, top-{m['top_k']} ({m['routing']}"
        f"{', renormalised' if m['normalize'] else ''}), expert width {m['intermediate_size']}{shared}, "
        f"{m['activation']}{', biases' if m['bias'] else ''}; layers {compact_layers(m['layers'])}"
    )
    lines = [head]
    if m["backend"] is None:
        return [*lines, f"  cannot run: {m['error']}"]
    stored = m["stored_format"]
    how = f", {stored} experts dequantized at load (no capable kernel reads {stored})" if m["dequantized"] else ""
    lines.append(f"  kernel     {m['backend']}{' (requested)' if m['requested_backend'] else ''}{how}")
    return lines + candidate_lines(m["candidates"], 18)


def _kv_lines(k: dict) -> list[str]:
    share = k["indexer_bytes_per_token"]
    share_text = f", of which {share:,} the DSA indexer keys" if share else ""
    return [
        f"kv cache     {k['bytes_per_token']:,} bytes/token ({k['dtype']}{share_text}); "
        f"the full {k['context_tokens']:,}-token context takes {human_bytes(k['context_bytes'])}"
    ]


# Each section of the document, in order: how it is built (config, options) and how the text shows it.
SECTIONS: dict[str, tuple[Callable[[Any, dict], Any], Callable[[Any], list[str]]]] = {
    "config": (_config_section, _config_lines),
    "resolution": (
        lambda _config, r: {"kind": r["kind"], "name": r["name"]},
        lambda r: [f"resolves to  {r['kind']} slot {r['name']!r}"],
    ),
    "provider": (_provider_section, _provider_lines),
    "attention": (_attention_section, _attention_lines),
    "moe": (_moe_section, _moe_lines),
    "kv_cache": (_kv_section, _kv_lines),
    "sections": (_engine_sections, lambda sections: [line for s in sections.values() for line in s["lines"]]),
}

__all__ = ["explain_model", "render_text"]
