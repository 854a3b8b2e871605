"""The quantized linear kernel auto-selection picks on this machine, for tests that assert kernel names.

int8_dot (AVX-512 VNNI, kernelbay_engine.native) is preferred wherever it runs, which includes the CI machines;
elsewhere each layer goes to the torch kernel for its width and groups. Tests of a torch kernel request it by name.
"""

from __future__ import annotations

import pytest

from kernelbay_engine.quant.kernels import NativeDotKernel

DOT, DOT_WHY = NativeDotKernel.is_available()
needs_dot = pytest.mark.skipif(not DOT, reason=f"int8_dot cannot run here: {DOT_WHY}")


def chosen(fallback: str) -> str:
    """The kernel selected for a layer int8_dot runs (groups a multiple of 32) whose torch kernel is `fallback`."""
    return "int8_dot" if DOT else fallback


INT4 = chosen("int4_group")
INT8_GROUP = chosen("int8_group")
INT8_CHANNEL = chosen("int8_channel")
