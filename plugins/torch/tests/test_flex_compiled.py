"""FLEX with its compiled kernel (what users get by default); slow: the first compile per shape bucket
takes tens of seconds on CPU, so one session fixture compiles each path once."""

from __future__ import annotations

import pytest

from tests.attention._harness import SPECS, assert_close, run_backend

pytestmark = pytest.mark.slow
COMPILED_SPECS = ("mixed_prefill_decode", "small_decode")  # the packed path and the decode path


@pytest.fixture(scope="session")
def compiled_outputs():
    return {name: run_backend("FLEX", SPECS[name], options={"compile": True}) for name in COMPILED_SPECS}


@pytest.mark.parametrize("spec_name", COMPILED_SPECS)
def test_compiled_flex_matches_vanilla(spec_name, compiled_outputs):
    """The compiled FLEX kernel equals VANILLA on a mixed step and on a decode step."""
    spec = SPECS[spec_name]
    assert_close("FLEX", spec, compiled_outputs[spec_name], run_backend("VANILLA", spec))


def test_compiled_kernel_is_reused_across_steps(compiled_outputs):
    """A second step of the same shape bucket reuses the compiled kernel: seconds, not a fresh compile."""
    import time

    start = time.perf_counter()
    run_backend("FLEX", SPECS["small_decode"], seed=1, options={"compile": True})
    assert time.perf_counter() - start < 5.0, "[FLEX] the compiled kernel was rebuilt for a same-bucket step"
