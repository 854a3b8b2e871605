"""The conformance kit: kernelbay's own backends pass it, and it catches backends that are wrong or dishonest."""

from __future__ import annotations

import json

import pytest

from kernelbay import register_attention_backend
from kernelbay.errors import UnknownNameError
from kernelbay.testing import ALL_SPECS, MLA_SPECS, SPECS, check_backend, make_data, reference_output, run_backend
from kernelbay.testing.conformance import compare

from . import _fakes

FLEX_EAGER = {"compile": False}  # FLEX's compiled kernel costs tens of seconds per shape bucket on CPU


def statuses(report) -> dict[str, str]:
    return {r.spec: r.status for r in report.results}


def test_vanilla_passes_every_spec():
    """[VANILLA] claims every spec and matches the dense reference on each."""
    report = check_backend("VANILLA")
    assert report.passed and set(statuses(report).values()) == {"pass"}, report.render()
    assert [r.spec for r in report.results] == list(ALL_SPECS)


def test_sdpa_passes_and_refuses_only_softcap_and_mla():
    """[SDPA] passes what it claims; soft-cap and MLA are honest refusals, not failures."""
    report = check_backend("SDPA")
    refused = {name for name, status in statuses(report).items() if status != "pass"}
    assert report.passed and refused == {"softcap", *MLA_SPECS}, report.render()
    assert statuses(report)["softcap"] == "not-claimed"


def test_flex_eager_passes_every_claimed_spec():
    """[FLEX] (eager kernel) passes everything but MLA and attention sinks, which it refuses honestly."""
    report = check_backend("FLEX", options=FLEX_EAGER)
    refused = {name for name, status in statuses(report).items() if status != "pass"}
    assert report.passed and refused == {*MLA_SPECS, "sinks", "sinks_decode", "sinks_sliding"}, report.render()


@pytest.mark.slow
def test_compiled_flex_passes_a_prefill_and_a_decode_step():
    """[FLEX] with its default compiled kernel passes the packed path and the decode path."""
    report = check_backend("FLEX", ["mixed_prefill_decode", "small_decode"])
    assert report.passed and set(statuses(report).values()) == {"pass"}, report.render()


def test_reference_round_trips_fp8_with_the_layer_scales():
    """With k/v scales the reference stores values divided and reads them multiplied, as VANILLA does; without the
    scales large values clamp at the e4m3 range, so the scales really matter."""
    spec = SPECS["fp8_kv"]
    data = make_data(spec)
    data.keys[:] = [k * 1000 for k in data.keys]
    data.values[:] = [v * 1000 for v in data.values]
    data.queries.mul_(1e-3)
    want = reference_output(spec, data, kv_scales=(8.0, 8.0))
    assert compare(spec, run_backend("VANILLA", spec, data=data, kv_scales=(8.0, 8.0)), want).status == "pass"
    assert (reference_output(spec, data) - want).abs().max() > 10


