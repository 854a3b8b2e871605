"""The public-API check (tools/api_snapshot.py, griffe): the tree keeps the snapshot's API, a break is caught and
named by its public path, a declared break passes, a private change is no break."""

from __future__ import annotations

import re
import shutil

import pytest

from tools import api_snapshot
from tools.api_snapshot import check, dump, load_snapshot, load_tree, public_api

CORE = api_snapshot.CORE


def test_tree_keeps_the_snapshot_api():
    """`--check` on this tree against docs/contract-api/kernelbay.json finds no undeclared break and no stale
    declaration (regenerate with `python tools/api_snapshot.py --update` at a release)."""
    result = check()
    assert not result.undeclared, "\n".join(map(str, result.undeclared))
    assert not result.unused_declarations, f"declared breaks that break nothing: {result.unused_declarations}"
    assert result.compared > 300


def test_snapshot_round_trip_is_lossless(tmp_path):
    """A dump read back has the tree's public API, re-exports and inherited members included, and compares to it
    with no break; its file paths are relative (it names no machine)."""
    snapshot = tmp_path / "kernelbay.json"
    snapshot.write_text(dump(load_tree(), CORE.parent))
    assert public_api(load_snapshot(snapshot)) == public_api(load_tree())
    assert str(CORE.parent) not in snapshot.read_text()
    assert check(snapshot, CORE, tmp_path / "none.txt", tmp_path / "none.txt").undeclared == []


@pytest.fixture
def copy(tmp_path) -> dict:
    """A copy of core/kernelbay in tmp, its snapshot beside it, and an editor for its source files."""
    core = tmp_path / "core"
    shutil.copytree(CORE / "kernelbay", core / "kernelbay", ignore=shutil.ignore_patterns("__pycache__"))
    snapshot = tmp_path / "kernelbay.json"
    snapshot.write_text(dump(load_tree(core), tmp_path))

    def edit(relative: str, pattern: str, replacement: str, count: int = 1) -> None:
        path = core / "kernelbay" / relative
        text, done = re.subn(pattern, replacement, path.read_text(), count=count)
        assert done, f"{pattern!r} not in {relative}: the test's edit needs updating"
        path.write_text(text)

    return dict(
        core=core,
        snapshot=snapshot,
        declared=tmp_path / "declared-breaks.txt",
        deprecated=tmp_path / "deprecations.txt",
        edit=edit,
    )


def _check(copy):
    return check(copy["snapshot"], copy["core"], copy["declared"], copy["deprecated"])


def _broken(result) -> dict[str, str]:
    return {path: found.explanation for found in result.undeclared for path in found.paths}


def test_removed_function_is_an_undeclared_break(copy):
    """A public function renamed (so removed) fails the check, named by its public path."""
    copy["edit"]("registry/__init__.py", r"\bdef default_registry\(", "def default_registry_renamed(")
    broken = _broken(_check(copy))
    assert "kernelbay.registry.default_registry" in broken
    assert "Public object was removed" in broken["kernelbay.registry.default_registry"]


def test_renamed_parameter_of_a_reexport_is_named_by_its_public_paths(copy):
    """A parameter renamed in a function defined in a private module and re-exported is reported under the names
    plugins import it by (`kernelbay.attention.X`, the lazy `kernelbay.X`), not only its private definition."""
    copy["edit"]("attention/_selector.py", r"(\bdef select_attention_backend\(\s*)(\w+)", r"\1\2_renamed")
    found = _check(copy).undeclared
    assert [b.paths for b in found] == [
        (
            "kernelbay.select_attention_backend",
            "kernelbay.attention.select_attention_backend",
            "kernelbay.attention._selector.select_attention_backend",
        )
    ] * 2
    assert "Parameter was removed" in found[0].explanation and "added as required" in found[1].explanation


def test_lazy_export_dropped_is_a_break(copy):
    """A name dropped from the package's lazy `_LAZY` table (PEP 562, invisible to griffe alone) is a break."""
    copy["edit"]("__init__.py", r'\n\s*"resolve",', "")
    assert "kernelbay.resolve" in _broken(_check(copy))


