"""kernelbay's conformance kit for attention and MoE backends: the protocol made executable.

- `check_backend(NAME or class, specs=None)` -> `ConformanceReport` (`SpecResult` per spec: pass / fail /
  not-claimed / skipped); also `kernelbay check-backend NAME` and `pytest --kernelbay-backend NAME`;
- the named batch specs: `BatchSpec`, `SPECS`, `MLA_SPECS`, `ALL_SPECS`, `TOLERANCE`;
- the dense reference: `reference_attention`; the engine-like driver: `run_backend`, `make_data`;
- MoE kernels: `check_moe_backend`, `MOE_SPECS` / `MoESpec`, `reference_moe`, `make_moe_data`;
- the installed plugins as a whole: `kernelbay.testing.doctor.findings()`, which `kernelbay doctor` prints.

Importing this package imports nothing heavy (no torch) until a name is used: pytest loads its plugin
module in every run.
"""

from __future__ import annotations

from ..lazy import lazy_exports

_LAZY = {
    **dict.fromkeys(("BackendUnderTest", "check_backend"), "kernelbay.testing.conformance"),
    **dict.fromkeys(("ConformanceReport", "SpecResult"), "kernelbay.testing.report"),
    **dict.fromkeys(
        ("ALL_SPECS", "BatchSpec", "MLA_SPECS", "SPECS", "TOLERANCE", "tolerance"), "kernelbay.testing.specs"
    ),
    **dict.fromkeys(
        ("StepData", "block_tables", "build_layer", "make_data", "reference_output", "run_backend", "run_step"),
        "kernelbay.testing.runner",
    ),
    "reference_attention": "kernelbay.testing.reference",
    **dict.fromkeys(
        ("MOE_SPECS", "MoESpec", "check_moe_backend", "make_moe_data", "reference_moe"), "kernelbay.testing.moe"
    ),
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = sorted(_LAZY)  # noqa: PLE0605 - every lazily exported name, derived from the table
