"""Why FlashInfer is unavailable, and what the real selector does when kernelbay-flashinfer is installed
(through its real distribution) but cannot run here."""

from __future__ import annotations

import importlib.util

import pytest

from kernelbay.attention import AttentionRequirements, BackendNotCapable, select_attention_backend

BF16_128 = AttentionRequirements(head_size=128, dtype="bfloat16")


@pytest.fixture(scope="module")
def avail(sites):
    from kernelbay_flashinfer import availability

    return availability


def test_not_installed_comes_first(avail):
    """Without flashinfer the reason is the missing package and how to install it, whatever the GPU."""
    ok, reason = avail.availability(avail.CudaEnvironment(False, torch_version="2.13.0+cpu"))
    assert not ok and reason.startswith("flashinfer is not installed: pip install flashinfer-python")


def test_no_cuda_device(avail):
    """Installed but without a GPU: the reason names torch's view of the machine."""
    ok, reason = avail.availability(avail.CudaEnvironment(True, torch_version="2.13.0+cpu"))
    assert not ok and reason == "no CUDA device: torch 2.13.0+cpu sees no GPU (FlashInfer runs on NVIDIA GPUs only)"


def test_compute_capability_too_low(avail):
    """A pre-Ampere GPU is refused with its capability, its name and the minimum."""
    env = avail.CudaEnvironment(True, 1, (7, 5), "Tesla T4", "2.13.0")
    ok, reason = avail.availability(env)
    assert not ok and reason.startswith("compute capability 7.5 of Tesla T4 is below 8.0")


def test_broken_install(avail):
    """Installed on a capable GPU but failing to import: the import error is the reason."""
    env = avail.CudaEnvironment(True, 1, (9, 0), "NVIDIA H100", "2.13.0", import_error="ImportError: libcuda.so")
    assert avail.availability(env) == (False, "flashinfer is installed but failed to import: ImportError: libcuda.so")


def test_available(avail):
    """Everything in place: available, saying on what."""
    env = avail.CudaEnvironment(True, 2, (9, 0), "NVIDIA H100", "2.13.0")
    assert avail.availability(env) == (True, "flashinfer on 2 CUDA device(s), NVIDIA H100 (sm90)")


def test_environment_validates_itself(avail):
    """A CUDA environment with devices must say their compute capability."""
    with pytest.raises(ValueError, match="needs the compute capability"):
        avail.CudaEnvironment(True, 1)


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is not None, reason="flashinfer is installed here")
def test_this_machine_reports_flashinfer_missing(sites):
    """In the default environment (no flashinfer) both backends give the install hint as their reason."""
    from kernelbay_flashinfer.backend import FlashInferBackend
    from kernelbay_flashinfer.mla import FlashInferMLABackend

    for cls in (FlashInferBackend, FlashInferMLABackend):
        ok, reason = cls.is_available()
        assert not ok and "flashinfer is not installed" in reason, f"[{cls.name}] {reason}"


def _report(result, name):
    return next(c for c in result.candidates if c.name == name)


def test_selector_on_cpu_lists_why_flashinfer_is_not_used(make_registry, avail, monkeypatch):
    """On the CPU platform FLASHINFER is installed, considered, and refused for platform and availability."""
    monkeypatch.setattr(avail, "probe", lambda: avail.CudaEnvironment(False, torch_version="2.13.0+cpu"))
    make_registry(with_acme=False)
    result = select_attention_backend(BF16_128, platform="cpu")
    assert result.backend_name == "CPU_PAGED"
    report = _report(result, "FLASHINFER")
    assert report.source == "installed" and not report.chosen
    assert report.failures == (
        "platform: cpu is not supported (supported: cuda)",
        f"available: flashinfer is not installed: {avail.INSTALL_HINT}",
    )


def test_selector_on_cuda_skips_unavailable_flashinfer(make_registry, avail, monkeypatch):
    """On cuda FLASHINFER comes first by priority; installed-but-unavailable, it is passed over with the reason."""
    env = avail.CudaEnvironment(True, 1, (7, 5), "Tesla T4", "2.13.0")
    monkeypatch.setattr(avail, "probe", lambda: env)
    make_registry(with_acme=False)
    result = select_attention_backend(BF16_128, platform="cuda")
    assert [c.name for c in result.candidates][:3] == ["FLASHINFER", "FLASHINFER_MLA", "SDPA"]
    assert _report(result, "FLASHINFER").failures == (f"available: {avail.availability(env)[1]}",)
    assert (
        result.backend_name == "SDPA" and _report(result, "SDPA").reason == "first capable candidate in priority order"
    )


def test_selector_picks_flashinfer_when_available(make_registry, avail, monkeypatch):
    """With a capable GPU and flashinfer importable, the cuda priority list picks FLASHINFER, and FLASHINFER_MLA
    for MLA layers (ahead of the VANILLA reference)."""
    monkeypatch.setattr(avail, "probe", lambda: avail.CudaEnvironment(True, 1, (9, 0), "NVIDIA H100", "2.13.0"))
    make_registry(with_acme=False)
    assert select_attention_backend(BF16_128, platform="cuda").backend_name == "FLASHINFER"
    mla = AttentionRequirements(head_size=192, dtype="bfloat16", use_mla=True)
    result = select_attention_backend(mla, platform="cuda")
    assert _report(result, "FLASHINFER_MLA").failures == ()
    assert result.backend_name == "FLASHINFER_MLA"
    assert _report(result, "FLASHINFER_MLA").reason == "first capable candidate in priority order"


def test_requesting_unavailable_flashinfer_is_an_error(make_registry, avail, monkeypatch):
    """Asking for FLASHINFER where it cannot run is an error listing why, never a silent fallback."""
    monkeypatch.setattr(avail, "probe", lambda: avail.CudaEnvironment(True, torch_version="2.13.0+cpu"))
    make_registry(with_acme=False)
    with pytest.raises(BackendNotCapable, match="requested attention backend FLASHINFER") as err:
        select_attention_backend(BF16_128, requested="FLASHINFER", platform="cuda")
    assert "available: no CUDA device" in str(err.value)


def test_runtime_registration_behaves_like_the_distribution(make_registry, avail, monkeypatch):
    """Registered at runtime (its distribution's entry points disabled), FLASHINFER is selectable and refused
    for the same reason."""
    from kernelbay import register_attention_backend
    from kernelbay.registry import slot_info
    from kernelbay_flashinfer.backend import FlashInferBackend

    monkeypatch.setattr(avail, "probe", lambda: avail.CudaEnvironment(False, torch_version="2.13.0+cpu"))
    make_registry(with_acme=False, KERNELBAY_DISABLE_PLUGINS="kernelbay-flashinfer")
    register_attention_backend("FLASHINFER", target=FlashInferBackend)
    winner = slot_info("attention_backend", "FLASHINFER")["winner"]
    assert winner["target"] == "kernelbay_flashinfer.backend:FlashInferBackend"
    result = select_attention_backend(BF16_128, platform="cuda")
    assert _report(result, "FLASHINFER").failures == (f"available: flashinfer is not installed: {avail.INSTALL_HINT}",)
