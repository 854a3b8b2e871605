"""The `kernelbay explain --json` document's schema (version 1) as data, and a validator for it.

A spec is a type, a tuple of types (None allowed), a dict (an object with exactly these keys) or a
one-element list (an array of that spec). docs/explain-schema.md describes every key; a test keeps
the two in step.
"""

from __future__ import annotations

from typing import Any

OPT_INT = (int, None)
OPT_STR = (str, None)

CANDIDATE = {"name": str, "source": str, "chosen": bool, "capable": bool, "reason": str, "failures": [str]}
LAYER_GROUP = {
    "kind": str,
    "layers": [int],
    "backend": OPT_STR,
    "requirements": (dict, None),
    "candidates": [CANDIDATE],
}
MOE = {
    "num_experts": int,
    "top_k": int,
    "intermediate_size": int,
    "layers": [int],
    "activation": str,
    "routing": str,
    "normalize": bool,
    "scaling": (float, int),
    "num_groups": int,
    "top_groups": int,
    "shared_intermediate_size": int,
    "shared_gate": bool,
    "bias": bool,
    "router_bias": bool,
    "alpha": (float, None),
    "limit": (float, None),
    "stored_format": str,
    "requested_backend": OPT_STR,
    "backend": OPT_STR,
    "dequantized": (bool, None),
    "runnable": bool,
    "error": OPT_STR,
    "requirements": (dict, None),
    "candidates": [CANDIDATE],
}
PROVIDER = {"module": OPT_STR, "distribution": OPT_STR, "version": OPT_STR, "origin": OPT_STR, "path": OPT_STR}

SCHEMA: dict[str, Any] = {
    "schema_version": int,
    "model_path": str,
    "config": {
        "model_type": str,
        "architecture": str,
        "architectures": [str],
        "model_kind": str,
        "dtype": str,
        "num_hidden_layers": int,
        "hidden_size": int,
        "num_attention_heads": int,
        "num_key_value_heads": int,
        "head_dim": int,
        "vocab_size": int,
        "max_position_embeddings": int,
        "sliding_window": OPT_INT,
        "attention_chunk_size": OPT_INT,
        "attention_sinks": bool,
        "mla": (dict, None),
        "indexer": (dict, None),
        "quantization": (dict, None),
        "parameters": {"total": int, "active_per_token": int},
        "notes": [str],
    },
    "resolution": {"kind": str, "name": str},
    "provider": {**PROVIDER, "displaced": [PROVIDER], "note": OPT_STR},
    "attention": {
        "platform": str,
        "requested_backend": OPT_STR,
        "kv_cache_dtype": str,
        "shared_backend": (bool, None),
        "runnable": bool,
        "error": OPT_STR,
        "layer_groups": [LAYER_GROUP],
    },
    "moe": (MOE, None),  # null for a dense model
    "sections": dict,  # name -> a plugin's section (hook register_explain_sections), each with "lines": [str]
    "kv_cache": {
        "dtype": str,
        "bytes_per_token": int,
        "indexer_bytes_per_token": int,
        "context_tokens": int,
        "context_bytes": int,
        "memory_bytes": OPT_INT,
        "tokens_that_fit": OPT_INT,
    },
}


def validate(doc: Any, spec: Any = SCHEMA, path: str = "$") -> list[str]:
    """Every place where `doc` departs from `spec`, as "path: problem" lines (empty when valid)."""
    if isinstance(spec, dict):
        return _validate_object(doc, spec, path)
    if isinstance(spec, tuple) and isinstance(spec[0], dict):  # a nullable object
        return [] if doc is None else validate(doc, spec[0], path)
    if isinstance(spec, list):
        if not isinstance(doc, list):
            return [f"{path}: expected an array, got {type(doc).__name__}"]
        return [p for i, item in enumerate(doc) for p in validate(item, spec[0], f"{path}[{i}]")]
    return _validate_scalar(doc, spec, path)


def _validate_object(doc: Any, spec: dict, path: str) -> list[str]:
    if not isinstance(doc, dict):
        return [f"{path}: expected an object, got {type(doc).__name__}"]
    problems = [f"{path}: missing key {k!r}" for k in spec if k not in doc]
    problems += [f"{path}: unexpected key {k!r}" for k in doc if k not in spec]
    return problems + [p for k in spec if k in doc for p in validate(doc[k], spec[k], f"{path}.{k}")]


def _validate_scalar(doc: Any, spec, path: str) -> list[str]:
    allowed = spec if isinstance(spec, tuple) else (spec,)
    types = tuple(type(None) if t is None else t for t in allowed)
    ok = isinstance(doc, types) and not (isinstance(doc, bool) and bool not in types)
    return [] if ok else [f"{path}: expected {' or '.join(_name(t) for t in allowed)}, got {doc!r}"]


def _name(t) -> str:
    return "null" if t is None else {int: "integer", str: "string", bool: "boolean", dict: "object"}.get(t, t.__name__)


def keys(spec: Any = SCHEMA, prefix: str = "") -> list[str]:
    """Dotted names of every key in the schema (arrays add `[]`)."""
    if isinstance(spec, list):
        return keys(spec[0], prefix + "[]")
    if isinstance(spec, tuple) and isinstance(spec[0], dict):
        return keys(spec[0], prefix)
    if not isinstance(spec, dict):
        return []
    out = []
    for k, sub in spec.items():
        name = f"{prefix}.{k}" if prefix else k
        out += [name, *keys(sub, name)]
    return out
