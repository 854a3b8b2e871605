"""The core's public API against its last released snapshot, read statically with griffe (nothing is imported).

    python tools/api_snapshot.py --update   # write docs/contract-api/kernelbay.json (at a release)
    python tools/api_snapshot.py --check    # exit 1 on every undeclared break of the public API since then

`--update` dumps `kernelbay` as loaded from core/ with griffe's JSON encoder (private modules included: most
public names are re-exported from them); `--check` loads that dump back and runs `griffe.find_breaking_changes`
against the tree. Only the public API is the contract: griffe skips private objects (a leading underscore, a name
missing from its module's `__all__`, a plain import), and so does the count of objects compared.

The rule: a break must be declared, one line in docs/contract-api/declared-breaks.txt naming the public object
(`kernelbay.attention.select_for_model  # why`), and a declared break means the core version's minor bump, so that
plugins pinned `kernelbay<0.N` are refused by name instead of half-working. A rename whose old spelling keeps
working with a DeprecationWarning (kernelbay._deprecation) is no break, but griffe, reading statically, reports the
old name gone: such names are listed in docs/contract-api/deprecations.txt the same way (and tested to still work).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import griffe

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "core"
SNAPSHOT = REPO / "docs" / "contract-api" / "kernelbay.json"
DECLARED = REPO / "docs" / "contract-api" / "declared-breaks.txt"
DEPRECATED = REPO / "docs" / "contract-api" / "deprecations.txt"
PACKAGE = "kernelbay"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Break:
    paths: tuple[str, ...]  # the public names of the broken object (and its defining path)
    explanation: str  # griffe's one-line explanation

    def __str__(self) -> str:
        return f"{self.paths[0]}: {self.explanation}"


@dataclass(frozen=True)
class CheckResult:
    undeclared: list[Break]
    declared: list[Break]
    unused_declarations: list[str]  # declared paths that broke nothing (stale lines to remove)
    compared: int  # public objects in the snapshot


def load_tree(core: Path = CORE) -> griffe.Module:
    """`kernelbay` as its source in `core` defines it, the lazily exported names included."""
    package = griffe.load(PACKAGE, search_paths=[core], allow_inspection=False)
    _add_lazy_exports(package)
    return package


def _add_lazy_exports(module: griffe.Module) -> None:
    """griffe reads no PEP 562 `__getattr__`: a package's `_LAZY` table (name -> defining module, see
    kernelbay.lazy) is evaluated from its source and its names become aliases, exported as `__all__` says."""
    if "_LAZY" in module.members:
        table, scope = module["_LAZY"], {"__builtins__": {}, "dict": dict}
        exec(table.source, scope)
        for name, where in scope["_LAZY"].items():
            alias = griffe.Alias(name, f"{where}.{name}", lineno=table.lineno, endlineno=table.endlineno, parent=module)
            module.set_member(name, alias)
        module.exports = sorted({*(module.exports or ()), *scope["_LAZY"]})
    for member in module.modules.values():
        _add_lazy_exports(member)


def dump(package: griffe.Module, root: Path) -> str:
    """griffe's JSON of `package`, file paths relative to `root` (the snapshot must not name this machine) and
    members as lists, the decoder's other accepted form: in a dict keyed by name, a member named `cls` or `kind`
    makes griffe's decoder take the dict for an expression or an object."""

    def portable(key, data):
        if isinstance(data, dict):
            data = {k: portable(k, v) for k, v in data.items()}
            return list(data.values()) if key == "members" else data
        if isinstance(data, list):
            return [portable(None, v) for v in data]
        return os.path.relpath(data, root) if key == "filepath" else data

    return json.dumps(portable(None, json.loads(package.as_json())), indent=1) + "\n"


def load_snapshot(path: Path = SNAPSHOT) -> griffe.Module:
    """A dump read back. griffe's decoder returns a bare Module: aliases (re-exports) only resolve once it sits in
    a modules collection, and inherited members once its classes' bases know their scope again."""
    package = griffe.Module.from_json(path.read_text())
    griffe.ModulesCollection()[PACKAGE] = package  # sets package.modules_collection; the package keeps it alive
    _attach_bases(package)
    return package


def _attach_bases(scope: griffe.Module | griffe.Class) -> None:
    """The names in class bases get back the scope they are resolved in (the decoder leaves them detached)."""
    for member in scope.members.values():
        if member.is_alias or not (member.is_module or member.is_class):
            continue
        for base in member.bases if member.is_class else ():
            for part in [base] if isinstance(base, str) else base.iterate(flat=True):
                if isinstance(part, griffe.ExprName) and part.parent is None:
                    part.parent = scope
        _attach_bases(member)


