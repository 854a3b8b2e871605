"""How a kernelbay plugin builds and loads its C++ ops with torch (torch.utils.cpp_extension), once per machine.

A `NativeLibrary` names its sources; `ops()` gives the compiled module, built on the first call of a process.
Builds go into torch's extension cache (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions), one entry per
library named by a hash of its sources, its flags, torch's and Python's versions and the machine
(`extension_name()`), built from the entry's own copy of the sources, so two checkouts or versions never rebuild one
entry over each other. A finished build is imported as is (~1 ms), without torch's build machinery. Builds are
serialised by an advisory lock that dies with its owner; a torch `lock` file left by a build killed midway is
removed, not waited on forever. Without a C++ compiler the caller's fallback runs: the failure is warned about once
(`NativeUnavailableWarning`, naming the plugin and why), never silent; a build says so on stderr when one really
runs. KERNELBAY_NATIVE=0 turns every kernelbay plugin's native ops off. `status()` says which path is in use.
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
from typing import IO

import torch

__all__ = ["ENV", "NativeLibrary", "NativeUnavailableWarning", "default_build_root"]

ENV = "KERNELBAY_NATIVE"  # "0": no kernelbay plugin builds or loads native ops
# -ffp-contract=off: no multiply-add the source does not write (the engine's ops mirror aten's arithmetic);
# -fopenmp: the ops' at::parallel_for runs on torch's OpenMP threads (without it: one thread)
CFLAGS = ("-O3", "-ffp-contract=off", "-fopenmp")
LDFLAGS = ("-fopenmp",)
BUILD_WAIT_S = 600.0  # how long to wait for another live process's build before giving up on the native ops
_LIB_EXT = ".pyd" if sys.platform == "win32" else ".so"


def _advisory_locks() -> ModuleType | None:
    """fcntl (advisory locks, which the kernel drops when their owner dies); None on Windows, where torch's own
    lock file serves alone, with an age bound."""
    try:
        return importlib.import_module("fcntl")
    except ImportError:
        return None


_fcntl = _advisory_locks()


class NativeUnavailableWarning(RuntimeWarning):
    """A plugin's native ops could not be built or loaded: the plugin's (slower or other) fallback runs."""


def default_build_root() -> str:
    """torch's `get_default_build_root()`: on Linux $XDG_CACHE_HOME (default ~/.cache) / torch_extensions, worked
    out here because importing torch.utils.cpp_extension (it imports setuptools) costs ~30 ms of every start that
    loads a cached build; elsewhere torch's own function (a test holds the two equal)."""
    if sys.platform != "linux":
        from torch.utils.cpp_extension import get_default_build_root

        return get_default_build_root()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.realpath(os.path.join(cache, "torch_extensions"))


