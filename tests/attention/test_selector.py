"""The selector: priority order, a reason for every candidate, no silent fallback, caching, layer groups."""

from __future__ import annotations

import json

import pytest

from kernelbay.attention import (
    AttentionRequirements,
    BackendNotCapable,
    NoCapableBackend,
    select_attention_backend,
    select_for_layer_groups,
)
from kernelbay.errors import UnknownNameError
from kernelbay.registry import register_attention_backend

from ._fakes import BlockSparseOnly, FakePlatform, UnavailableBackend

FULL = AttentionRequirements(head_size=64, dtype="float32")
SOFTCAP = AttentionRequirements(head_size=64, dtype="float32", logit_softcap=True)


def by_name(result):
    return {c.name: c for c in result.candidates}


def test_first_capable_in_platform_priority_wins(fresh_registry):
    """With the platform listing VANILLA first, VANILLA wins and the others say why not."""
    result = select_attention_backend(FULL, platform=FakePlatform("VANILLA", "SDPA"))
    assert result.backend_name == "VANILLA" and result.platform == "fakeplat"
    reports = by_name(result)
    assert reports["VANILLA"].chosen and reports["VANILLA"].reason == "first capable candidate in priority order"
    assert reports["SDPA"].reason == "capable, but VANILLA comes first"
    assert reports["FLEX"].source == "installed" and reports["SDPA"].source == "platform priority"


def test_every_candidate_reports_its_failed_capabilities(fresh_registry):
    """SDPA cannot soft-cap: it is reported with that capability, and the next capable backend wins."""
    result = select_attention_backend(SOFTCAP, platform=FakePlatform("SDPA", "VANILLA"))
    assert result.backend_name == "VANILLA"
    sdpa = by_name(result)["SDPA"]
    assert not sdpa.chosen and sdpa.reason == "not capable"
    assert sdpa.failures == ("logit_softcap: attention logit soft-capping is not supported",)


def test_priority_names_that_are_not_installed_are_reported(fresh_registry):
    """A platform may list a backend nobody installed; it shows up as 'not installed', selection goes on."""
    result = select_attention_backend(FULL, platform=FakePlatform("FLASHINFER", "SDPA"))
    assert result.backend_name == "SDPA"
    assert by_name(result)["FLASHINFER"].failures == ("not installed (no plugin provides it)",)


def test_unknown_requested_backend_lists_known_names_and_close_matches(fresh_registry):
    """A typo in the requested name is an error naming every known backend and the close match."""
    with pytest.raises(UnknownNameError) as err:
        select_attention_backend(FULL, requested="SPDA", platform=FakePlatform("SDPA"))
    assert str(err.value) == (
        "Unknown attention backend: 'SPDA'. Known attention backends: CPU_PAGED, FLEX, SDPA, VANILLA. "
        "Did you mean: SDPA? (requested via argument or KERNELBAY_ATTENTION_BACKEND)"
    )


def test_requested_backend_from_environment(fresh_registry, monkeypatch):
    """KERNELBAY_ATTENTION_BACKEND requests a backend like the argument does."""
    monkeypatch.setenv("KERNELBAY_ATTENTION_BACKEND", "FLEX")
    result = select_attention_backend(FULL, platform=FakePlatform("SDPA", "VANILLA"))
    assert result.backend_name == "FLEX" and result.requested == "FLEX"
    assert by_name(result)["SDPA"].reason == "capable, but FLEX was requested"
    monkeypatch.setenv("KERNELBAY_ATTENTION_BACKEND", "NOPE")
    with pytest.raises(UnknownNameError, match="Unknown attention backend: 'NOPE'"):
        select_attention_backend(FULL, platform=FakePlatform("SDPA"))


def test_requested_but_incapable_is_an_error_listing_failures(fresh_registry):
    """Requesting SDPA for soft-capped layers fails with the capability; nothing falls back."""
    with pytest.raises(BackendNotCapable) as err:
        select_attention_backend(SOFTCAP, requested="SDPA", platform=FakePlatform("VANILLA"))
    assert str(err.value) == (
        "requested attention backend SDPA cannot run layers (full_attention, head_size=64, float32, kv=auto, "
        "logit_softcap); failed capabilities:\n  - logit_softcap: attention logit soft-capping is not supported"
    )


def test_broken_backend_is_a_candidate_with_its_import_error(fresh_registry):
    """A backend whose module fails to import is reported, and selection of the others still works."""
    register_attention_backend("BROKEN", target="kernelbay_no_such_module_xyz:Backend")
    result = select_attention_backend(FULL, platform=FakePlatform("BROKEN", "SDPA"))
    assert result.backend_name == "SDPA"
    (failure,) = by_name(result)["BROKEN"].failures
    assert failure.startswith("failed to import: ") and "kernelbay_no_such_module_xyz" in failure


