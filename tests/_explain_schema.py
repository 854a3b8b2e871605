"""The `kernelbay explain --json` document's JSON Schema (docs/explain.schema.json), checked with jsonschema."""

from __future__ import annotations

import json
from functools import cache

import jsonschema

from tests._paths import REPO

SCHEMA_PATH = REPO / "docs" / "explain.schema.json"


@cache
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


@cache
def _validator() -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(schema())
    return jsonschema.Draft202012Validator(schema())


def validate(doc) -> list[str]:
    """Every place where `doc` departs from the schema, as "path: problem" lines (empty when valid)."""
    errors = sorted(_validator().iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{error.json_path}: {error.message}" for error in errors]


def keys(node: dict | None = None, prefix: str = "") -> list[str]:
    """Dotted names of every key the schema names (array items add `[]`; `$ref`s followed)."""
    node = schema() if node is None else node
    if "$ref" in node:
        node = schema()["$defs"][node["$ref"].rpartition("/")[2]]
    if "items" in node:
        return keys(node["items"], prefix + "[]")
    out = []
    for key, sub in node.get("properties", {}).items():
        name = f"{prefix}.{key}" if prefix else key
        out += [name, *keys(sub, name)]
    return out
