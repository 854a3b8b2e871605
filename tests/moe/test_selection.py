"""MoE kernel selection: the attention selector's machinery, reasons and errors, for MoE layers."""

from __future__ import annotations

import pytest

from kernelbay import register_moe_backend
from kernelbay.attention import BackendNotCapable, NoCapableBackend
from kernelbay.errors import UnknownNameError
from kernelbay.moe import MoERequirements, select_moe_backend

from . import _fakes

REQ = MoERequirements(dtype="float32")


def test_cpu_picks_the_first_capable_kernel_in_its_priority_and_says_why():
    result = select_moe_backend(REQ)
    assert result.platform == "cpu"
    chosen = [c for c in result.candidates if c.chosen]
    assert [c.name for c in chosen] == [result.backend_name]
    assert chosen[0].reason == "first capable candidate in priority order"
    assert result.backend_name in ("TORCH_GROUPED_MOE", "TORCH_MOE")


def test_an_unknown_requested_kernel_lists_the_known_ones_and_the_variable():
    with pytest.raises(UnknownNameError) as err:
        select_moe_backend(REQ, requested="TORCH_MEO")
    text = str(err.value)
    assert "Unknown MoE backend: 'TORCH_MEO'" in text and "TORCH_MOE" in text and "KERNELBAY_MOE_BACKEND" in text


def test_the_environment_variable_forces_a_kernel(monkeypatch):
    monkeypatch.setenv("KERNELBAY_MOE_BACKEND", "NOPE")
    with pytest.raises(UnknownNameError, match="'NOPE'"):
        select_moe_backend(REQ)
    monkeypatch.setenv("KERNELBAY_MOE_BACKEND", "TORCH_MOE")
    result = select_moe_backend(REQ)
    assert result.backend_name == "TORCH_MOE" and result.requested == "TORCH_MOE"


def test_an_incapable_requested_kernel_lists_every_failed_capability(fresh_registry):
    register_moe_backend("FAKE_DECLARES_NOTHING", target=_fakes.DeclaresNothing)
    with pytest.raises(BackendNotCapable) as err:
        select_moe_backend(REQ, requested="FAKE_DECLARES_NOTHING")
    assert "requested MoE backend FAKE_DECLARES_NOTHING cannot run MoE layers (silu, float32" in str(err.value)
    assert [v.split(":")[0] for v in err.value.violations] == ["activation", "routing", "dtype", "platform"]


def test_no_capable_kernel_names_each_candidates_failures(fresh_registry):
    """kernelbay-torch disabled, only a kernel declaring nothing is left: the error gives each candidate's reasons."""
    from kernelbay.registry import Registry, reset_registry

    reset_registry(Registry(environ={"KERNELBAY_DISABLE_PLUGINS": "kernelbay-torch"}))
    register_moe_backend("FAKE_DECLARES_NOTHING", target=_fakes.DeclaresNothing)
    with pytest.raises(NoCapableBackend) as err:
        select_moe_backend(REQ)
    assert "no installed MoE backend can run MoE layers (silu, float32, softmax_topk, weights=dense) on cpu" in str(
        err.value
    )
    assert "TORCH_MOE: not installed (no plugin provides it)" in err.value.violations
    assert any(v.startswith("FAKE_DECLARES_NOTHING: activation: silu is not supported") for v in err.value.violations)
