"""The named batch specs and the engine-like runner, from the conformance kit (their one home), plus the
suite's backend-against-backend assertion."""

from __future__ import annotations

from kernelbay.testing.runner import StepData, block_tables, build_layer, make_data, run_backend
from kernelbay.testing.specs import MIXED, MLA_SPECS, SPECS, TOLERANCE, BatchSpec, tolerance

__all__ = [
    "MIXED",
    "MLA_SPECS",
    "SPECS",
    "TOLERANCE",
    "BatchSpec",
    "StepData",
    "assert_close",
    "block_tables",
    "build_layer",
    "make_data",
    "run_backend",
]


def assert_close(name: str, spec: BatchSpec, got, want) -> None:
    """`got` equals `want` within the spec's tolerance (relative to max(1, max |want|)); messages tagged [name]."""
    assert got.shape == want.shape, f"[{name}] {spec.name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got.float() - want.float()).abs().max().item()
    assert err <= tolerance(spec) * max(1.0, want.float().abs().max().item()), (
        f"[{name}] {spec.name}: max abs error {err:.3g} > {tolerance(spec):g}"
    )