def public_api(package: griffe.Module) -> dict[str, str]:
    """Public path -> defining path of every public object reachable from `package`; an object reached by several
    names has its members listed under the shortest. Aliases to objects outside the package (`typing.Any`,
    `torch.Tensor`) are skipped, as find_breaking_changes skips them."""
    found: dict[str, str] = {}
    walked, queue = {package.path}, [(package, package.path)]
    for obj, path in queue:  # breadth first: the names found do not depend on the order members are defined in
        for name, member in sorted(obj.all_members.items()):
            if not member.is_public:
                continue
            try:
                target = member.final_target if member.is_alias else member
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue
            found[f"{path}.{name}"] = target.path
            if (target.is_module or target.is_class) and target.path not in walked:
                walked.add(target.path)
                queue.append((target, f"{path}.{name}"))
    return found


def _public_names(path: str, defined_at: dict[str, list[str]]) -> tuple[str, ...]:
    """`kernelbay.attention._selector.select_for_model` -> the public names it is reached by, then itself."""
    prefix = path
    while prefix and prefix not in defined_at:
        prefix = prefix.rpartition(".")[0]
    names = [public + path[len(prefix) :] for public in defined_at.get(prefix, ())]
    return tuple(dict.fromkeys([*sorted(names, key=lambda n: (n.count("."), n)), path]))


def read_declared(path: Path = DECLARED) -> set[str]:
    """The declared breaks (or deprecations): `object.path  # reason` per line; blank lines and `#` comments
    skipped."""
    declared = set()
    for number, line in enumerate(path.read_text().splitlines() if path.exists() else (), 1):
        name, _, reason = line.partition("#")
        if name.strip():
            if not reason.strip():
                raise SystemExit(f"{path}:{number}: a declared break says why: `{name.strip()}  # reason`")
            declared.add(name.strip())
    return declared


def check(
    snapshot: Path = SNAPSHOT, core: Path = CORE, declared: Path = DECLARED, deprecated: Path = DEPRECATED
) -> CheckResult:
    """Every break of the snapshot's public API in the tree at `core`, sorted into declared (a declared break or a
    deprecated spelling that still works) and undeclared."""
    old, new = load_snapshot(snapshot), load_tree(core)
    old_api, new_api = public_api(old), public_api(new)
    defined_at: dict[str, list[str]] = {}
    for public, target in {**new_api, **old_api}.items():
        defined_at.setdefault(target, []).append(public)
    breaks = [
        Break(_public_names(breakage.obj.path, defined_at), _ANSI.sub("", breakage.explain()))
        for breakage in griffe.find_breaking_changes(old, new)
        # exports are compared name by name: a name no longer exported is a removed object
        if breakage.obj.name != "__all__" and not _is_tuning(breakage)
    ]
    # What griffe does not see: a public name whose scope is still there but that no longer reaches an object of
    # the package (its target moved out or is gone, its module's `__all__` dropped it, it became private).
    reported = {path for found in breaks for path in found.paths}
    for path in sorted(old_api.keys() - new_api.keys() - reported):
        if path.rpartition(".")[0] in (*new_api, PACKAGE):
            gone = f"public name no longer reaches an object of {PACKAGE} (was {old_api[path]})"
            breaks.append(Break((path, old_api[path]), gone))
    allowed = read_declared(declared) | read_declared(deprecated)
    undeclared = [found for found in breaks if not allowed.intersection(found.paths)]
    used = allowed.intersection(path for found in breaks for path in found.paths)
    matched = [found for found in breaks if found not in undeclared]
    return CheckResult(undeclared, matched, sorted(allowed - used), len(set(old_api.values())))


# A platform's backend order is tuning, not contract (docs/contract.md): which kernel a platform tries first may
# change in any release, as vLLM's does; the attributes stay, so every plugin naming them keeps working.
TUNING_VALUES = frozenset({"default_priority", "moe_priority"})


def _is_tuning(breakage) -> bool:
    """A new value of a tuning attribute (the attribute is still there, of the same kind)."""
    return breakage.kind is griffe.BreakageKind.ATTRIBUTE_CHANGED_VALUE and breakage.obj.name in TUNING_VALUES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--update", action="store_true", help=f"write {SNAPSHOT.relative_to(REPO)}")
    action.add_argument("--check", action="store_true", help="fail on an undeclared break since the snapshot")
    args = parser.parse_args(argv)
    if args.update:
        package = load_tree(CORE)
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(dump(package, CORE.parent))
        print(f"wrote {SNAPSHOT.relative_to(REPO)}: {len(set(public_api(package).values()))} public objects")
        return 0
    result = check(SNAPSHOT, CORE, DECLARED, DEPRECATED)
    for declared in result.declared:
        print(f"declared: {declared}")
    for stale in result.unused_declarations:
        print(f"declared but not broken (remove the line): {stale}")
    for undeclared in result.undeclared:
        print(undeclared)
    if result.undeclared:
        print(
            f"{len(result.undeclared)} undeclared break(s) of kernelbay's public API against "
            f"{SNAPSHOT.relative_to(REPO)}: restore each, or declare it in {DECLARED.relative_to(REPO)} "
            "and bump the core's minor version",
            file=sys.stderr,
        )
        return 1
    print(f"{result.compared} public objects compared with {SNAPSHOT.relative_to(REPO)}: no undeclared break")
    return 0


if __name__ == "__main__":
    sys.exit(main())
