"""kernelbay-engine's native CPU ops (ops.cpp, the linears qdot.cpp and fdot.cpp), built by torch on first use.

A decode step of a small model dispatches ~1,000 aten calls, and a composite such as `rms_norm` is ~8 of
them: inside a step (the weights streaming through the caches between layers) every dispatch is cache-cold,
so one native call without them is cheaper by far. The ops compute what aten does bit for bit
(tests/test_native.py), except `rms_norm`'s mean of squares, summed in a fixed order of its own rather than
through at::mean (within float32 rounding of aten's, as close to the float64 norm; the same bits for a row
alone or in any batch): with the residual adds and SiLU, those dispatches cost ~3-4 ms of SmolLM2's ~27 ms
float32 decode step (benchmarks/RESULTS-first-answer.md). So using the ops or not changes a float32 norm by
rounding at most, and the time.

The build is kernelbay-cpu's (`kernelbay_cpu.build.NativeLibrary`, the one build every kernelbay plugin's C++ ops
share): once per machine into torch's extension cache (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions;
~30 s with g++ on 2 cores), afterwards the built library imported as is (~1 ms). The cache entry is named by a hash
of the sources, the flags, torch's and Python's versions and the machine (`extension_name()`,
`kernelbay_engine_native_<hash>`) and built from its own copy of the sources, so two checkouts or versions never
rebuild one entry over each other; builds are serialised by a lock that dies with its owner. Without a C++
compiler, or with KERNELBAY_NATIVE=0, the aten path runs instead: a build failure is warned about once
(`NativeUnavailableWarning`, saying why), never silent; a build says so on stderr when one really runs.
`status()` says which path is in use; `LIBRARY.forced(None)` runs the aten path for a block (tests, benchmarks).
"""

from __future__ import annotations

from pathlib import Path

import torch

from kernelbay_cpu.build import ENV, NativeLibrary, NativeUnavailableWarning, default_build_root

__all__ = [
    "BUILDING",
    "ENV",
    "LIBRARY",
    "QKV_ROPE_DTYPES",
    "SILU_MUL_DTYPES",
    "SOURCES",
    "NativeUnavailableWarning",
    "build_directory",
    "default_build_root",
    "extension_name",
    "ops",
    "status",
    "tracked",
]

SOURCES = [str(Path(__file__).with_name(name)) for name in ("ops.cpp", "qdot.cpp", "fdot.cpp")]
# the dtypes each elementwise op takes (ops.cpp's checks): a caller with another dtype takes its aten path
SILU_MUL_DTYPES = (torch.float32, torch.bfloat16)
QKV_ROPE_DTYPES = (torch.float32, torch.bfloat16)

LIBRARY = NativeLibrary(
    "kernelbay_engine_native",
    SOURCES,
    owner="kernelbay-engine",
    fallback="running the aten path instead (the same results up to float32 rounding, slower small ops)",
    build_note="~30 s",
)
BUILDING = LIBRARY.building
# the library's own methods, not wrappers: ops() is called by every layer of every step, and a failed build's
# warning points at the same frame from here as from the library
ops = LIBRARY.ops
status = LIBRARY.status
extension_name = LIBRARY.extension_name
build_directory = LIBRARY.build_directory


def tracked(*tensors: torch.Tensor) -> bool:
    """Whether autograd or a torch.compile trace needs these tensors' op graph, which a native op does not give:
    the caller runs its aten path then."""
    return (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)) or torch.compiler.is_compiling()
