"""The contract's packages list their exports literally: a type checker reads `__all__` without running it, so a
plugin author's `mypy --strict` (no implicit re-export; kernelbay ships py.typed) accepts
`from kernelbay.attention import AttentionBackend` only when the name is in a literal `__all__`."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGES = ("kernelbay.attention", "kernelbay_engine.config", "kernelbay.moe", "kernelbay.registry")


def _literal_all(module) -> list[str]:
    tree = ast.parse(Path(module.__file__).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return ast.literal_eval(node.value)  # raises on anything computed
    raise AssertionError(f"{module.__name__} has no __all__")


@pytest.mark.parametrize("name", PACKAGES)
def test_exports_are_a_literal_list_of_importable_names(name):
    module = importlib.import_module(name)
    exported = _literal_all(module)
    assert exported == module.__all__ and len(set(exported)) == len(exported)
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"
    imported = {
        alias.asname or alias.name
        for node in ast.parse(Path(module.__file__).read_text()).body
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 1
        for alias in node.names
    }
    unlisted = sorted(n for n in imported if not n.startswith("_") and n not in exported)
    assert not unlisted, f"{name} imports {unlisted} from its modules without exporting them"
