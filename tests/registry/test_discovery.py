"""Discovery reads installed metadata only, filters before any import, and checks the core-API range."""

from __future__ import annotations

import sys

from kernelbay.registry._discovery import discover

from .conftest import fixture_imports


def _discover(site, **env):
    return discover(env, path=[str(site), *sys.path])


def test_fixture_distributions_are_discovered_from_metadata_without_import(fixture_site):
    """Every fixture distribution shows up with its groups, and no fixture module is executed."""
    found = _discover(fixture_site)
    assert {"kb-fixture-good", "kb-fixture-syntax", "kb-fixture-liar"} <= set(found.plugins)
    good = found.plugins["kb-fixture-good"]
    assert good.groups["kernelbay.models"] == ["GoodForCausalLM", "GoodLMHeadModel", "GoodVisionModel"]
    assert good.origin == "external" and good.version == "1.0"
    assert fixture_imports() == []


def test_core_api_mismatch_is_refused_naming_both_versions(fixture_site):
    """A plugin requiring kernelbay<0.1 is refused with both versions named, and its entries are dropped."""
    found = _discover(fixture_site)
    info = found.plugins["kb-fixture-badversion"]
    assert "kb-fixture-badversion 1.0 requires kernelbay<0.1" in info.refused
    assert "kernelbay 0.1.0 is installed" in info.refused
    assert not [e for e in found.entries if e.distribution == "kb-fixture-badversion"]
    assert any("kb-fixture-badversion 1.0 refused" in f for f in found.findings())


def test_allow_list_keeps_only_named_distributions_and_reports_unknown_names(fixture_site):
    """KERNELBAY_PLUGINS filters by distribution (the core stays) and an unknown name is reported."""
    found = _discover(fixture_site, KERNELBAY_PLUGINS="kb_fixture_good, no-such-plugin")
    used = {e.distribution for e in found.entries}
    assert used == {"kb-fixture-good", "kernelbay"}
    assert found.plugins["kb-fixture-other"].refused == "disabled: not in KERNELBAY_PLUGINS"
    assert found.unknown_filter_names == ["no-such-plugin"]
    assert (
        "'no-such-plugin' in KERNELBAY_PLUGINS/KERNELBAY_DISABLE_PLUGINS is not an installed plugin distribution"
        in found.findings()
    )


def test_deny_list_removes_a_distribution(fixture_site):
    """KERNELBAY_DISABLE_PLUGINS removes exactly the named distributions."""
    found = _discover(fixture_site, KERNELBAY_DISABLE_PLUGINS="kb-fixture-good,kb-fixture-typo")
    used = {e.distribution for e in found.entries}
    assert "kb-fixture-good" not in used and "kb-fixture-other" in used
    assert found.unknown_filter_names == ["kb-fixture-typo"]


def _write_dist(site, name, version, requires=(), models=("XForCausalLM",), kind="dist-info"):
    """One installed distribution in PyPA on-disk form: dist-info (METADATA), or egg-info (PKG-INFO, requires.txt)."""
    meta = site / f"{name.replace('-', '_')}-{version}.{kind}"
    meta.mkdir(parents=True)
    header = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    if kind == "dist-info":
        (meta / "METADATA").write_text(header + "".join(f"Requires-Dist: {r}\n" for r in requires))
    else:
        (meta / "PKG-INFO").write_text(header)
        (meta / "requires.txt").write_text("".join(f"{r}\n" for r in requires))
    (meta / "entry_points.txt").write_text(
        "[console_scripts]\nx = x:main\n\n[kernelbay.models]\n"
        + "".join(f"{m} = {name.replace('-', '_')}.modeling\n" for m in models)
    )
    return meta


def test_first_copy_of_a_distribution_on_the_path_wins(tmp_path):
    """The same distribution installed twice: the copy earlier on the path is the one used, as for imports."""
    first, second = tmp_path / "a", tmp_path / "b"
    _write_dist(first, "kb-twice", "2.0", models=("NewForCausalLM",))
    _write_dist(second, "kb-twice", "1.0", models=("OldForCausalLM",))
    for path, version, model in (
        ([first, second], "2.0", "NewForCausalLM"),
        ([second, first], "1.0", "OldForCausalLM"),
    ):
        found = discover({}, path=[str(p) for p in path])
        assert found.plugins["kb-twice"].version == version
        assert [(e.name, e.version) for e in found.entries] == [(model, version)]
        assert found.plugins["kb-twice"].location.endswith(f"kb_twice-{version}.dist-info")


def test_egg_info_requirements_and_other_groups_are_read_through_the_library(tmp_path):
    """An egg-info's requires.txt carries the core requirement; entry points of other groups are ignored."""
    _write_dist(tmp_path, "kb-egg", "1.0", requires=("kernelbay<0.1",), kind="egg-info")
    _write_dist(tmp_path, "kb-plain", "1.0", models=())
    found = discover({}, path=[str(tmp_path)])
    assert "kb-egg 1.0 requires kernelbay<0.1" in found.plugins["kb-egg"].refused
    assert found.plugins["kb-egg"].groups == {"kernelbay.models": ["XForCausalLM"]}
    assert "kb-plain" in found.plugins and found.plugins["kb-plain"].groups == {}


