"""Every backend against VANILLA over the named batch specs."""

from __future__ import annotations

import pytest

from kernelbay import resolve
from tests.attention._harness import SPECS, assert_close, make_data, run_backend

# FLEX in eager mode costs ~1 s a spec on this CPU, so it runs a subset here; its compiled kernel
# is checked in test_flex_compiled.py.
FLEX_SPECS = (
    "small_prefill",
    "mixed_prefill_decode",
    "gqa",
    "sliding_window",
    "chunked",
    "softcap",
    "fp8_kv",
    "hnd",
    "block_64",
    "small_decode",
    "mqa",
    "bf16",
    "fp16",
    "head_80",
    "head_128",
    "head_256",
    "encoder",
    "runs_sliding_decode",
)
SWEEPS = {"SDPA": tuple(name for name in SPECS if name != "softcap"), "FLEX": FLEX_SPECS}


def _cases():
    """Every (backend, spec) the backend claims; refused ones belong to test_capability_honesty."""
    for backend, names in SWEEPS.items():
        cls = resolve("attention_backend", backend)
        for name in names:
            if not cls.capability_failures(SPECS[name].requirements()):
                yield pytest.param(
                    backend, name, {"compile": False} if backend == "FLEX" else None, id=f"{backend}-{name}"
                )


@pytest.fixture(scope="module")
def reference_outputs():
    return {name: run_backend("VANILLA", spec) for name, spec in SPECS.items()}


@pytest.mark.parametrize("backend, spec_name, options", list(_cases()))
def test_backend_matches_vanilla(backend, spec_name, options, reference_outputs):
    """The backend's output equals VANILLA's on this batch spec."""
    spec = SPECS[spec_name]
    got = run_backend(backend, spec, options=options)
    assert_close(backend, spec, got, reference_outputs[spec_name])


def test_sdpa_covers_every_spec_but_softcap():
    """SDPA claims every spec here except logit soft-capping, so the sweep above really exercises it."""
    cls = resolve("attention_backend", "SDPA")
    refused = [n for n, s in SPECS.items() if cls.capability_failures(s.requirements())]
    assert refused == ["softcap"]


def test_sdpa_reads_one_run_requests_without_copying(monkeypatch):
    """Long one-run requests in an NHD cache take SDPA's zero-copy path, and still match VANILLA."""
    import kernelbay_torch.sdpa as sdpa

    monkeypatch.setattr(sdpa.SdpaBackend, "_decode_batched", lambda *a: pytest.fail("[SDPA] gathered a copy"))
    monkeypatch.setattr(sdpa.SdpaBackend, "read_kv", lambda *a: pytest.fail("[SDPA] copied keys"))
    for name in ("runs_decode", "runs_uniform_decode", "runs_sliding_decode", "runs_chunked_decode"):
        assert_close("SDPA", SPECS[name], run_backend("SDPA", SPECS[name]), run_backend("VANILLA", SPECS[name]))


@pytest.mark.parametrize("spec_name", ["fp8_kv", "runs_decode", "small_decode"])
def test_fp8_per_tensor_scales(spec_name):
    """With k/v scales, fp8 values are stored divided and read multiplied: large values survive the
    e4m3 range (max 448) and every backend still agrees with VANILLA."""
    spec = SPECS[spec_name].but(kv_cache_dtype="fp8_e4m3")
    data = make_data(spec)
    data.keys[:] = [k * 1000 for k in data.keys]
    data.values[:] = [v * 1000 for v in data.values]
    data.queries.mul_(1e-3)
    want = run_backend("VANILLA", spec, data=data, kv_scales=(8.0, 8.0))
    unscaled = run_backend("VANILLA", spec, data=data)
    assert (want - unscaled).abs().max() > 10, "[VANILLA] scales made no difference: values were not clamped"
    assert_close("SDPA", spec, run_backend("SDPA", spec, data=data, kv_scales=(8.0, 8.0)), want)
