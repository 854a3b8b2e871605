"""kernelbay-engine's native CPU ops (ops.cpp, the linears qdot.cpp and fdot.cpp), built by torch on first use.

A decode step of a small model dispatches ~1,000 aten calls, and a composite such as `rms_norm` is ~8 of
them: inside a step (the weights streaming through the caches) it costs ~14 us where the same arithmetic
in one native call costs ~4 us (SmolLM2's 61 norms a step: ~0.5 ms of ~8.5). The ops compute what aten
does bit for bit (tests/test_native.py), so using them or not never changes a result, only the time.

Built once per machine into torch's extension cache (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions;
~30 s with g++ on 2 cores); afterwards the built library is imported as is (~1 ms). The cache entry is named by a
hash of the sources, the flags, torch's and Python's versions (`extension_name()`) and built from its own copy of the
sources, so two checkouts or versions never rebuild one entry over each other. Builds are serialised by an advisory
lock that dies with its owner; a torch `lock` file left by a build killed midway is removed, not waited on forever.
Without a C++ compiler, or with KERNELBAY_NATIVE=0, the aten path runs instead: a build failure is warned about
once (`NativeUnavailableWarning`, saying why), never silent; a build says so on stderr when one really runs.
`status()` says which path is in use.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import platform
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch


def _advisory_locks() -> ModuleType | None:
    """fcntl (advisory locks, which the kernel drops when their owner dies); None on Windows, where torch's own
    lock file serves alone, with an age bound."""
    try:
        return importlib.import_module("fcntl")
    except ImportError:
        return None


_fcntl = _advisory_locks()

ENV = "KERNELBAY_NATIVE"  # "0": never build or load the native ops
SOURCES = [str(Path(__file__).with_name(name)) for name in ("ops.cpp", "qdot.cpp", "fdot.cpp")]
_NAME = "kernelbay_engine_native"
# -fopenmp: qdot.cpp and fdot.cpp run at::parallel_for on torch's OpenMP threads (without it: one thread)
CFLAGS = ("-O3", "-ffp-contract=off", "-fopenmp")
LDFLAGS = ("-fopenmp",)
BUILDING = "kernelbay-engine: building its native CPU ops (once per machine and torch version, ~30 s)..."
BUILD_WAIT_S = 600.0  # how long to wait for another live process's build before running the aten path
# the dtypes each elementwise op takes (ops.cpp's checks): a caller with another dtype takes its aten path
SILU_MUL_DTYPES = (torch.float32, torch.bfloat16)
QKV_ROPE_DTYPES = (torch.float32, torch.bfloat16)
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


def extension_name(sources: Sequence[str] = SOURCES, cflags: Sequence[str] = CFLAGS) -> str:
    """The cache entry's name: a hash of the sources' bytes, the flags and the versions the binary depends on."""
    digest = hashlib.sha256()
    for part in (torch.__version__, sys.version, platform.machine(), *cflags, "|", *LDFLAGS):
        digest.update(part.encode() + b"\0")
    for source in sources:
        digest.update(Path(source).name.encode() + b"\0" + Path(source).read_bytes())
    return f"{_NAME}_{digest.hexdigest()[:16]}"


def build_directory() -> Path:
    """Where the ops are built and cached: TORCH_EXTENSIONS_DIR (or torch's default root) / extension_name()."""
    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or default_build_root()) / extension_name()


def default_build_root() -> str:
    """torch's `get_default_build_root()`: on Linux $XDG_CACHE_HOME (default ~/.cache) / torch_extensions, worked
    out here because importing torch.utils.cpp_extension (it imports setuptools) costs ~30 ms of every start that
    loads a cached build; elsewhere torch's own function (a test holds the two equal)."""
    if sys.platform != "linux":
        from torch.utils.cpp_extension import get_default_build_root

        return get_default_build_root()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.realpath(os.path.join(cache, "torch_extensions"))


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(ENV, "1") == "0":
        return None, f"disabled by {ENV}=0"
    try:
        return _build_and_load(build_directory()), ""
    except Exception as err:  # noqa: BLE001  (no compiler or ninja, no Python headers, a failed build: one outcome)
        message = str(err).strip()  # a build error's last line says what failed
        reason = f"{type(err).__name__}: {message.splitlines()[-1] if message else repr(err)}"
        warnings.warn(
            f"kernelbay-engine could not build its native CPU ops ({reason}); running the aten path instead "
            f"(same results, slower small ops). Install a C++ compiler (g++) and ninja, or set {ENV}=0 to "
            f"skip the build and this warning.",
            NativeUnavailableWarning,
            stacklevel=4,
        )
        return None, reason


