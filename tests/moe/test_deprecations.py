"""The MoE expert-format rename keeps the old spellings working for one minor release (docs/contract.md, "The
rule"): each old name still does what it did, with a DeprecationWarning naming its replacement; every name listed
in docs/contract-api/deprecations.txt is exercised here."""

from __future__ import annotations

import pytest

import kernelbay.moe
from kernelbay.moe import EXPERT_FORMATS, MoEBackend, MoEGeometry, MoERequirements
from kernelbay.testing.moe import MOE_SPECS, MoESpec

from . import _fakes

RENAMED = r"goes in kernelbay 0\.2: use"


def test_weight_formats_constant_is_expert_formats():
    with pytest.warns(DeprecationWarning, match=rf"kernelbay\.moe\.WEIGHT_FORMATS is deprecated and {RENAMED}"):
        assert kernelbay.moe.WEIGHT_FORMATS == EXPERT_FORMATS
    with pytest.raises(AttributeError, match="has no attribute 'NOPE'"):
        kernelbay.moe.NOPE  # noqa: B018 -- the module __getattr__ still refuses unknown names


@pytest.mark.parametrize(
    "make",
    [
        lambda **kw: MoEGeometry(8, 2, 32, 24, block_size=(16, 16), **kw),
        lambda **kw: MoERequirements(dtype="float32", **kw),
        lambda **kw: MoESpec("old", tokens=2, **kw),
    ],
    ids=["MoEGeometry", "MoERequirements", "MoESpec"],
)
def test_old_field_keyword_and_attribute_still_work(make):
    """`X(weight_format=...)` builds what `X(expert_format=...)` builds; `x.weight_format` reads expert_format."""
    keyword = rf"\(weight_format=\.\.\.\) is deprecated and {RENAMED} expert_format="
    with pytest.warns(DeprecationWarning, match=keyword):
        old = make(weight_format="fp8_block")
    assert old == make(expert_format="fp8_block") and old.expert_format == "fp8_block"
    with pytest.warns(DeprecationWarning, match=rf"\.weight_format is deprecated and {RENAMED} .*\.expert_format"):
        assert old.weight_format == "fp8_block"
    with pytest.raises(TypeError, match="got both weight_format= and its replacement expert_format="):
        make(weight_format="fp8_block", expert_format="fp8_block")


def test_kit_specs_spell_the_new_name():
    assert {spec.expert_format for spec in MOE_SPECS} == set(EXPERT_FORMATS)


def test_a_backend_declaring_weight_formats_keeps_its_capability():
    """A vendor kernel built against 0.1's `weight_formats` declaration is read as declaring `expert_formats`:
    it stays capable of fp8_block experts and its class is named in the warning."""
    named = r"OldVendor declares weight_formats: the declaration .* expert_formats"
    with pytest.warns(DeprecationWarning, match=named):
        old = type("OldVendor", (_fakes.TorchMoEBackend,), {"name": "OLD", "weight_formats": {"dense", "fp8_block"}})
    assert old.expert_formats == {"dense", "fp8_block"}
    needs = MoERequirements(dtype="float32", expert_format="fp8_block", platform="cpu")
    assert not [line for line in old.capability_failures(needs) if line.startswith("expert_format")]
    plain = type("NewVendor", (_fakes.TorchMoEBackend,), {"name": "NEW", "expert_formats": {"dense"}})
    assert any(line.startswith("expert_format") for line in plain.capability_failures(needs))


def test_base_declaration_is_expert_formats():
    assert MoEBackend.expert_formats == frozenset({"dense"}) and "weight_formats" not in vars(MoEBackend)