def test_the_reference_needs_no_backend():
    """The reference and the specs import no backend plugin: they are the contract, not VANILLA's reading of it."""
    import subprocess
    import sys

    code = (
        "import sys; from kernelbay.testing import SPECS, make_data, reference_output; "
        "reference_output(SPECS['gqa'], make_data(SPECS['gqa'])); "
        "assert not [m for m in sys.modules if m.startswith('kernelbay_')], sorted(sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_claimed_but_ignored_softcap_fails():
    """A backend that claims soft-capping and ignores it FAILS the softcap spec, with its error and tolerance."""
    report = check_backend(_fakes.IgnoresSoftcap, ["softcap", "small_decode"])
    result = {r.spec: r for r in report.results}
    assert not report.passed and statuses(report) == {"softcap": "fail", "small_decode": "pass"}
    assert result["softcap"].max_error > result["softcap"].tolerance
    assert result["softcap"].detail.startswith("max err ") and " > " in result["softcap"].detail


def test_an_off_by_one_window_fails_only_the_window_specs():
    """A sliding window that sees one key too many fails exactly the sliding-window specs."""
    failed = {r.spec for r in check_backend(_fakes.WindowOffByOne).results if r.status == "fail"}
    assert failed == {"sliding_window", "runs_sliding_decode", "sinks_sliding"}


def test_an_exception_is_a_failure_with_its_message():
    """A backend that raises fails the spec with the exception's type and message; other specs still run."""
    report = check_backend(_fakes.CrashesOnDecode, ["small_decode", "small_prefill"])
    result = {r.spec: r for r in report.results}
    assert result["small_decode"].status == "fail" and result["small_prefill"].status == "pass"
    assert result["small_decode"].detail == "raised RuntimeError: decode kernel not implemented"


def test_a_refused_geometry_that_still_builds_fails():
    """Refusing soft-capping but building a soft-capped layer anyway (no ValueError) is a failure."""
    result = check_backend(_fakes.BuildsRefusedGeometry, ["softcap"]).results[0]
    assert result.status == "fail"
    assert "a layer with that geometry was built (construction must raise ValueError)" in result.detail


def test_a_refusal_the_selector_does_not_see_fails(fresh_registry):
    """A backend that refuses soft-capping when asked, but is picked by the selector (requested or automatic),
    fails the softcap spec: refusals are checked through `select_attention_backend` too."""
    register_attention_backend("FAKE_TWO_FACED", target=_fakes.TwoFaced)
    result = check_backend("FAKE_TWO_FACED", ["softcap"]).results[0]
    assert result.status == "fail"
    assert "select_attention_backend(requested='FAKE_TWO_FACED') accepted it" in result.detail
    assert "automatic selection picked it" in result.detail


def test_an_unregistered_class_says_the_selector_was_not_asked():
    """A class passed directly (not installed under its name) cannot be checked through the selector: its refusals
    say so instead of passing silently."""
    result = check_backend(_fakes.TwoFaced, ["softcap"]).results[0]
    assert result.status == "not-claimed"
    assert result.detail == (
        "not claimed: logit_softcap: attention logit soft-capping is not supported "
        "(selector not checked: FAKE_TWO_FACED is not installed as this class)"
    )


def test_an_unavailable_backend_is_skipped_not_failed():
    """is_available() false: every spec is skipped with the reason, and the report still passes."""
    report = check_backend(_fakes.Unavailable)
    assert report.passed and set(statuses(report).values()) == {"skipped"}
    assert {r.detail for r in report.results} == {"backend unavailable: libfake.so not found"}


def test_claiming_no_spec_of_the_kit_fails_pointing_at_the_missing_declarations():
    """A backend that declares no head size claims no spec at all: it would never be chosen, so the report fails,
    and its last line names the declaration to add and where the guide lists them."""
    report = check_backend(_fakes.ClaimsNothing, ["small_decode", "gqa"])
    assert not report.passed
    assert report.summary() == "FAKE_CLAIMS_NOTHING: CLAIMS NO SPEC: 0 passed, 0 failed, 2 not claimed, 0 skipped"
    assert report.render().splitlines()[-1] == (
        "FAKE_CLAIMS_NOTHING can serve nothing: head_sizes refuse every common geometry (what a backend does not "
        "declare, it does not get: the defaults are none); declare them on the class (see 'Capability declarations' "
        "in docs/guides/attention-backend-plugin.md)"
    )
    assert report.to_dict()["unserved"] == report.unserved and report.to_dict()["passed"] is False


def test_claiming_none_of_a_chosen_subset_is_not_a_failure():
    """SDPA checked only on a spec it refuses (soft-capping) claims none of *these* specs, but others: it passes."""
    report = check_backend("SDPA", ["softcap"])
    assert report.passed and report.unserved is None
    assert report.summary() == "SDPA: claims none of these specs: 0 passed, 0 failed, 1 not claimed, 0 skipped"


def test_report_to_dict_is_json():
    """The report serialises to JSON with the verdict, the counts and one record per spec."""
    out = json.loads(json.dumps(check_backend("SDPA", ["small_decode", "softcap"]).to_dict()))
    assert out["backend"] == "SDPA" and out["passed"] is True
    assert out["counts"] == {"pass": 1, "fail": 0, "not-claimed": 1, "skipped": 0}
    assert [r["status"] for r in out["results"]] == ["pass", "not-claimed"]


def test_unknown_names_list_the_known_ones():
    """An unknown backend or spec name is UnknownNameError naming the known ones and close matches."""
    with pytest.raises(UnknownNameError, match=r"Known attention backends: .*SDPA.*Did you mean: SDPA"):
        check_backend("SPDA")
    with pytest.raises(UnknownNameError, match=r"Unknown batch spec: 'softcapp'.*Did you mean: softcap"):
        check_backend("VANILLA", ["softcapp"])
