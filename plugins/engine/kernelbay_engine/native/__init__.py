"""kernelbay-engine's native CPU ops (ops.cpp, the linears qdot.cpp and fdot.cpp), built by torch on first use.

A decode step of a small model dispatches ~1,000 aten calls, and a composite such as `rms_norm` is ~8 of
them: inside a step (the weights streaming through the caches) it costs ~14 us where the same arithmetic
in one native call costs ~4 us (SmolLM2's 61 norms a step: ~0.5 ms of ~8.5). The ops compute what aten
does bit for bit (tests/test_native.py), so using them or not never changes a result, only the time.

Built once per machine and torch version into torch's extension cache (TORCH_EXTENSIONS_DIR, default
~/.cache/torch_extensions; ~30 s with g++ on 2 cores), loaded in ~0.1 s afterwards. Without a C++
compiler, or with KERNELBAY_NATIVE=0, the aten path runs instead: a build failure is warned about once
(`NativeUnavailableWarning`, saying why), never silent; a build says so on stderr while it runs. `status()`
says which path is in use.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from pathlib import Path
from types import ModuleType

import torch

ENV = "KERNELBAY_NATIVE"  # "0": never build or load the native ops
SOURCES = [str(Path(__file__).with_name(name)) for name in ("ops.cpp", "qdot.cpp", "fdot.cpp")]
_NAME = "kernelbay_engine_native"
BUILDING = "kernelbay-engine: building its native CPU ops (once per machine and torch version, ~30 s)..."
_lock = threading.Lock()
_state: dict[str, object] = {}  # "module": the loaded ops or None; "reason": why None


class NativeUnavailableWarning(RuntimeWarning):
    """The native CPU ops could not be built or loaded: the engine runs the (slower) aten path."""


def ops() -> ModuleType | None:
    """The compiled ops, built on the first call of the process (None: disabled or unavailable, see status())."""
    if "module" not in _state:
        with _lock:
            if "module" not in _state:
                _state["module"], _state["reason"] = _load()
    return _state["module"]  # type: ignore[return-value]


def tracked(*tensors: torch.Tensor) -> bool:
    """Whether autograd or a torch.compile trace needs these tensors' op graph, which a native op does not give:
    the caller runs its aten path then."""
    return (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)) or torch.compiler.is_compiling()


def status() -> str:
    """One line: whether the native ops are in use, and if not why."""
    module = ops()
    if module is not None:
        return f"native CPU ops loaded ({module.__file__})"
    return f"native CPU ops not in use: {_state['reason']}"


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(ENV, "1") == "0":
        return None, f"disabled by {ENV}=0"
    try:
        from torch.utils.cpp_extension import load

        # a cached build loads in ~0.1 s; a build takes ~30 s, which the user is told about while it runs
        notice = threading.Timer(2.0, lambda: print(BUILDING, file=sys.stderr, flush=True))
        notice.daemon = True
        notice.start()
        try:
            # -fopenmp: qdot.cpp and fdot.cpp run at::parallel_for on torch's OpenMP threads (without it: one thread)
            flags = ["-O3", "-ffp-contract=off", "-fopenmp"]
            return load(_NAME, SOURCES, extra_cflags=flags, extra_ldflags=["-fopenmp"], verbose=False), ""
        finally:
            notice.cancel()
    except Exception as err:  # noqa: BLE001  (no compiler or ninja, no Python headers, a failed build: one outcome)
        message = str(err).strip()  # a build error's last line says what failed
        reason = f"{type(err).__name__}: {message.splitlines()[-1] if message else repr(err)}"
        warnings.warn(
            f"kernelbay-engine could not build its native CPU ops ({reason}); running the aten path instead "
            f"(same results, slower small ops). Install a C++ compiler (g++) and ninja, or set {ENV}=0 to "
            f"skip the build and this warning.",
            NativeUnavailableWarning,
            stacklevel=3,
        )
        return None, reason
