"""CPU and CUDA platforms and platform detection."""

from __future__ import annotations

import pytest

from kernelbay.errors import KernelbayError, UnknownNameError
from kernelbay.platforms import current_platform, detect_platforms, get_platform
from kernelbay.platforms.cpu import CpuPlatform
from kernelbay.platforms.cuda import CudaPlatform


def test_cpu_is_current_and_ordered_by_the_benchmark():
    """The CPU platform is always current; its priority is the one benchmarks/RESULTS-attention.md decided."""
    cpu = CpuPlatform()
    assert cpu.is_current()[0] and cpu.device() == "cpu" and cpu.device(0) == "cpu:0"
    assert cpu.backend_priority() == ["CPU_PAGED", "SDPA", "VANILLA", "FLEX"]


def test_cuda_reports_why_it_is_not_current():
    """Without a CUDA device the CUDA platform says so, with torch's version."""
    import torch

    current, reason = CudaPlatform().is_current()
    assert current == torch.cuda.is_available()
    if not current:
        assert reason == f"torch {torch.__version__} sees no CUDA device"


def test_detection_lists_every_platform_and_picks_cpu_here(fresh_registry):
    """Both core platforms are found through entry points; cpu is current when no accelerator is."""
    found = {name: current for name, current, _ in detect_platforms()}
    assert {"cpu", "cuda"} <= set(found) and found["cpu"]
    if not found["cuda"]:
        assert current_platform().name == "cpu"


def test_forced_platform_must_exist_and_be_usable(fresh_registry, monkeypatch):
    """KERNELBAY_PLATFORM picks a platform; unknown or unusable ones are errors."""
    monkeypatch.setenv("KERNELBAY_PLATFORM", "cpu")
    assert current_platform().name == "cpu"
    monkeypatch.setenv("KERNELBAY_PLATFORM", "cpux")
    with pytest.raises(UnknownNameError, match=r"Unknown platform: 'cpux'. Known platforms: cpu, cuda"):
        current_platform()
    if not CudaPlatform().is_current()[0]:
        monkeypatch.setenv("KERNELBAY_PLATFORM", "cuda")
        with pytest.raises(KernelbayError, match="KERNELBAY_PLATFORM=cuda but that platform is not usable here"):
            current_platform()
    assert isinstance(get_platform("cpu"), CpuPlatform)


def test_a_broken_platform_plugin_does_not_break_detection(fresh_registry):
    """A platform whose module fails to import is listed with the cause; cpu is still detected."""
    from kernelbay.registry import register_platform

    register_platform("brokenplat", target="kernelbay_no_such_platform_mod:Platform")
    found = {name: (current, reason) for name, current, reason in detect_platforms()}
    assert found["brokenplat"][0] is False
    assert (
        found["brokenplat"][1].startswith("failed to load: ")
        and "kernelbay_no_such_platform_mod" in found["brokenplat"][1]
    )
    assert current_platform().name == "cpu"
