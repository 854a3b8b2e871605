"""Capability honesty: every claimed feature is exercised on the backend; every refused one is never selected."""

from __future__ import annotations

import pytest

from kernelbay import resolve
from kernelbay.attention import BackendNotCapable, select_attention_backend
from kernelbay.registry import names
from tests.attention._fakes import FakePlatform
from tests.attention._harness import MLA_SPECS, SPECS

from .test_backends_vs_vanilla import SWEEPS

# feature -> the named spec that exercises it
FEATURES = {
    "sliding_window": "sliding_window",
    "chunked_attention": "chunked",
    "logit_softcap": "softcap",
    "fp8_kv": "fp8_kv",
    "bfloat16": "bf16",
    "float16": "fp16",
    "gqa": "gqa",
    "mqa": "mqa",
    "head_80": "head_80",
    "head_128": "head_128",
    "head_256": "head_256",
    "hnd_layout": "hnd",
    "block_64": "block_64",
    "encoder": "encoder",
    "decode": "small_decode",
    "prefill": "small_prefill",
    "mixed": "mixed_prefill_decode",
    "mla": "mla",
}
ALL_SPECS = {**SPECS, **MLA_SPECS}
# Which specs each backend really runs: VANILLA against the dense loop, the others against VANILLA.
RUNS = {"VANILLA": tuple(ALL_SPECS), **SWEEPS}


def _cases():
    for backend in ("VANILLA", "SDPA", "FLEX"):
        for feature, spec in FEATURES.items():
            yield pytest.param(backend, feature, spec, id=f"{backend}-{feature}")


def test_every_installed_first_party_backend_is_covered():
    """The honesty table covers every backend kernelbay-torch installs."""
    assert {"VANILLA", "SDPA", "FLEX"} <= set(names("attention_backend")) and set(RUNS) == {"VANILLA", "SDPA", "FLEX"}


@pytest.mark.parametrize("backend, feature, spec_name", list(_cases()))
def test_claimed_is_tested_and_refused_is_never_selected(backend, feature, spec_name, fresh_registry):
    """Claimed: the feature's spec is in the backend's correctness sweep. Refused: neither automatic selection
    (even with the backend first in priority) nor an explicit request picks it."""
    req = ALL_SPECS[spec_name].requirements()
    cls = resolve("attention_backend", backend)
    if not cls.capability_failures(req):
        assert spec_name in RUNS[backend], f"[{backend}] claims {feature} but no test runs {spec_name} on it"
        return
    result = select_attention_backend(req, platform=FakePlatform(backend, "VANILLA"))
    assert result.backend_name != backend, f"[{backend}] refuses {feature} but was selected"
    with pytest.raises(BackendNotCapable, match=f"requested attention backend {backend} cannot run"):
        select_attention_backend(req, requested=backend, platform=FakePlatform(backend))


def test_refusals_are_the_documented_ones():
    """SDPA refuses soft-cap and MLA; FLEX refuses MLA; VANILLA refuses nothing in the table."""
    refused = {
        b: sorted(
            f
            for f, s in FEATURES.items()
            if resolve("attention_backend", b).capability_failures(ALL_SPECS[s].requirements())
        )
        for b in RUNS
    }
    assert refused == {"VANILLA": [], "SDPA": ["logit_softcap", "mla"], "FLEX": ["mla"]}