def test_name_dropped_from_all_is_a_break(copy):
    """A name dropped from a module's `__all__` but still imported there (griffe sees no change) is a break: it is
    no longer public."""
    copy["edit"]("attention/__init__.py", r'\n\s*"select_for_layer_groups",', "")
    (found,) = _check(copy).undeclared
    assert found.paths[0] == "kernelbay.attention.select_for_layer_groups"
    assert "no longer reaches" in found.explanation


def test_declared_break_passes(copy):
    """A break declared (`path  # reason`) in the declared-breaks file passes; a declaration without a reason is
    refused, and one that breaks nothing is reported as stale."""
    copy["edit"]("registry/__init__.py", r"\bdef default_registry\(", "def default_registry_renamed(")
    copy["declared"].write_text(
        "# comments and blank lines are fine\n\n"
        "kernelbay.registry.default_registry  # renamed in 0.2: plugins pinned kernelbay<0.2\n"
        "kernelbay.hooks.nothing_broke_here  # stale\n"
    )
    result = _check(copy)
    assert result.undeclared == []
    assert [str(b).split(":")[0] for b in result.declared] == ["kernelbay.registry.default_registry"]
    assert result.unused_declarations == ["kernelbay.hooks.nothing_broke_here"]
    copy["declared"].write_text("kernelbay.registry.default_registry\n")
    with pytest.raises(SystemExit, match="says why"):
        _check(copy)


def test_listed_deprecation_passes(copy):
    """A renamed name listed in the deprecations file (its old spelling kept working) passes like a declared break."""
    copy["edit"]("registry/__init__.py", r"\bdef default_registry\(", "def default_registry_renamed(")
    copy["deprecated"].write_text("kernelbay.registry.default_registry  # renamed; the old name warns until 0.2\n")
    result = _check(copy)
    assert result.undeclared == [] and [str(b).split(":")[0] for b in result.declared] == [
        "kernelbay.registry.default_registry"
    ]


def test_a_platforms_priority_order_is_tuning_but_its_removal_a_break(copy):
    """A new backend order in a platform's priority (its value) is no break; the attribute gone is, and so is a new
    value of any other public attribute."""
    copy["edit"]("platforms/cpu.py", r'default_priority = \("CPU_PAGED", ', 'default_priority = ("SDPA", "CPU_PAGED", ')
    assert _check(copy).undeclared == []
    copy["edit"]("platforms/__init__.py", r"\n    moe_priority: ClassVar.*", "")
    copy["edit"]("platforms/__init__.py", r'(\n    device_type: ClassVar\[str\] = )""', r'\1"none"')
    broken = _broken(_check(copy))
    assert "Public object was removed" in broken["kernelbay.platforms.Platform.moe_priority"]
    assert "Attribute value was changed" in broken["kernelbay.platforms.Platform.device_type"]


def test_private_changes_are_no_break(copy):
    """Renaming or removing private objects (in a public module, a private module, a public class) breaks
    nothing: the check concerns the public API only."""
    copy["edit"]("registry/__init__.py", r"\n_default_lock = .*", "")
    copy["edit"]("attention/_selector.py", r"\bdef _verdicts\(", "def _verdicts_renamed(")
    copy["edit"]("attention/_capabilities.py", r"\bdef _check_output\(self, out", "def _check_output(self, output")
    result = _check(copy)
    assert result.undeclared == [] and result.compared > 300


def test_cli_exit_codes(copy, monkeypatch, capsys):
    """`--check` exits 1 listing each undeclared break on its own line, 0 with the count of objects compared."""
    monkeypatch.setattr(api_snapshot, "SNAPSHOT", copy["snapshot"])
    monkeypatch.setattr(api_snapshot, "CORE", copy["core"])
    monkeypatch.setattr(api_snapshot, "DECLARED", copy["declared"])
    monkeypatch.setattr(api_snapshot, "DEPRECATED", copy["deprecated"])
    monkeypatch.setattr(api_snapshot, "REPO", copy["core"].parent)
    assert api_snapshot.main(["--check"]) == 0
    assert "public objects compared" in capsys.readouterr().out
    copy["edit"]("registry/__init__.py", r"\bdef default_registry\(", "def default_registry_renamed(")
    assert api_snapshot.main(["--check"]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("kernelbay.registry.default_registry: ") and "1 undeclared break" in err
