"""Scans that keep the contract honest: what a distribution imports of another is public, layer kinds are spelled
through the one vocabulary, and no package's modules import each other in a loop."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kernelbay.attention import LayerKind
from tests._paths import REPO

PACKAGES = sorted(
    [REPO / "core" / "kernelbay", *REPO.glob("plugins/*/kernelbay_*"), *REPO.glob("contrib/*/kernelbay_*")]
)


def _sources(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "tests" not in p.relative_to(package).parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _foreign_private_imports(path: Path, own: str) -> list[str]:
    """`module[:name]` for every import of another kernelbay package's underscore module or name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            pairs = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            pairs = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in pairs:
            top = module.partition(".")[0]
            if top == own or not top.startswith("kernelbay"):
                continue
            if any(map(_private, module.split("."))) or (name is not None and _private(name)):
                found.append(f"{module}:{name}" if name else module)
    return found


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_no_distribution_imports_another_ones_private_modules(package):
    """Everything a plugin uses of the core (or of the engine) is public: no `kernelbay.x._y` imports."""
    offenders = {
        str(path.relative_to(REPO)): found
        for path in _sources(package)
        if (found := _foreign_private_imports(path, package.name))
    }
    assert not offenders, f"private imports across distributions (make the name public): {offenders}"


# Requirement and declaration fields that share a layer kind's spelling but name a capability, not a kind.
FIELD_NAMES = {"chunked_attention"}
VOCABULARY = REPO / "core" / "kernelbay" / "attention" / "_geometry.py"


def _kind_literals(path: Path) -> list[str]:
    kinds = {kind.value for kind in LayerKind} - FIELD_NAMES
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"line {node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in kinds
    ]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_layer_kinds_are_spelled_through_the_vocabulary(package):
    """Outside `LayerKind` itself, no source spells a layer kind as a raw string ("sliding_attention", ...)."""
    offenders = {
        str(path.relative_to(REPO)): found
        for path in _sources(package)
        if path != VOCABULARY and (found := _kind_literals(path))
    }
    assert not offenders, f"raw layer-kind strings (use kernelbay.attention.LayerKind): {offenders}"


def _module_name(package: Path, path: Path) -> str:
    parts = [package.name, *path.relative_to(package).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(path: Path, module: str) -> set[str]:
    """Every module `path` imports at run time (top level or inside a function; TYPE_CHECKING blocks left out)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for sub in ast.walk(node)
    }
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            parent = base[: len(base) - node.level + 1] if node.level else []
            target = ".".join([*parent, *([node.module] if node.module else [])])
            found |= {target, *(f"{target}.{alias.name}" for alias in node.names)}
    return found


def _import_graph(package: Path) -> dict[str, set[str]]:
    modules = {_module_name(package, path): path for path in _sources(package)}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name in _runtime_imports(path, module):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):  # its own package: not a loop
                targets.add(name)
        graph[module] = targets
    return graph


def _loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                loops.append(sorted([node, *component]))

    for node in graph:
        if node not in index:
            visit(node)
    return loops


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_no_import_loops_inside_a_package(package):
    """No two modules of a package import each other, directly or round a loop, even inside functions."""
    assert not _loops(_import_graph(package)), _loops(_import_graph(package))


def test_true_and_false_words_have_one_parser():
    """The on/off words ("yes", "off", ...) are spelled once, in kernelbay._trace.bool_word's vocabulary."""
    home = REPO / "core" / "kernelbay" / "_trace.py"
    spelled = {
        str(path.relative_to(REPO))
        for package in PACKAGES
        for path in _sources(package)
        if path != home
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in ("yes", "off")
    }
    assert not spelled, f"a second true/false word list (use kernelbay._trace.bool_word): {sorted(spelled)}"


def test_the_first_party_table_is_the_first_party_metadata():
    """What the registry says each first-party plugin provides (named in "pip install ..." hints, whether it is
    installed or not) is generated from those plugins' pyproject.toml entry points: the shipped file is current."""
    from kernelbay.registry import first_party_names
    from kernelbay.registry._records import FIRST_PARTY_TABLE, INDEX_GROUP
    from tools.first_party_table import rendered

    assert Path(FIRST_PARTY_TABLE).read_text() == rendered(), "stale: run python tools/first_party_table.py"
    assert first_party_names("model")["LlamaForCausalLM"] == "kernelbay-llama"
    assert set(first_party_names("weight_format")) == {"safetensors", "gguf"}
    assert all(first_party_names(kind) == {} for kind in INDEX_GROUP if kind in ("platform", "draft_model"))