class NativeLibrary:
    """One plugin's C++ sources, built into one cache entry and loaded once per process (thread-safe).

    name: the cache entry's prefix (`<name>_<hash>`); owner: the distribution messages name ("kernelbay-engine");
    what: the noun messages use; fallback: what happens instead when the ops are unavailable, as the warning's
    clause ("running the aten path instead (same results, slower small ops)"); build_note: how long a build takes,
    said while one runs ("~30 s").
    """

    def __init__(
        self,
        name: str,
        sources: Sequence[str | Path],
        *,
        owner: str,
        fallback: str,
        what: str = "native CPU ops",
        cflags: Sequence[str] = CFLAGS,
        ldflags: Sequence[str] = LDFLAGS,
        build_note: str | None = None,
    ):
        self.name, self.owner, self.what, self.fallback = name, owner, what, fallback
        self.sources = [str(source) for source in sources]
        self.cflags, self.ldflags = tuple(cflags), tuple(ldflags)
        note = f", {build_note}" if build_note else ""
        self.building = f"{owner}: building its {what} (once per machine and torch version{note})..."
        self._lock = threading.Lock()
        self._loaded = False  # ops() has an answer: _module (None: unavailable, _reason says why)
        self._module: ModuleType | None = None
        self._reason = ""

    def ops(self) -> ModuleType | None:
        """The compiled ops, built on the first call of the process (None: disabled or unavailable, see status()).
        A failed build warns at the code that called the function asking for the ops."""
        if not self._loaded:
            with self._lock:
                if not self._loaded:
                    self._module, self._reason = self._load()
                    self._loaded = True
        return self._module

    def status(self) -> str:
        """One line: whether the ops are in use, and if not why."""
        module = self.ops()
        if module is not None:
            return f"{self.what} loaded ({module.__file__})"
        return f"{self.what} not in use: {self._reason}"

    def reason(self) -> str:
        """Why ops() is None ("" when the ops are loaded)."""
        self.ops()
        return self._reason

    @contextmanager
    def forced(self, module: ModuleType | None, reason: str = "turned off by the caller") -> Iterator[None]:
        """Within the block ops() gives `module` (None: the fallback runs and status() says `reason`), whatever
        was built: tests and benchmarks run both paths in one process. Not for concurrent use with other threads."""
        saved = self._loaded, self._module, self._reason
        self._loaded, self._module, self._reason = True, module, "" if module is not None else reason
        try:
            yield
        finally:
            self._loaded, self._module, self._reason = saved

    def extension_name(self, sources: Sequence[str | Path] | None = None, cflags: Sequence[str] | None = None) -> str:
        """The cache entry's name: a hash of the sources' bytes, the flags and the versions the binary depends on."""
        digest = hashlib.sha256()
        flags = self.cflags if cflags is None else cflags
        for part in (torch.__version__, sys.version, platform.machine(), *flags, "|", *self.ldflags):
            digest.update(part.encode() + b"\0")
        for source in map(Path, self.sources if sources is None else sources):
            digest.update(source.name.encode() + b"\0" + source.read_bytes())
        return f"{self.name}_{digest.hexdigest()[:16]}"

    def build_directory(self) -> Path:
        """Where the ops are built and cached: TORCH_EXTENSIONS_DIR (or torch's default root) / extension_name()."""
        return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or default_build_root()) / self.extension_name()

    def _load(self) -> tuple[ModuleType | None, str]:
        if os.environ.get(ENV, "1") == "0":
            return None, f"disabled by {ENV}=0"
        try:
            return self._build_and_load(self.build_directory()), ""
        except Exception as err:  # noqa: BLE001  (no compiler or ninja, no Python headers, a failed build: one outcome)
            message = str(err).strip()  # a build error's last line says what failed
            reason = f"{type(err).__name__}: {message.splitlines()[-1] if message else repr(err)}"
            warnings.warn(
                f"{self.owner} could not build its {self.what} ({reason}); {self.fallback}. Install a C++ compiler "
                f"(g++) and ninja, or set {ENV}=0 to skip the build and this warning.",
                NativeUnavailableWarning,
                stacklevel=4,  # 1 here, 2 ops(), 3 the function asking for the ops, 4 its caller
            )
            return None, reason

    def _build_and_load(self, folder: Path) -> ModuleType:
        """Load the cached build in `folder`, building it first where it is missing (and saying so)."""
        folder.mkdir(parents=True, exist_ok=True)
        with _build_lock(folder, self.what):
            stale = _remove_stale_baton(folder, self.owner)
            library = folder / f"{folder.name}{_LIB_EXT}"
            if not stale and library.exists():
                return _import_library(library)
            from torch.utils.cpp_extension import load

            sources = _own_sources(folder, self.sources)
            print(self.building, file=sys.stderr, flush=True)
            return load(
                folder.name,
                sources,
                extra_cflags=list(self.cflags),
                extra_ldflags=list(self.ldflags),
                build_directory=str(folder),
                verbose=False,
            )


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


def _own_sources(folder: Path, sources: Sequence[str]) -> list[str]:
    """The sources copied into the cache entry (rewritten only where they differ): the build's commands name
    these paths, so every checkout with the same sources writes the same build file and nothing rebuilds."""
    copies = []
    (folder / "src").mkdir(exist_ok=True)
    for source in map(Path, sources):
        copy = folder / "src" / source.name
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            partial = copy.with_suffix(f".{os.getpid()}.tmp")
            shutil.copyfile(source, partial)
            os.replace(partial, copy)
        copies.append(str(copy))
    return copies


@contextmanager
def _build_lock(folder: Path, what: str) -> Iterator[None]:
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
                        f"another process has been building the {what} in {folder} for over "
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


def _owner(handle: IO[str]) -> str:
    handle.seek(0)
    return handle.read().strip() or "unknown"


def _remove_stale_baton(folder: Path, owner: str) -> bool:
    """torch's `lock` file, which its build waits on forever while it exists. Under our lock nobody else is
    building, so one that exists was left by a build killed midway (without advisory locks: one older than
    BUILD_WAIT_S): it goes, with the build it may have left half-written, and the ops are built again."""
    baton = folder / "lock"
    if not baton.exists():
        return False
    if _fcntl is None and time.time() - baton.stat().st_mtime < BUILD_WAIT_S:
        return False
    print(f"{owner}: removing {baton}, left by a native build that did not finish", file=sys.stderr)
    baton.unlink(missing_ok=True)
    (folder / f"{folder.name}{_LIB_EXT}").unlink(missing_ok=True)
    return True