# Every specifier form PEP 440 allows, the prerelease and local ones included
SPECS = [
    ">=0.1,<0.2",
    "<0.1",
    "==0.1.0",
    "==0.1",
    "!=0.1.0",
    "~=0.1",
    ">0.1",
    "<=0.1",
    "==0.1.*",
    ">=0.1.0rc1",
    "<0.1.dev0",
    ">=1",
    ">0.0.9",
    "<0.1.1",
    ">= 0.1 , < 1",
    "===0.1.0",
    "<=0.1.0-post1",
    "==0.1.0+local",
    "",
]


def _refusal(*requires):
    from kernelbay.registry._discovery import _core_requirement

    return _core_requirement("kb-p", "1.0", list(requires))


def test_core_version_check_agrees_with_packaging_requirement_on_every_spec_form():
    """The verdict for every spec form and spelling is packaging's, judging the installed core with prereleases."""
    from packaging.requirements import Requirement

    from kernelbay import __version__

    for spec in SPECS:
        for text in (
            f"kernelbay{spec}",
            f"KernelBay{spec}",
            f"kernelbay[x] ({spec})" if spec else "kernelbay[x]",
            f"kernelbay {spec} ; python_version >= '3'",
        ):
            required, refusal = _refusal(text)
            expected = Requirement(text).specifier
            assert (refusal is None) == expected.contains(__version__, prereleases=True), text
            assert required == (str(expected) or None), text


def test_core_requirement_markers_extras_and_other_names():
    """A requirement applies only where its marker holds; extras-only and other projects' requirements do not count."""
    assert _refusal("kernelbay<0.1; python_version < '3'") == (None, None)
    assert _refusal("kernelbay<0.1; extra == 'gpu'") == (None, None)
    assert _refusal("kernelbay-engine<0.1", "kernelbay_extras<0.1", "torch") == (None, None)
    required, refusal = _refusal("kernelbay>=0.1", "kernelbay<0.1; python_version >= '3'")
    assert required == "<0.1,>=0.1" and "requires kernelbay<0.1,>=0.1, but kernelbay 0.1.0 is installed" in refusal


def test_prerelease_core_satisfies_ranges_as_pep_440_orders_it(monkeypatch):
    """A dev/rc build of the core satisfies `>=0.1` but not `<0.2` when it is 0.2.0rc1 (PEP 440 ordering)."""
    import kernelbay.registry._discovery as discovery

    monkeypatch.setattr(discovery, "__version__", "0.2.0rc1")
    assert _refusal("kernelbay>=0.1")[1] is None
    assert "kernelbay 0.2.0rc1 is installed" in _refusal("kernelbay>=0.1,<0.2")[1]
    assert _refusal("kernelbay>=0.2.0rc1,<0.3")[1] is None


def test_unreadable_core_requirement_refuses_the_plugin():
    """A requirement on kernelbay packaging cannot read refuses the plugin, saying so (not silently accepted)."""
    for text in ("kernelbay>=0.1 foo", "kernelbay (>=0.1", "kernelbay>=0.1; python_version >>> '3'"):
        required, refusal = _refusal(text)
        assert required and "declares a requirement on kernelbay that packaging cannot read" in refusal, text


def test_allow_list_of_only_separators_is_treated_as_unset_with_a_finding(fixture_site):
    """KERNELBAY_PLUGINS=",,," names nothing: no filter (it used to disable every plugin) and a finding says so."""
    found = _discover(fixture_site, KERNELBAY_PLUGINS=",,,", KERNELBAY_DISABLE_PLUGINS=" , ")
    assert "kb-fixture-good" in {e.distribution for e in found.entries}
    findings = found.findings()
    assert any("KERNELBAY_PLUGINS=',,,' names no distribution; treated as unset" in f for f in findings)
    assert any("KERNELBAY_DISABLE_PLUGINS=' , ' names no distribution" in f for f in findings)


def test_malformed_prefer_entry_is_a_finding_and_skipped_with_a_warning(fixture_site, capsys):
    """A malformed KERNELBAY_PREFER entry is a finding; parsing skips it, keeps the rest and warns on stderr."""
    from kernelbay.registry._records import Preferences

    found = _discover(fixture_site, KERNELBAY_PREFER="garbage,LlamaForCausalLM=kernelbay-llama")
    assert any("KERNELBAY_PREFER entry 'garbage' is not of the form Name=distribution" in f for f in found.findings())
    prefs = Preferences.parse("garbage,LlamaForCausalLM=kernelbay-llama")
    assert prefs.by_name == {"LlamaForCausalLM": "kernelbay-llama"}
    assert "KERNELBAY_PREFER entry 'garbage' is not of the form Name=distribution" in capsys.readouterr().err
