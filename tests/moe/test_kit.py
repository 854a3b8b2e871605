"""The MoE conformance kit: kernelbay's MoE kernels pass it; kernels that are wrong or dishonest are caught."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelbay import register_moe_backend
from kernelbay.testing import check_backend
from kernelbay.testing.moe import MOE_SPECS, check_moe_backend

from . import _fakes

KERNELBAY = str(Path(sys.executable).with_name("kernelbay"))


def statuses(report) -> dict[str, str]:
    return {r.spec: r.status for r in report.results}


def test_torch_moe_passes_every_spec_through_the_cli():
    """`kernelbay check-backend TORCH_MOE` runs the MoE kit: a PASS line per spec and exit code 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELBAY_")}
    done = subprocess.run(
        [KERNELBAY, "check-backend", "TORCH_MOE"], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == f"TORCH_MOE: conforms: {len(MOE_SPECS)} passed, 0 failed, 0 not claimed, 0 skipped"
    assert [line.split()[1] for line in lines[:-1]] == [s.name for s in MOE_SPECS]


@pytest.mark.parametrize(
    ("fake", "failing"),
    [
        (_fakes.IgnoresBias, {"moe_swigluoai_bias"}),
        (_fakes.AlwaysSilu, {"moe_gelu"}),
        (_fakes.WrongShape, {s.name for s in MOE_SPECS}),
    ],
)
def test_a_wrong_kernel_fails_exactly_the_specs_it_gets_wrong(fake, failing):
    report = check_backend(fake)
    assert {name for name, status in statuses(report).items() if status == "fail"} == failing, report.render()
    assert not report.passed


def test_a_kernel_that_refuses_biases_but_builds_them_is_caught(fresh_registry):
    """Honesty: a refused geometry must be a ValueError at construction, and the selector must refuse it too."""
    register_moe_backend("FAKE_BUILDS_REFUSED_BIAS", target=_fakes.BuildsRefusedBias)
    report = check_moe_backend("FAKE_BUILDS_REFUSED_BIAS", ["moe_swigluoai_bias", "moe_one_token"])
    assert statuses(report) == {"moe_swigluoai_bias": "fail", "moe_one_token": "pass"}, report.render()
    assert "construction must raise ValueError" in report.results[0].detail


def test_an_honest_refusal_is_not_a_failure(fresh_registry):
    register_moe_backend(
        "NO_BIAS", target=type("NoBias", (_fakes.TorchMoEBackend,), {"name": "NO_BIAS", "bias": False})
    )
    report = check_moe_backend("NO_BIAS", ["moe_swigluoai_bias"])
    assert report.passed and statuses(report) == {"moe_swigluoai_bias": "not-claimed"}, report.render()