def _build_and_load(folder: Path) -> ModuleType:
    """Load the cached build in `folder`, building it first where it is missing (and saying so)."""
    folder.mkdir(parents=True, exist_ok=True)
    with _build_lock(folder):
        stale = _remove_stale_baton(folder)
        library = folder / f"{folder.name}{_LIB_EXT}"
        if not stale and library.exists():
            return _import_library(library)
        from torch.utils.cpp_extension import load

        sources = _own_sources(folder)
        print(BUILDING, file=sys.stderr, flush=True)
        return load(
            folder.name,
            sources,
            extra_cflags=list(CFLAGS),
            extra_ldflags=list(LDFLAGS),
            build_directory=str(folder),
            verbose=False,
        )


_LIB_EXT = ".pyd" if sys.platform == "win32" else ".so"


def _import_library(library: Path) -> ModuleType:
    """A finished build, imported as torch's `load` imports it, without `load`'s up-to-date check: the entry's name
    is a hash of the sources, flags and versions, and a build killed midway leaves torch's lock, which
    `_remove_stale_baton` turns into a rebuild. That check (a build file written and ninja run) cost ~0.1 s of every
    start."""
    spec = importlib.util.spec_from_file_location(library.name.removesuffix(_LIB_EXT), library)
    if spec is None or spec.loader is None:
        raise ImportError(f"{library} cannot be imported as a Python extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _own_sources(folder: Path) -> list[str]:
    """The sources copied into the cache entry (rewritten only where they differ): the build's commands name
    these paths, so every checkout with the same sources writes the same build file and nothing rebuilds."""
    copies = []
    (folder / "src").mkdir(exist_ok=True)
    for source in map(Path, SOURCES):
        copy = folder / "src" / source.name
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            partial = copy.with_suffix(f".{os.getpid()}.tmp")
            shutil.copyfile(source, partial)
            os.replace(partial, copy)
        copies.append(str(copy))
    return copies


@contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """An advisory lock on `folder/kernelbay.lock` held while building or loading; the kernel drops it when its
    owner dies, so it is never stale. A live owner is waited for up to BUILD_WAIT_S, then this is an error."""
    if _fcntl is None:
        yield
        return
    with open(folder / "kernelbay.lock", "a+") as handle:
        deadline = time.monotonic() + BUILD_WAIT_S
        while True:
            try:
                _fcntl.flock(handle, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"another process has been building the native ops in {folder} for over "
                        f"{BUILD_WAIT_S:.0f} s (its pid: {_owner(handle)})"
                    ) from None
                time.sleep(0.1)
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            _fcntl.flock(handle, _fcntl.LOCK_UN)


def _owner(handle) -> str:
    handle.seek(0)
    return handle.read().strip() or "unknown"


def _remove_stale_baton(folder: Path) -> bool:
    """torch's `lock` file, which its build waits on forever while it exists. Under our lock nobody else is
    building, so one that exists was left by a build killed midway (without advisory locks: one older than
    BUILD_WAIT_S): it goes, with the build it may have left half-written, and the ops are built again."""
    baton = folder / "lock"
    if not baton.exists():
        return False
    if _fcntl is None and time.time() - baton.stat().st_mtime < BUILD_WAIT_S:
        return False
    print(f"kernelbay-engine: removing {baton}, left by a native build that did not finish", file=sys.stderr)
    baton.unlink(missing_ok=True)
    (folder / f"{folder.name}{_LIB_EXT}").unlink(missing_ok=True)
    return True
