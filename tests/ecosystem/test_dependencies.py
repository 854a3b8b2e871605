"""Dependencies point one way: kernels and platforms need the contract alone, models the runtime, and the core
imports no plugin (DESIGN.md, "Layout: the contract and the runtime")."""

from __future__ import annotations

import ast

import pytest
import tomllib
from packaging.requirements import Requirement

from tests._paths import REPO

CONTRACT_ONLY = ("plugins/torch", "plugins/flashinfer", "contrib/acme")  # attention backends and platforms
NEEDS_RUNTIME = ("plugins/llama", "plugins/deepseek", "plugins/gpt", "contrib/acme-llama")  # model families
RUNTIME = {"kernelbay-engine", "kernelbay-llama", "kernelbay-deepseek"}


def _requirements(folder: str) -> set[str]:
    project = tomllib.loads((REPO / folder / "pyproject.toml").read_text())["project"]
    return {Requirement(r).name for r in project["dependencies"]}


@pytest.mark.parametrize("folder", CONTRACT_ONLY)
def test_kernel_and_platform_plugins_require_the_contract_only(folder):
    """An attention-backend or platform plugin depends on kernelbay, never on the engine or a model family."""
    requires = _requirements(folder)
    assert "kernelbay" in requires and not requires & RUNTIME, f"{folder} requires {sorted(requires)}"


@pytest.mark.parametrize("folder", NEEDS_RUNTIME)
def test_model_plugins_reach_the_runtime(folder):
    """A model-family plugin builds on kernelbay-engine (directly or through the family it extends)."""
    requires = _requirements(folder)
    assert requires & RUNTIME, f"{folder} requires {sorted(requires)}"


def _imported_modules(path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    return {name.partition(".")[0] for name in names}


def test_the_core_imports_no_plugin():
    """No module of core/kernelbay imports kernelbay_engine or any concrete plugin package."""
    offenders = {
        str(path.relative_to(REPO)): sorted(m for m in _imported_modules(path) if m.startswith("kernelbay_"))
        for path in (REPO / "core/kernelbay").rglob("*.py")
    }
    assert not {path: mods for path, mods in offenders.items() if mods}
