"""Which quantized linear kernels run on this machine, for tests that assert the kernel a layer gets.

Each kernel answers `is_available()` itself: int8_dot needs the native ops on AVX-512 VNNI, the torch kernels
(int8_channel, int4_group, int8_group) avx512_bf16 / amx_bf16, dense always runs. The selector gives a layer the
first capable and available kernel in KERNELS' order, so a test expects `chosen(torch_kernel)`: int8_dot where it
runs (it runs every layer these tests build), else the layer's torch kernel, else dense; and every kernel that is
unavailable here says why in its candidate's failures (`not_available`, `assert_unavailable_say_why`).

A test whose point is one kernel calls `requires_kernel(name)`, is marked `skip_unless(name)` or parametrizes with
`kernel_param(name)`: a skip naming that kernel's own reason where it cannot run.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from kernelbay_engine.quant.kernels import KERNEL_NAMES, KERNELS

AVAILABILITY: dict[str, tuple[bool, str]] = {k.name: k.is_available() for k in KERNELS}
"""kernel name -> (runs here, why): the kernels' own answers."""


def available(name: str) -> bool:
    return AVAILABILITY[name][0]


def unavailable_reason(name: str) -> str:
    """The skip reason of a test that needs `name`, in the kernel's own words."""
    return f"{name} is unavailable here: {AVAILABILITY[name][1]}"


def requires_kernel(*names: str) -> None:
    """Skip the calling test unless every kernel in `names` runs on this machine."""
    __tracebackhide__ = True  # the skip is reported at the test's line
    for name in names:
        if not available(name):
            pytest.skip(unavailable_reason(name))


def skip_unless(name: str) -> pytest.MarkDecorator:
    """A mark skipping a test (or a parametrize value) where kernel `name` is unavailable."""
    return pytest.mark.skipif(not available(name), reason=unavailable_reason(name))


def kernel_param(name: str):
    """Kernel `name` as a parametrize value, skipped where it is unavailable."""
    return pytest.param(name, marks=skip_unless(name), id=name)


def first_available(*names: str) -> str:
    """The first of `names` that runs here, else dense (which always does)."""
    return next((n for n in names if available(n)), "dense")


def chosen(torch_kernel: str) -> str:
    """The kernel selected for a layer int8_dot can run (groups a multiple of 32) whose torch kernel is
    `torch_kernel`: int8_dot, else that kernel, else dense."""
    return first_available("int8_dot", torch_kernel)


DOT = available("int8_dot")
needs_dot = skip_unless("int8_dot")
INT4 = chosen("int4_group")
INT8_GROUP = chosen("int8_group")
INT8_CHANNEL = chosen("int8_channel")


def not_available(name: str) -> tuple[str, ...]:
    """The failure the selector adds to `name`'s capability failures where it cannot run here (else none)."""
    ok, why = AVAILABILITY[name]
    return () if ok else (f"not available: {why}",)


def assert_unavailable_say_why(candidates: Iterable) -> None:
    """Every candidate (a select.Candidate or its to_dict()) whose kernel cannot run here is not chosen, not capable,
    and its failures end with the kernel's own reason."""
    seen = set()
    for c in candidates:
        c = c if isinstance(c, dict) else c.to_dict()
        seen.add(c["name"])
        if not available(c["name"]):
            assert not c["chosen"] and not c["capable"], c
            assert c["reason"] == "not capable", c
            assert tuple(c["failures"][-1:]) == not_available(c["name"]), c
    assert seen == set(KERNEL_NAMES), f"candidates {sorted(seen)}, kernels {KERNEL_NAMES}"
