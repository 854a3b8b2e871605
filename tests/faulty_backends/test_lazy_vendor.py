"""A vendor backend written from the docs that declares neither head sizes nor block sizes (kb-fixture-lazyvendor,
installed) serves nothing: check-backend fails pointing at the missing declarations, doctor warns, and explain on
the vendor's platform says first that its preferred backend cannot serve the model."""

from __future__ import annotations

from tests._paths import REPO

DEMO = str(REPO / "plugins/engine/kernelbay_engine/demo")
HINT = "LAZY_ATTN can serve nothing: head_sizes, block_sizes refuse every common geometry"


def test_check_backend_fails_a_backend_that_claims_no_spec(kernelbay_cli):
    """Every spec refused: not "0 failed" and exit 0, but CLAIMS NO SPEC, exit 1, and what to declare."""
    done = kernelbay_cli("check-backend", "LAZY_ATTN")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-2].startswith("LAZY_ATTN: CLAIMS NO SPEC: 0 passed, 0 failed, "), lines[-2]
    assert lines[-1].startswith(HINT) and "docs/guides/attention-backend-plugin.md" in lines[-1], lines[-1]


def test_doctor_warns_about_an_installed_backend_that_serves_nothing(kernelbay_cli):
    """doctor names the distribution, the backend and the missing declarations."""
    done = kernelbay_cli("doctor", KERNELBAY_PLUGINS="kb-fixture-lazyvendor")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"kb-fixture-lazyvendor: warning: {HINT}" in done.stdout, done.stdout


def test_doctor_does_not_warn_about_capable_backends(kernelbay_cli):
    """The faulty fixture backends declare what VANILLA does: no such warning for them."""
    done = kernelbay_cli("doctor", KERNELBAY_PLUGINS="kb-fixture-faulty")
    assert "can serve nothing" not in done.stdout, done.stdout


def test_explain_on_the_vendor_platform_says_first_that_its_backend_cannot_serve(kernelbay_cli):
    """On the vendor's own platform (its device visible) the first line says LAZY_ATTN cannot serve the model, why,
    and which backend serves it instead."""
    done = kernelbay_cli("explain", DEMO, LAZYVENDOR_VISIBLE_DEVICES="0")
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    note = "note         lazyvendor's preferred attention backend LAZY_ATTN cannot serve this model ("
    assert first.startswith(note), first
    assert "head_size: 64 is not supported (supported: none declared)" in first and first.endswith(
        "; SDPA serves it instead"
    ), first
