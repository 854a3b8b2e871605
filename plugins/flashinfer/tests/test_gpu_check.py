"""plugins/flashinfer/gpu_check.py stays runnable without a GPU: its harness checks SDPA against VANILLA on CPU,
and on a machine where FlashInfer cannot run it says why and exits 2."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from kernelbay import resolve
from tests._paths import REPO


@pytest.fixture
def gpu_check(make_registry, monkeypatch):
    make_registry(with_acme=False)
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "plugins/flashinfer/gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_harness_runs_on_cpu(gpu_check, capsys):
    """`--device cpu` runs the batch specs through SDPA and VANILLA and reports every one matching."""
    assert gpu_check.main(["--device", "cpu", "--specs", "small_decode,mixed_prefill_decode,hnd", "--no-timing"]) == 0
    out = capsys.readouterr().out
    assert "3/3 specs match VANILLA" in out and out.count(" yes ") == 3


def test_without_flashinfer_it_says_why(gpu_check, capsys, monkeypatch):
    """On a machine where FlashInfer cannot run, the check prints the availability reason and exits 2."""
    from kernelbay_flashinfer import availability

    monkeypatch.setattr(availability, "probe", lambda: availability.CudaEnvironment(False, torch_version="x"))
    assert gpu_check.main(["--specs", "small_decode"]) == 2
    assert capsys.readouterr().out.startswith("FlashInfer cannot run here: flashinfer is not installed")


def test_unknown_spec_is_an_error(gpu_check):
    """A misspelt spec name is refused, listing the known ones."""
    with pytest.raises(SystemExit):
        gpu_check.main(["--specs", "smal_decode"])


def test_every_spec_is_claimed_by_its_flashinfer_backend(gpu_check):
    """Each GPU spec is one FLASHINFER / FLASHINFER_MLA declares it can run (else the check would only skip it)."""
    for spec in gpu_check.SPECS.values():
        cls = resolve("attention_backend", spec.backend)
        caps = [
            f for f in cls.capability_failures(gpu_check.requirements(spec, "cuda")) if not f.startswith("available")
        ]
        assert caps == [], f"[{spec.backend}] {spec.name}: {caps}"