def test_unavailable_backend_reports_its_reason(fresh_registry):
    """is_available() = False is a failed capability with the backend's own reason."""
    register_attention_backend("FAKE_GONE", target=UnavailableBackend)
    result = select_attention_backend(FULL, platform=FakePlatform("FAKE_GONE", "SDPA"))
    assert by_name(result)["FAKE_GONE"].failures == ("available: libfake.so is not installed",)


def test_no_capable_backend_lists_every_candidate(fresh_registry):
    """Block-sparse attention is supported by nobody: the error names each candidate's failure."""
    req = AttentionRequirements(head_size=64, sparse_mode="blocksparse")
    with pytest.raises(NoCapableBackend) as err:
        select_attention_backend(req, platform=FakePlatform("SDPA"))
    text = str(err.value)
    assert text.startswith(
        "no installed attention backend can run layers (full_attention, head_size=64, bfloat16, kv=auto) on fakeplat"
    )
    for name, modes in (("SDPA", "none"), ("VANILLA", "dsa, none"), ("FLEX", "none")):
        assert f"  - {name}: sparse_mode: blocksparse is not supported (supported: {modes})" in text


def test_no_capable_backend_carries_every_groups_reports(fresh_registry):
    """The error keeps each group's outcome (what explain shows): the served group's selection, and for the
    group nobody can run, every candidate's failures."""
    sparse = AttentionRequirements(head_size=64, sparse_mode="blocksparse")
    with pytest.raises(NoCapableBackend, match="layer group 'sparse': no installed") as err:
        select_for_layer_groups({"full": FULL, "sparse": sparse}, platform=FakePlatform("SDPA"))
    (full, served, _), (sparse_name, unserved, reports) = err.value.groups
    assert (full, served.backend_name, sparse_name, unserved) == ("full", "SDPA", "sparse", None)
    assert {c.name for c in reports} == {"SDPA", "VANILLA", "CPU_PAGED", "FLEX"}
    assert all(c.reason == "not capable" and not c.chosen and c.failures for c in reports)


def test_selection_is_cached_and_serialisable(fresh_registry):
    """Same requirements, same answer object; to_dict() is plain JSON with every candidate."""
    plat = FakePlatform("SDPA", "VANILLA")
    first = select_attention_backend(SOFTCAP, platform=plat)
    assert select_attention_backend(SOFTCAP, platform=plat) is first
    data = json.loads(json.dumps(first.to_dict()))
    assert data["backend"] == "VANILLA"
    assert [c["name"] for c in data["candidates"]] == ["SDPA", "VANILLA", "CPU_PAGED", "FLEX"]
    assert data["candidates"][0]["failures"] == ["logit_softcap: attention logit soft-capping is not supported"]
    assert data["requirements"]["logit_softcap"] is True and data["platform"] == "fakeplat"


def test_default_platform_is_detected(fresh_registry):
    """Without a platform argument the current platform (cpu here) orders the candidates."""
    result = select_attention_backend(FULL)
    assert result.platform == "cpu" and result.requirements.platform == "cpu"
    from kernelbay.platforms.cpu import CpuPlatform

    assert result.backend_name == CpuPlatform().backend_priority()[0]


def test_layer_groups_prefer_one_backend_for_all(fresh_registry):
    """Full + soft-capped groups: SDPA only fits one, so the first backend fitting both serves both."""
    sel = select_for_layer_groups({"full": FULL, "softcap": SOFTCAP}, platform=FakePlatform("SDPA", "VANILLA"))
    assert sel.shared and {r.backend_name for _, r in sel.groups} == {"VANILLA"}
    sdpa = by_name(sel.backend_for("full"))["SDPA"]
    assert sdpa.reason == "capable here, but not for layer group(s) softcap; VANILLA serves every group"
    assert by_name(sel.backend_for("full"))["VANILLA"].reason == "first candidate capable for every layer group"
    with pytest.raises(KeyError, match="no layer group 'x'; groups: full, softcap"):
        sel.backend_for("x")


def test_layer_groups_split_when_no_backend_fits_all(fresh_registry):
    """Block-sparse full layers and sliding layers have no common backend: each group gets its own."""
    register_attention_backend("FAKE_BLOCKSPARSE", target=BlockSparseOnly)
    sparse = AttentionRequirements(head_size=64, sparse_mode="blocksparse")
    sliding = AttentionRequirements(head_size=64, attn_type="sliding_attention")
    sel = select_for_layer_groups({"sparse": sparse, "sliding": sliding}, platform=FakePlatform("SDPA"))
    assert not sel.shared
    assert sel.backend_for("sparse").backend_name == "FAKE_BLOCKSPARSE"
    assert sel.backend_for("sliding").backend_name == "SDPA"
    assert all(json.loads(json.dumps(r.to_dict()))["backend"] == r.backend_name for _, r in sel.groups)


def test_requested_backend_must_fit_every_group(fresh_registry):
    """A requested backend that fails one group names that group and the capability."""
    with pytest.raises(BackendNotCapable, match="layer group 'softcap': requested attention backend SDPA"):
        select_for_layer_groups({"full": FULL, "softcap": SOFTCAP}, requested="SDPA", platform=FakePlatform("SDPA"))
