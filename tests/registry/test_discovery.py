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
    assert "'no-such-plugin' in KERNELBAY_PLUGINS/KERNELBAY_DISABLE_PLUGINS is not an installed plugin distribution" \
        in found.findings()


def test_deny_list_removes_a_distribution(fixture_site):
    """KERNELBAY_DISABLE_PLUGINS removes exactly the named distributions."""
    found = _discover(fixture_site, KERNELBAY_DISABLE_PLUGINS="kb-fixture-good,kb-fixture-typo")
    used = {e.distribution for e in found.entries}
    assert "kb-fixture-good" not in used and "kb-fixture-other" in used
    assert found.unknown_filter_names == ["kb-fixture-typo"]


SPECS = [">=0.1,<0.2", "<0.1", "==0.1.0", "==0.1", "!=0.1.0", "~=0.1", ">0.1", "<=0.1", "==0.1.*", ">=0.1.0rc1",
         "<0.1.dev0", ">=1", ">0.0.9", "<0.1.1", ">= 0.1 , < 1", "===0.1.0", "<=0.1.0-post1"]


def test_core_version_check_agrees_with_packaging_on_every_spec_form():
    """The import-free fast path and packaging's SpecifierSet give the same verdict for every spec form."""
    from packaging.specifiers import SpecifierSet

    from kernelbay import __version__
    from kernelbay.registry._discovery import _satisfies

    for spec in SPECS:
        assert _satisfies(spec) == SpecifierSet(spec).contains(__version__, prereleases=True), spec
